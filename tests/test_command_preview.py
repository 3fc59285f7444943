"""The previewed commands are the commands that run: wrapped for reading, bash parses them into exactly the
arguments of the job (checked with bash itself, not with our own parser)."""

import subprocess
import sys

import pytest

from backend.plan import recipe
from backend.plan.jobspec import wrapped
from backend.plan.spec import RunSpec
from backend.runs.launch import preview_jobs

pytestmark = pytest.mark.unit


def bash_argv(line: str) -> list[str]:
    """The arguments bash reads from `line` (env assignments at its start included, as words)."""
    done = subprocess.run(["bash", "-c", 'printf "%s\\0" ' + line], capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode().split("\0")[:-1]


def _steps(script: str, separator: str) -> list[list[str]]:
    return [bash_argv(step.strip()) for step in script.split(separator)]


@pytest.mark.parametrize("spec", [
    RunSpec(mode="distributed", replicas=2),
    RunSpec(mode="colocated"),
    RunSpec(mode="distributed", replicas=3, executor="hf_jobs", model="Qwen/Qwen2.5-0.5B-Instruct",
            bucket="alice/runs", system_prompt="it's 'quoted' && odd"),
], ids=["local-distributed", "local-colocated", "hub-distributed"])
def test_a_wrapped_preview_parses_back_into_the_jobs_own_arguments(spec):
    for job in preview_jobs(spec):
        shown = job.cli_preview() if spec.executor == "hf_jobs" else job.local_preview()
        assert max(len(line) for line in shown.splitlines()) <= 120, shown
        argv = bash_argv(shown)
        expected = (job.cli_preview_args() if spec.executor == "hf_jobs"
                    else [*(f"{k}={v}" for k, v in sorted(job.env.items())), *job.command])
        assert argv[:-1] == expected[:-1]
        # The script is laid out one step per line; each step is the same words as in the job's own script.
        assert _steps(argv[-1], "&&\n") == _steps(expected[-1], " && ")


def test_short_commands_stay_on_one_line_and_options_keep_their_values():
    assert wrapped(["echo", "hi there"]) == "echo 'hi there'"
    long = ["prog", *[f"--option-{i} value-{i}" .split() for i in range(12)]]
    tokens = [long[0], *[t for pair in long[1:] for t in pair]]
    lines = wrapped(tokens, width=60).splitlines()
    assert len(lines) > 1 and all(line.endswith(" \\") for line in lines[:-1])
    assert all(line.strip().rstrip(" \\").split(" ")[0].startswith(("prog", "--option")) for line in lines)
    assert bash_argv(wrapped(tokens, width=60)) == tokens


def test_local_previews_name_this_interpreter_and_a_free_port_for_each_replica():
    *replicas, trainer = preview_jobs(RunSpec(mode="distributed", replicas=2))
    for i, job in enumerate(replicas):
        assert f"--port FREE_PORT_{i}" in job.command[2] and sys.executable in job.command[2]
    assert trainer.env["VLLM_REPLICA_URLS"] == "http://127.0.0.1:FREE_PORT_0,http://127.0.0.1:FREE_PORT_1"
    assert f"--port {recipe.REPLICA_PORT}" not in replicas[0].command[2]
