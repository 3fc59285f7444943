"""The session-end check in conftest.py finds what a test left running, kills it, and leaves others alone."""

import os
import subprocess
import sys
import uuid

import psutil
import pytest
from conftest import ROOT, kill_processes, session_processes

pytestmark = pytest.mark.integration


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


def test_a_process_left_by_a_test_on_an_xdist_worker_fails_the_run_and_is_named(tmp_path):
    """scripts/test.sh runs the suite on xdist workers: a worker's finding must reach the controller's exit status."""
    mark = f"leak{uuid.uuid4().hex[:8]}"
    (tmp_path / "test_leaks.py").write_text(
        "import subprocess, sys\n\nimport pytest\n\npytestmark = pytest.mark.integration\n\n\ndef test_leaves_one():\n"
        f"    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)  # {mark}'], "
        "start_new_session=True)\n\n\n"
        "def test_leaves_none():\n    pass\n")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "1", "-p", "tests.conftest", "-c", os.devnull,
                          "--rootdir", str(tmp_path), "-p", "no:cacheprovider", str(tmp_path / "test_leaks.py")],
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True,
                         timeout=120)
    try:
        assert "2 passed" in run.stdout and run.returncode == 1, run.stdout + run.stderr
        assert "1 process(es) this test session started were still running at its end; killed:" in run.stdout
        assert "[gw0] " in run.stdout.split("killed:")[1] and f"time.sleep(300)  # {mark}" in run.stdout, run.stdout
        assert not [p for p in psutil.process_iter(["cmdline"]) if mark in " ".join(p.info["cmdline"] or [])]
    finally:
        for proc in psutil.process_iter(["cmdline"]):
            if mark in " ".join(proc.info["cmdline"] or []):
                proc.kill()
