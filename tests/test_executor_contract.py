"""One contract, every registered executor: each setting of a JobSpec (timeout, attempts, environment, secrets,
labels) reaches the job, and a cancel reaches it too.

Each executor is observed where its job receives the settings, as cheaply as that can be done honestly: the local
one starts a real job wrapper (its command line and the job's own environment, read from the running processes);
the Ray one is checked at the Jobs API call it makes (a recording client: the entrypoint is parsed with the job
wrapper's own parser, the secrets file it sources is read); HF Jobs at the request the real `huggingface_hub`
client sends to the fake Hub. A new executor needs a harness here, or the first test fails.
"""

import json
import os
import shlex
import sys
import threading
from dataclasses import dataclass, replace
from types import SimpleNamespace

import psutil
import pytest

from backend.plan import engines
from backend.plan.jobspec import CANCELED, JobSpec, VolumeSpec
from backend.runtime.job import job_wrapper
from tests.fakehub import FakeHub, wait_until

pytestmark = pytest.mark.integration

SECRET = "hf_" + "contract0secret" * 3
JOB = JobSpec(run_id="contract-run", role="trainer", image="set per executor", command=["set per executor"],
              flavor="set per executor", timeout_s=1234, attempts=3, env={"CONTRACT_SETTING": "reached"},
              secrets=("HF_TOKEN",), labels={"contract-label": "kept"}, namespace="alice")


@dataclass
class Seen:
    """What reached the job."""

    timeout_s: float
    attempts: int
    env: dict[str, str]          # the job's environment, its secrets included
    labels: dict[str, str]
    public: str                  # everything of the job that others can read (a dashboard, a record): no secret


class LocalHarness:
    """A real wrapper process, whose job writes its own environment to a file and then waits to be cancelled."""

    def __init__(self, tmp_path, monkeypatch):
        from backend.executors.local import LocalExecutor

        self.executor = LocalExecutor(str(tmp_path / "home"), grace_s=2)
        self.report = str(tmp_path / "environment.json")

    def job(self) -> JobSpec:
        code = "import json, os, sys, time; json.dump(dict(os.environ), open(sys.argv[1], 'w')); time.sleep(120)"
        return replace(JOB, image="local", flavor="local", command=[sys.executable, "-c", code, self.report])

    def seen(self, job_id: str) -> Seen:
        record_path = os.path.join(self.executor.jobs_dir, job_id, "job.json")
        wait_until(lambda: os.path.exists(self.report) and os.path.getsize(self.report), 60, what="the job started")
        with open(record_path) as f:
            record = json.load(f)
        argv = psutil.Process(record["pid"]).cmdline()
        args = job_wrapper.parse_args(argv[argv.index("runtime.job.job_wrapper") + 1:])
        with open(self.report) as f:
            env = json.load(f)
        with open(os.path.join(self.executor.jobs_dir, job_id, job_wrapper.LOG_FILE)) as f:
            log = f.read()
        return Seen(args.timeout, args.attempts, env, record["spec"]["labels"], json.dumps(record) + log)

    def cancelled(self, job_id: str) -> bool:
        self.executor.cancel(job_id)
        return self.executor.wait(job_id, 30).stage == CANCELED

    def close(self) -> None:
        self.executor.cancel_all()


class RecordingRayClient:
    """Ray's `JobSubmissionClient` as far as the executor calls it: records what it is asked."""

    def __init__(self):
        self.submitted: dict[str, dict] = {}
        self.stopped: list[str] = []
        self.lock = threading.Lock()

    def submit_job(self, submission_id: str, **kwargs) -> str:
        self.submitted[submission_id] = kwargs
        return submission_id

    def get_job_info(self, job_id: str):
        with self.lock:
            status = "STOPPED" if job_id in self.stopped else "PENDING"
        return SimpleNamespace(status=status, message="", metadata=self.submitted[job_id]["metadata"],
                               driver_agent_http_address=None, submission_id=job_id, start_time=0, end_time=None)

    def stop_job(self, job_id: str) -> bool:
        with self.lock:
            self.stopped.append(job_id)
        return True


class RayHarness:
    """The Ray executor against a recording client: its run folder is a real folder, as the cluster's shared path."""

    def __init__(self, tmp_path, monkeypatch):
        from backend.executors.ray import RayExecutor

        self.client = RecordingRayClient()
        self.executor = RayExecutor("http://127.0.0.1:9")
        self.executor._api = self.client
        self.mount = str(tmp_path / "shared")

    def job(self) -> JobSpec:
        return replace(JOB, image="ray", flavor="ray-cpu", command=["python", "-m", "runtime.trainer.train"],
                       volumes=(VolumeSpec("local/contract", self.mount),))

    def seen(self, job_id: str) -> Seen:
        submitted = self.client.submitted[job_id]
        bash, dash_c, script = shlex.split(submitted["entrypoint"])
        assert (bash, dash_c) == ("bash", "-c")
        tokens = shlex.split(script)
        args = job_wrapper.parse_args(tokens[tokens.index("runtime.job.job_wrapper") + 1:])
        assert args.command == self.job().command
        # The entrypoint sources the secrets file before the wrapper starts: its values are the job's environment.
        secrets_file = tokens[tokens.index(".") + 1]
        with open(secrets_file) as f:
            secrets = dict(shlex.split(line)[0].split("=", 1) for line in f if line.strip())
        assert oct(os.stat(secrets_file).st_mode & 0o777) == "0o600"
        env = {**submitted["runtime_env"]["env_vars"], **secrets}
        return Seen(args.timeout, args.attempts, env, submitted["metadata"], json.dumps(submitted))

    def cancelled(self, job_id: str) -> bool:
        self.executor.cancel(job_id)
        cancel_file = os.path.join(self.client.submitted[job_id]["metadata"]["grpo-panel-job-dir"],
                                   job_wrapper.CANCEL_FILE)
        # Not started yet: Ray's own stop, at once; the wrapper would have read the cancel file.
        wait_until(lambda: job_id in self.client.stopped, 10, what="Ray's stop")
        return os.path.exists(cancel_file) and self.executor.status(job_id).stage == CANCELED

    def close(self) -> None:
        pass


class HfJobsHarness:
    """HF Jobs through the real `huggingface_hub` client, against the fake Hub."""

    def __init__(self, tmp_path, monkeypatch):
        from backend.executors.hf_jobs import HfJobsExecutor

        self.hub = FakeHub().start()
        self.hub.patch_endpoint(monkeypatch)
        self.executor = HfJobsExecutor(self.hub.token, "alice", reconnect_delay_s=0.2)

    def job(self) -> JobSpec:
        return replace(JOB, image="vllm/vllm-openai:v0.31.0", flavor="cpu-basic",
                       command=["python", "-m", "runtime.trainer.train"])

    def seen(self, job_id: str) -> Seen:
        body = self.hub.jobs[job_id].spec
        env = {**body.get("environment", {}), **body.get("secrets", {})}
        public = json.dumps({k: v for k, v in body.items() if k != "secrets"})
        return Seen(body["timeoutSeconds"], body.get("attempts", 1), env, body["labels"], public)

    def cancelled(self, job_id: str) -> bool:
        self.executor.cancel(job_id)
        return self.hub.jobs[job_id].stage == CANCELED and self.executor.status(job_id).stage == CANCELED

    def close(self) -> None:
        self.executor.stop()
        self.hub.stop()


HARNESSES = {"local": LocalHarness, "ray": RayHarness, "hf_jobs": HfJobsHarness}


def test_every_registered_executor_is_held_to_the_contract():
    assert set(HARNESSES) == set(engines.EXECUTORS)


@pytest.mark.parametrize("name", engines.EXECUTORS)
def test_every_job_setting_and_a_cancel_reach_the_job(name, tmp_path, monkeypatch):
    harness = HARNESSES[name](tmp_path, monkeypatch)
    try:
        job = harness.job()
        job_id = harness.executor.submit(job, {"HF_TOKEN": SECRET})
        seen = harness.seen(job_id)
        assert seen.timeout_s == job.timeout_s
        assert seen.attempts == job.attempts
        assert seen.env["CONTRACT_SETTING"] == "reached"
        assert seen.env["HF_TOKEN"] == SECRET and SECRET not in seen.public
        assert seen.labels.items() >= job.labels.items()
        assert harness.cancelled(job_id)
    finally:
        harness.close()
