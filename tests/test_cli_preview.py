"""The `hf jobs run ...` commands the form previews are real: the `hf` CLI parses them (dry run, nothing sent)."""

import os
import re
import shutil
import subprocess

import pytest

from backend.plan.spec import RunSpec
from backend.runs.launch import preview_jobs
from tests.test_command_preview import bash_argv

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("hf") is None, reason="the hf CLI is not installed")]
HUB = dict(executor="hf_jobs", model="Qwen/Qwen2.5-0.5B-Instruct", dataset="trl-lib/DeepMath-103K",
           bucket="alice/grpo-runs", use_vllm=True, flavor="a10g-large")


RESOURCE_GROUP = "66980ecfc1e12a49c8f0e42d"


def dry_run(preview: str) -> str:
    argv = bash_argv(preview)
    assert argv[:3] == ["hf", "jobs", "run"]
    env = {**os.environ, "HF_TOKEN": "hf_" + "f" * 34, "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
    done = subprocess.run([*argv[:3], "--dry-run", *argv[3:]], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("mode", ["colocated", "distributed"])
def test_every_previewed_job_parses_with_the_hf_cli(mode):
    spec = RunSpec(**HUB, mode=mode, replicas=2, vllm_flavor="l40sx1", attempts=3,
                   resource_group_id=RESOURCE_GROUP)
    for job in preview_jobs(spec):
        out = dry_run(job.cli_preview())
        assert "(dry run) Job not submitted." in out
        assert re.search(rf"flavor +{job.flavor}\n", out) and re.search(rf"timeout +{job.timeout_s}s\n", out)
        assert re.search(r"attempts +3\n", out) and re.search(rf"resource_group_id +{RESOURCE_GROUP}\n", out), out
        if mode == "distributed":    # the private network: the run's group, each job at its alias
            assert re.search(rf"network_group +grpo-{spec.run_id}\n", out), out
            assert re.search(rf"network_aliases +{job.network_aliases[0]}\n", out), out
        assert f"hf://buckets/alice/grpo-runs:/bucket{':ro' if job.role.startswith('vllm') else ''}" in out
        assert "HF_TOKEN=***" in out and f"grpo-panel-run={spec.run_id}" in out
