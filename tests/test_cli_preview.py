"""The `hf jobs run ...` commands the form previews are real: the `hf` CLI parses them (dry run, nothing sent)."""

import os
import shutil
import subprocess

import pytest

from backend import recipe
from backend.spec import RunSpec
from tests.test_command_preview import bash_argv

pytestmark = pytest.mark.skipif(shutil.which("hf") is None, reason="the hf CLI is not installed")
HUB = dict(executor="hf_jobs", model="Qwen/Qwen2.5-0.5B-Instruct", dataset="trl-lib/DeepMath-103K",
           bucket="alice/grpo-runs", use_vllm=True, flavor="a10g-large")


def dry_run(preview: str) -> str:
    argv = bash_argv(preview)
    assert argv[:3] == ["hf", "jobs", "run"]
    env = {**os.environ, "HF_TOKEN": "hf_" + "f" * 34, "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
    done = subprocess.run([*argv[:3], "--dry-run", *argv[3:]], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("mode", ["colocated", "distributed"])
def test_every_previewed_job_parses_with_the_hf_cli(mode):
    spec = RunSpec(**HUB, mode=mode, replicas=2, vllm_flavor="l40sx1")
    for job in recipe.preview_jobs(spec):
        out = dry_run(job.cli_preview())
        assert "(dry run) Job not submitted." in out
        assert f"flavor     {job.flavor}" in out and f"timeout    {job.timeout_s}s" in out
        assert f"hf://buckets/alice/grpo-runs:/bucket{':ro' if job.role.startswith('vllm') else ''}" in out
        assert "HF_TOKEN=***" in out and f"grpo-panel-run={spec.run_id}" in out
