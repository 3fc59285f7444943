"""scripts/cpu_by_process.py: a command's CPU time by kind of process, children in sessions of their own included."""

import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "cpu_by_process.py")
BURN = "import time\nend = time.process_time() + 1.5\nwhile time.process_time() < end: pass\n"
# The command: a parent that starts a grandchild in a session of its own (as a job's process or a vLLM server is),
# waits for it, and exits 3. The grandchild runs Python under a name of this test's own, so its kind (an unknown
# program is named by its path's end) is one no other process on the machine shares, also beside other tests.
PARENT = ("import subprocess, sys\n"
          f"subprocess.run([sys.argv[1], '-c', {BURN!r}], start_new_session=True)\n"
          "sys.exit(3)\n")


def _row(table: str, kind_end: str) -> tuple[float, int]:
    """The CPU seconds and the processes started of the kind whose name ends with `kind_end`."""
    match = re.search(rf"^\s*(\d+)\s+\d+%\s+(\d+)\s+\S*{re.escape(kind_end)}$", table, re.MULTILINE)
    assert match, table
    return float(match.group(1)), int(match.group(2))


def test_a_grandchild_in_a_session_of_its_own_is_counted_by_its_kind_and_the_commands_status_is_kept(tmp_path):
    out = tmp_path / "table.txt"
    burner = tmp_path / f"burner-{os.getpid()}"
    burner.symlink_to(sys.executable)
    done = subprocess.run([sys.executable, SCRIPT, "-o", str(out), "--", sys.executable, "-c", PARENT, str(burner)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    table = out.read_text()
    assert table.strip() == done.stdout.strip()
    cpu, started = _row(table, burner.name)
    assert started == 1 and cpu >= 1, table
    assert re.match(r"wall \d+ s; cores busy \d+%; CPU seen \d+ s", table), table


def test_no_command_is_refused_with_the_usage():
    done = subprocess.run([sys.executable, SCRIPT, "--"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "give the command to run after --" in done.stderr
