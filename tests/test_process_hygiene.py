"""The session-end check in conftest.py finds what a test left running, kills it, and leaves others alone."""

import os
import subprocess

import psutil
from conftest import kill_processes, session_processes


def _orphan_sleep(cwd) -> int:
    """A `sleep` whose parent has exited (as a local job outliving its wrapper): not a descendant of pytest."""
    out = subprocess.check_output(["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"], cwd=cwd,
                                  start_new_session=True, text=True)
    return int(out)


def test_the_checker_finds_and_kills_a_leaked_child_and_an_orphan_under_the_sessions_tmp(tmp_path_factory, tmp_path):
    basetemp = str(tmp_path_factory.getbasetemp())
    child = subprocess.Popen(["sleep", "300"], start_new_session=True)
    orphan = _orphan_sleep(tmp_path)
    elsewhere = _orphan_sleep("/")       # neither ours by descent nor under our tmp: another session's, say
    try:
        assert not any(p.pid == elsewhere for p in psutil.Process().children(recursive=True))
        found = {p.pid: p for p in session_processes(os.getpid(), basetemp)}
        assert child.pid in found and orphan in found, found
        assert elsewhere not in found, "a process outside this session must never be touched"

        lines = kill_processes([found[child.pid], found[orphan]], grace_s=2)
        assert any(line.startswith(f"{orphan}: sleep 300") for line in lines), lines
        assert child.wait(timeout=5) is not None
        assert not psutil.pid_exists(orphan) or psutil.Process(orphan).status() == psutil.STATUS_ZOMBIE
        assert {child.pid, orphan}.isdisjoint(p.pid for p in session_processes(os.getpid(), basetemp))
        assert psutil.pid_exists(elsewhere)
    finally:
        for pid in (child.pid, orphan, elsewhere):
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass
        child.wait(timeout=5)
