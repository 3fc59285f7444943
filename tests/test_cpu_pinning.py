"""Each vLLM server of a replica job on cores of its own, the proxy on one of its own
(runtime/serving/cpu_pinning.py): the
split, the switch that turns it off, a real child started on its cores, and the local engine keeping a core for the
trainer's proxy."""

import os
import subprocess
import sys

import pytest

from backend.plan import recipe
from backend.plan.engines import engine
from backend.plan.engines import local as local_engine
from backend.plan.spec import RunSpec
from backend.runtime.serving.cpu_pinning import PIN_ENV, PROXY_CORE_ENV, core_split, parse_cores, server_cores

pytestmark = pytest.mark.unit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHOW_CORES = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]


def test_sixteen_cores_give_four_servers_disjoint_shares_and_the_proxy_one_core():
    shares, proxy, why = core_split(range(16), 4, proxy=True)
    assert why == "" and proxy == 15
    assert shares == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14]]
    assert sorted(c for s in shares for c in s) == list(range(15)), "every core but the proxy's, each once"
    assert core_split([3, 1, 2, 0], 2) == ([[0, 1], [2, 3]], None, "")


def test_too_few_cores_leave_the_servers_unpinned_and_say_why():
    shares, proxy, why = core_split(range(8), 4, proxy=True)
    assert shares is None and proxy is None
    assert why == "8 cores, fewer than 2 for each of 4 server(s) and one for the proxy"
    assert server_cores(4, None, env={}, own={0, 1}) == (None, "2 cores, fewer than 2 for each of 4 server(s)")
    assert server_cores(1, None, env={}, own=set(range(16)))[0] is None, "one server has nothing to split"


def test_the_switch_turns_pinning_off_and_given_cores_are_used_only_when_sound():
    assert server_cores(2, None, env={PIN_ENV: "0"}, own=set(range(16))) == (None, f"{PIN_ENV}=0")
    assert server_cores(2, None, env={}, own=set(range(4))) == ([[0, 1], [2, 3]], "")
    assert server_cores(2, ["0,1", "2-3"], env={}) == ([[0, 1], [2, 3]], "")
    shares, why = server_cores(2, ["0,1", "1,2"], env={})
    assert shares is None and "disjoint" in why
    assert server_cores(2, ["0", "1"], env={})[0] is None, "a core each is too few for a server's two processes"
    assert parse_cores("0,2-4, 7") == [0, 2, 3, 4, 7]


def test_a_server_starts_on_its_cores_and_the_wrapper_keeps_its_own():
    mine = sorted(os.sched_getaffinity(0))
    # In a wrapper process of its own, as serve_replica runs: the server's output and the wrapper's after it.
    out = subprocess.run([sys.executable, "-c", (
        "import os, sys; sys.path.insert(0, 'backend'); from runtime.serving.serve_replica import start_server;"
        f"c = start_server({SHOW_CORES!r}, dict(os.environ), [{mine[0]}]); c.wait(60);"
        "print('wrapper', sorted(os.sched_getaffinity(0)))")], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [str([mine[0]]), f"wrapper {mine}"]


def test_a_proxy_told_its_core_pins_itself():
    core = max(os.sched_getaffinity(0))
    code = ("import os, sys; sys.path.insert(0, 'backend'); from runtime.serving.cpu_pinning import pin_self;"
            f"print(pin_self({{'{PROXY_CORE_ENV}': '{core}'}}), sorted(os.sched_getaffinity(0)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.stdout.strip() == f"pinned to core {core} [{core}]", out.stderr
    off = code.replace(f"'{PROXY_CORE_ENV}': '{core}'", f"'{PROXY_CORE_ENV}': '{core}', '{PIN_ENV}': '0'")
    out = subprocess.run([sys.executable, "-c", off], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.stdout.startswith("None ["), out.stderr


def test_a_local_run_keeps_a_core_for_the_trainers_proxy_where_there_are_enough(monkeypatch):
    spec = RunSpec(mode="distributed", replicas=1, servers_per_gpu=4)
    monkeypatch.setattr(local_engine.os, "sched_getaffinity", lambda pid: set(range(16)))
    place = engine("local").placement(spec, preview=True)
    assert place.proxy_core == "15" and place.cpu_binds == [["0,1,2", "3,4,5", "6,7,8", "9,10,11"]]
    [replica, trainer] = recipe.RunJobs(spec, place).preview(engine("local").replica_url)
    assert trainer.env[PROXY_CORE_ENV] == "15"
    assert "--cpu-binds 0,1,2 3,4,5 6,7,8 9,10,11" in replica.command[2]
    monkeypatch.setattr(local_engine.os, "sched_getaffinity", lambda pid: {0, 1})
    place = engine("local").placement(spec, preview=True)
    assert place.proxy_core is None and place.cpu_binds == [["0", "1", "0", "1"]]
    assert PROXY_CORE_ENV not in recipe.RunJobs(spec, place).preview(engine("local").replica_url)[1].env
