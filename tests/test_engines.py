"""Executors answer for themselves: each is an engine module (what it answers before it runs anything) and an
executor module of the same name, registered by name, and nothing outside those two packages compares an executor's
name."""

import importlib
import os
import re
from dataclasses import replace

import pytest

from backend.plan import engines as executors
from backend.plan.spec import EXECUTORS, RunSpec
from backend.runs.launch import launch_run, preview_jobs
from backend.storage.store import FolderStore
from tests.helpers import free_port

pytestmark = pytest.mark.unit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME_COMPARISON = re.compile(r"""(==|!=|\bin)\s*["'](%s)["']|["'](%s)["']\s*(==|!=)""" % (
    ("|".join(executors.EXECUTORS),) * 2))


def test_every_registered_executor_is_an_engine_module_and_an_executor_module_of_its_name():
    assert EXECUTORS == executors.EXECUTORS, "the spec's choices are the registry's"
    for name in executors.EXECUTORS:
        module = importlib.import_module(executors._MODULES[name])
        assert module.__name__ == f"backend.plan.engines.{name}"
        runner = importlib.import_module(f"backend.executors.{name}")
        classes = [c for c in vars(runner).values() if isinstance(c, type) and getattr(c, "name", None) == name
                   and hasattr(c, "submit")]
        assert executors.engine(name) is module.ENGINE and module.ENGINE.name == name and classes, name
    with pytest.raises(KeyError, match="choose one of local, hf_jobs, ray"):
        executors.engine("slurm")


def test_an_unknown_executor_is_the_executor_fields_error_only():
    errors = RunSpec(executor="slurm", budget_usd=5.0).validate()
    assert [e.field for e in errors] == ["executor"]


def _app_files(root: str) -> list[str]:
    paths = [os.path.join(root, "app.py")]
    for folder in ("backend", "panel"):
        paths += [os.path.join(d, f) for d, _, files in os.walk(os.path.join(root, folder)) for f in files
                  if f.endswith(".py")]
    inside = (os.path.join("backend", "executors"), os.path.join("backend", "plan", "engines"))
    return [p for p in paths if not os.path.relpath(p, root).startswith(inside)]


def test_no_code_outside_the_executors_compares_an_executors_name():
    found = []
    for path in _app_files(ROOT):
        with open(path, encoding="utf-8") as f:
            found += [f"{os.path.relpath(path, ROOT)}:{n}" for n, line in enumerate(f, 1)
                      if NAME_COMPARISON.search(line)]
    assert found == []


class Submissions:
    """A local executor that records what it is asked to start."""

    name = "local"

    def __init__(self):
        self.jobs = []

    def submit(self, job, secrets=None):
        self.jobs.append(job)
        return f"job-{len(self.jobs)}"

    def exposed_url(self, job_id, port):
        return f"http://127.0.0.1:{port}"


def test_a_launch_submits_the_jobs_its_preview_showed_with_the_ports_it_picked(tmp_path):
    spec = RunSpec(mode="distributed", replicas=2).check()
    shown = preview_jobs(spec)
    executor = Submissions()
    launch_run(spec, executor, FolderStore(str(tmp_path)))
    ports = [job.expose[0] for job in executor.jobs[:2]]
    assert all(isinstance(port, int) for port in ports)
    picked = [replace(job, command=[_ports(arg, ports) for arg in job.command],
                      env={k: _ports(v, ports) for k, v in job.env.items()}, expose=tuple(ports[i:i + 1]),
                      ports=tuple(ports[i:i + 1]))
              if job.role.startswith("vllm-") else
              replace(job, env={k: _ports(v, ports) for k, v in job.env.items()})
              for i, job in enumerate(shown)]
    assert picked == executor.jobs


def _ports(text: str, ports: list[int]) -> str:
    for i, port in enumerate(ports):
        text = text.replace(f"FREE_PORT_{i}", str(port))
    return text


def test_ray_is_offered_only_where_ray_is_installed_and_a_cluster_answers(tmp_path, monkeypatch):
    import importlib.util

    from backend.plan.engines import ray
    from backend.runs.access import Deployment
    from backend.runs.operations import Operations

    nobody = f"http://127.0.0.1:{free_port()}"      # a port nothing listens on
    monkeypatch.setenv("RAY_ADDRESS", nobody)
    monkeypatch.setattr(ray, "_probe", {})
    operations = Operations(Deployment(home=str(tmp_path)), None, None, None, None)
    assert f"no Ray cluster answers at {nobody}" in ray.ENGINE.runtime_problem()
    assert "ray" not in operations.offered_executors() and "local" in operations.offered_executors()

    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else found(name, *a))
    monkeypatch.setattr(ray, "_probe", {})
    assert "Ray is not installed here" in ray.ENGINE.runtime_problem()
    assert "ray" not in operations.offered_executors()


def test_a_ray_job_is_previewed_as_the_ray_job_submit_it_is_and_asks_the_gpus_of_its_flavor(monkeypatch):
    import json
    import shlex
    import subprocess
    import sys

    from backend.plan.engines.ray import submit_args

    monkeypatch.setenv("RAY_ADDRESS", "http://10.0.0.5:8265")
    spec = RunSpec(executor="ray", mode="distributed", mount_path="/shared/grpo", vllm_flavor="l4x1").check()
    where = executors.engine("ray")
    jobs = preview_jobs(spec)
    assert [j.flavor for j in jobs] == ["ray-1gpu", "ray-1gpu", "ray-cpu"]
    assert "http://<vllm-0 node>:FREE_PORT_0" in jobs[2].env["VLLM_REPLICA_URLS"]
    for job in jobs:
        shown = where.preview_command(job, lambda bucket: "/unused")
        assert shown.startswith("ray job submit --address http://10.0.0.5:8265")
        # Pasted into bash, the preview passes Ray's CLI exactly what the executor submits.
        echo = f"{shlex.quote(sys.executable)} -c 'import json, sys; print(json.dumps(sys.argv[1:]))'"
        argv = json.loads(subprocess.run(["bash", "-c", shown.replace("ray", echo, 1)], capture_output=True,
                                         text=True, check=True).stdout)
        submitted = submit_args(job, "<job id>", None)
        assert _words(argv[argv.index("--") + 1:]) == _words(shlex.split(submitted["entrypoint"]))
        assert json.loads(argv[argv.index("--metadata-json") + 1]) == submitted["metadata"]
        assert argv[argv.index("--entrypoint-num-gpus") + 1] == str(1 if job.role.startswith("vllm") else 0)
        assert f"/shared/grpo/runs/{spec.run_id}/ray-jobs/<job id>" == submitted["metadata"]["grpo-panel-job-dir"]


def _words(tokens: list[str]) -> list:
    """A command's words as bash reads them, a `bash -c` script's (a preview's laid-out one too) as nested lists."""
    import re
    import shlex

    return [_words(shlex.split(re.sub(r"\\\n\s*", " ", t))) if i >= 2 and tokens[i - 2:i] == ["bash", "-c"] else t
            for i, t in enumerate(tokens)]


def test_the_architecture_page_names_every_member_of_an_engine():
    from backend.plan.engines.base import Engine

    members = {*Engine.__annotations__, *(n for n, v in vars(Engine).items() if callable(v) and not n.startswith("_"))}
    with open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8") as f:
        text = f.read()
    paragraph = text[text.index("**An executor.**"):].split("\n\n")[0]
    named = set(re.findall(r"`(\w+)(?:\(\))?`", paragraph))
    assert members - named == set() and len(members) >= 25


def test_a_ray_runs_header_states_the_clusters_cost_rule_not_that_local_runs_cost_nothing(monkeypatch):
    from backend.plan.cost import RunCost
    from backend.plan.engines.ray import ENGINE as RAY
    from backend.plan.engines.ray import GPU_PRICE_ENV
    from panel.spend_view import cost_markdown

    monkeypatch.delenv(GPU_PRICE_ENV, raising=False)
    free = RunCost(jobs=(), billed=False, elapsed_s=60.0, spent_usd=None, burn_usd_per_h=0.0, step=3, max_steps=10,
                   steps_per_s=None, eta_s=None, projected_usd=None)
    header = cost_markdown(free, 0.0, [], RAY.cost_rule)
    assert "local runs cost nothing" not in header
    assert f"the cluster's time is not priced (set {GPU_PRICE_ENV}" in header
    monkeypatch.setenv(GPU_PRICE_ENV, "2.5")
    billed = replace(free, billed=True, spent_usd=1.25)
    assert f"each GPU-hour on the cluster at $2.5 ({GPU_PRICE_ENV})" in cost_markdown(billed, 0.0, [], RAY.cost_rule)
    assert executors.engine("local").cost_rule == "local runs cost nothing"


def test_a_ray_mount_path_that_does_not_exist_is_refused_and_not_created(tmp_path):
    from backend.plan.engines.ray import folder_problem

    absent = tmp_path / "bucket"                  # as the form's default /bucket on a machine without it
    assert "does not exist on this machine" in folder_problem(str(absent))
    assert not absent.exists(), "nothing created outside the panel's own folders"
    absent.mkdir()
    assert folder_problem(str(absent)) is None and (absent / "runs").is_dir()


class _EndedRayJobs:
    """Ray's Jobs API as it answers for a job whose entrypoint failed before the job wrapper ran (a missing
    module on the node): FAILED, a message quoting the log from its start, the whole log."""

    LOG = ("+ mkdir -p /tmp/grpo-job-abc\n"
           + "".join(f"pip: Requirement already satisfied: pkg{i}\n" for i in range(300))
           + "Traceback (most recent call last):\n  File \"<frozen runpy>\", line 198, in _run_module_as_main\n"
           + "ModuleNotFoundError: No module named 'psutil'\n")

    def get_job_info(self, job_id):
        from types import SimpleNamespace

        message = "Job entrypoint command failed with exit code 1, last available logs (truncated to 20,000 chars):\n"
        return SimpleNamespace(status="FAILED", message=message + self.LOG[:200], metadata={})

    def get_job_logs(self, job_id):
        return self.LOG


def test_a_ray_job_that_failed_before_its_wrapper_ran_says_the_error_from_its_logs_last_lines():
    from backend.executors.ray import RayExecutor

    executor = RayExecutor("http://127.0.0.1:8265")
    executor._api = _EndedRayJobs()
    status = executor.status("run--trainer--abc123")
    assert status.stage == "ERROR"
    assert status.message == ("the Ray job ended without its wrapper's record: "
                              "ModuleNotFoundError: No module named 'psutil'"), status.message


def test_a_picked_port_is_free_outside_the_kernels_ephemeral_range_and_not_handed_out_twice(monkeypatch):
    """A server starts on a picked port seconds later; a process binding port 0 meanwhile (vLLM's internal sockets,
    Ray's components) gets an ephemeral port, so the picked one must not be ephemeral (seen: the panel's page
    answered by a Ray worker's gRPC). A port in use is skipped."""
    import collections
    import socket

    from backend.plan.engines import local

    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral_low = int(f.read().split()[0])
    ports = [local.free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports), "one process never gets a port twice in a row of 200"
    assert all(local.PORT_BAND[0] <= p < min(local.PORT_BAND[1], ephemeral_low) for p in ports), ports
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        spare = local.free_port()
        monkeypatch.setattr(local, "_handed_out", collections.deque([ports[0]], maxlen=512))
        tries = iter([taken, ports[0], spare])   # in use, handed out already, free
        monkeypatch.setattr(local, "PORT_BAND", (1024, 32768))
        monkeypatch.setattr(local.random, "randrange", lambda low, high: next(tries))
        assert local.free_port() == spare


def test_a_ray_replica_checks_its_ports_on_its_node_and_a_local_or_hf_jobs_replica_does_not(monkeypatch):
    """A Ray run's ports are picked free on the panel's machine; its replica job runs on a node of the cluster,
    which checks them there before any server starts (serve_replica --check-ports). A sweep's fleet is made of the
    same replica jobs. Local replicas run where their ports were picked; an HF Job has a machine of its own."""
    from backend.plan import recipe

    monkeypatch.setenv("RAY_ADDRESS", "http://10.0.0.5:8265")
    for vllm_flavor in ("ray-cpu", "ray-1gpu"):
        spec = RunSpec(executor="ray", mode="distributed", replicas=2, mount_path="/shared/grpo",
                       vllm_flavor=vllm_flavor)
        jobs = recipe.RunJobs(spec, executors.engine("ray").placement(spec, preview=False)).first()
        assert [j.role for j in jobs] == ["vllm-0", "vllm-1"]
        assert all("runtime.serving.serve_replica" in j.command[2] and " --check-ports " in j.command[2] for j in jobs)
        fleet = recipe.FleetJobs((spec,), 0, spec.lora_r, executors.engine("ray").placement(spec, False)).jobs()
        assert fleet and all(" --check-ports " in j.command[2] for j in fleet)
    local = preview_jobs(RunSpec(mode="distributed", replicas=2))
    remote = preview_jobs(RunSpec(mode="distributed", replicas=2, executor="hf_jobs", bucket="alice/b"))
    assert not any("--check-ports" in j.command[2] for j in [*local, *remote])


def test_an_executor_answers_whether_it_lists_with_a_visitors_token_and_one_that_does_not_say_answers_no():
    from backend.executors.base import Executor, answers_lists_with_token
    from backend.executors.hf_jobs import HfJobsExecutor
    from backend.executors.local import LocalExecutor

    assert Executor.lists_with_token is False
    assert answers_lists_with_token(HfJobsExecutor) is True
    assert answers_lists_with_token(LocalExecutor) is False and answers_lists_with_token(object()) is False


def test_a_ray_jobs_wrapper_is_named_as_the_runs_own_code_has_it(tmp_path):
    """On Ray the wrapper runs from the run's own code/ (its PYTHONPATH): a run an older panel launched has the flat
    runtime/ there, so a resumed job's wrapper is `runtime.job_wrapper`, not `runtime.job.job_wrapper`."""
    import shlex

    from backend.plan.engines.ray import submit_args
    from backend.plan.jobspec import CODE_LAYOUT_MARK, FLAT_CODE_MARK, flat_code_command

    spec = RunSpec(executor="ray", mode="colocated", mount_path=str(tmp_path), flavor="ray-cpu").check()
    [job] = preview_jobs(spec)
    code = tmp_path / "runs" / spec.run_id / "code"

    def wrapper_module(job) -> str:
        words = shlex.split(shlex.split(submit_args(job, "j1", None)["entrypoint"])[-1])
        return words[words.index("-m") + 1]

    (code / CODE_LAYOUT_MARK).parent.mkdir(parents=True)
    (code / CODE_LAYOUT_MARK).write_text("")
    assert wrapper_module(job) == "runtime.job.job_wrapper"
    (code / CODE_LAYOUT_MARK).unlink()
    (code / FLAT_CODE_MARK).write_text("")
    assert wrapper_module(job) == "runtime.job_wrapper"
    assert flat_code_command(["python", "-m", "runtime.trainer.train", "--x", "runtime.tiny_model"]) == [
        "python", "-m", "runtime.train", "--x", "runtime.tiny_model"]
