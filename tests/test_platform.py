"""The Jobs platform's own features, used by the panel: a distributed run's private network group, retries that
resume themselves (and stop where a retry cannot help), and an organisation's resource groups. Against the loopback
fake of the Hub through the real huggingface_hub client, and with the real runtime modules as processes.
"""

import json
import os
import subprocess
import sys
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
from huggingface_hub import HfApi
from huggingface_hub.errors import BadRequestError

from backend.executors.hf_jobs import HfJobsExecutor
from backend.executors.local import LocalExecutor
from backend.plan.cost import job_spend
from backend.plan.jobspec import JobSpec, VolumeSpec
from backend.runtime.serving.proxy import start_proxy
from backend.runtime.serving.proxy_env import expand_replica_url
from backend.runtime.task import TaskDataError
from backend.runtime.trainer import run_end
from backend.storage.store import FolderStore
from backend.view.runview import RunView
from tests.fakehub import FakeUser, wait_until
from tests.helpers import launch_reviewed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALICE = "hf_oauth_aliceToken000000000000"
RESOURCE_GROUP = "66980ecfc1e12a49c8f0e42d"
FORM = {"executor": "hf_jobs", "model": "Qwen/Qwen2.5-0.5B-Instruct", "dataset": "trl-lib/DeepMath-103K",
        "bucket": "alice/grpo-runs", "flavor": "a10g-small", "rewards": ["format"], "mode": "distributed",
        "replicas": 2, "vllm_flavor": "l4x1"}


pytestmark = [pytest.mark.integration, pytest.mark.fake_hub(users={ALICE: FakeUser("alice", {"acme": "write"})})]


# ---- 1. the private network

def test_a_distributed_run_shares_one_network_group_and_exposes_only_the_trainers_proxy(hub, make_panel):
    panel = make_panel()
    form = {**FORM, "attempts": 3}
    once = panel.preview({**form, "attempts": 1}).markdown
    result, shown = launch_reviewed(panel, form)
    assert result.run_id, result.message
    group = f"grpo-{result.run_id}"
    # The preview says it as the hf CLI spells it, and why.
    assert f"--network-group {group}" in shown.markdown and "--network-alias vllm-1" in shown.markdown
    assert "--attempts 3" in shown.markdown and "Private network" in shown.markdown and "Retries:" in shown.markdown
    assert "x 3 attempts" in shown.markdown and _usd(shown.markdown) == pytest.approx(3 * _usd(once), abs=0.011)

    posts = hub.job_posts()
    assert [p.json["network"] for p in posts] == [{"group": group, "aliases": [a]}
                                                  for a in ("vllm-0", "vllm-1", "trainer")]
    assert [p.json.get("expose") for p in posts] == [None, None, {"ports": [8000], "portsPublic": []}]
    assert all(p.json["attempts"] == 3 for p in posts)
    trainer = posts[2].json
    script = trainer["command"][-1]
    assert "--replica 'http://${HF_NETWORK_GROUP_PREFIX}vllm-0:8000'" in script and "VLLM_REPLICA_URLS" not in \
        trainer["environment"]
    assert trainer["environment"]["GRPO_REPLICA_AUTH"] == "none"      # no token on rollout requests
    # Placed together, as the Hub places them: one namespace, no resource group, one group; each at its alias.
    ids = {job.spec["labels"]["grpo-panel-role"]: job_id for job_id, job in hub.run_jobs.items()}
    assert hub.network_members("alice", group) == {"vllm-0": [ids["vllm-0"]], "vllm-1": [ids["vllm-1"]],
                                                   "trainer": [ids["trainer"]]}
    info = HfApi(token=ALICE).inspect_job(job_id=ids["trainer"], namespace="alice")
    assert (info.network.group, info.network.aliases, info.retry, info.expose) == (group, ["trainer"], 2, [8000])
    assert info.status.expose_urls == [f"https://{ids['trainer']}--8000.hf.jobs"]   # the panel's way in


class _JobsPort(BaseHTTPRequestHandler):
    """What the Jobs proxy puts in front of a job's exposed port: only the job owner's token passes; behind it, the
    trainer's proxy answering as the replicas would (the model asked for is in the answer)."""

    token: ClassVar[str] = ""
    seen: ClassVar[list] = []

    def log_message(self, *args) -> None:
        pass

    def _answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _allowed(self) -> bool:
        self.seen.append((self.command, self.path, self.headers.get("Authorization")))
        if self.headers.get("Authorization") != f"Bearer {self.token}":
            self._answer(401, {"error": "Invalid credentials"})
            return False
        return True

    def do_GET(self) -> None:
        if self._allowed():
            self._answer(200, {"data": [{"id": FORM["model"], "parent": None},
                                        {"id": "trl-policy-v1", "parent": FORM["model"]}]})

    def do_POST(self) -> None:
        if self._allowed():
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self._answer(200, {"choices": [{"message": {"content": f"answered by {body['model']}"}}]})


def test_try_it_on_a_live_private_network_run_asks_the_trainers_one_exposed_port_with_the_visitors_token(
        hub, make_panel):
    """No replica has a port of its own on the private network: "try it" reaches the proxy through the trainer's
    exposed port, at the URL the Hub reports for it, with the visitor's OAuth token (and never a replica's URL)."""
    from backend.runs.access import Visitor
    from backend.runtime import layout

    server = ThreadingHTTPServer(("127.0.0.1", 0), _JobsPort)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _JobsPort.token, _JobsPort.seen = ALICE, []
    hub.expose_url_format = f"http://127.0.0.1:{server.server_port}/{{job_id}}-{{port}}"
    try:
        panel = make_panel(on_space=True)
        alice = Visitor(ALICE, "alice")
        shown = panel.preview(FORM, alice)
        result = panel.launch(FORM, alice, confirmed=shown.fingerprint, run_id=shown.run_id)
        run_id = result.run_id
        assert run_id, result.message
        ids = {job.spec["labels"]["grpo-panel-role"]: job_id for job_id, job in hub.run_jobs.items()}
        for job_id in ids.values():
            hub.set_stage(job_id, "RUNNING")
        prefix = f"{layout.run_prefix(run_id)}"
        snapshot = {"time": 1.0, "replicas": [{"url": f"http://vllm-{i}:8000", "healthy": True,
                                               "adapters": ["trl-policy-v1"]} for i in range(2)]}
        hub.put_file("alice/grpo-runs", f"{prefix}/{layout.METRICS_DIR}/{layout.fragment_name('proxy', 0)}",
                     (json.dumps(snapshot) + "\n").encode())
        for name in (*layout.ADAPTER_FILES, layout.ADAPTER_META_FILE):
            hub.put_file("alice/grpo-runs", f"{prefix}/{layout.ADAPTERS_DIR}/trl-policy-v1/{name}",
                         b'{"step": 5}' if name == layout.ADAPTER_META_FILE else b"{}")
        view = panel.view(run_id, alice)
        wait_until(lambda: (view.refresh() or True) and view.stage == "RUNNING" and view.replica_stats
                   and 1 in view.adapters, timeout=20)
        last = list(panel.try_it(run_id, alice, "Count to three", ["base", "trl-policy-v1"], 8))[-1]
    finally:
        server.shutdown()
        server.server_close()
    assert last.done, last
    assert last.routes == {"base": "live replicas (through the proxy)",
                           "trl-policy-v1": "live replicas (through the proxy)"}, last
    assert last.answers == {"base": f"answered by {FORM['model']}", "trl-policy-v1": "answered by trl-policy-v1"}
    paths = {path for _, path, _ in _JobsPort.seen}
    assert paths == {f"/{ids['trainer']}-8000/v1/models", f"/{ids['trainer']}-8000/v1/chat/completions"}, paths
    assert {auth for *_, auth in _JobsPort.seen} == {f"Bearer {ALICE}"}


def test_a_network_group_is_per_namespace_and_resource_group(hub):
    hub.resource_groups = {RESOURCE_GROUP: "acme"}
    api = HfApi(token=ALICE)
    base = dict(image="python:3.12", command=["true"], network_group="g1")
    mine = api.run_job(**base, network_aliases=["a"], namespace="alice")
    org = api.run_job(**base, network_aliases=["a"], namespace="acme", resource_group_id=RESOURCE_GROUP)
    assert hub.network_members("alice", "g1") == {"a": [mine.id]}
    assert hub.network_members("acme", "g1", RESOURCE_GROUP) == {"a": [org.id]}
    assert hub.network_members("acme", "g1") == {}
    for bad in (dict(network_group="Not_Lower"), dict(network_group="g1", network_aliases=["x", "x"])):
        with pytest.raises(BadRequestError, match="Invalid network|unique within the job"):
            api.run_job(image="python:3.12", command=["true"], namespace="alice", **bad)


# ---- 2. retries

def test_a_job_the_hub_retries_runs_again_and_its_spend_counts_every_attempt(hub):
    now = [1_000_000.0]
    hub.clock = lambda: now[0]
    executor = HfJobsExecutor(ALICE, "alice", reconnect_delay_s=0.2)
    try:
        job = JobSpec(run_id="r1", role="trainer", image="vllm/vllm-openai:v0.31.0", command=["true"],
                      flavor="a10g-small", timeout_s=3600, volumes=(VolumeSpec("alice/grpo-runs", "/bucket"),),
                      attempts=2)
        job_id = executor.submit(job)
        hub.set_stage(job_id, "RUNNING")
        now[0] += 600
        hub.set_stage(job_id, "ERROR", "preempted")             # attempt 1 fails: the Hub starts attempt 2
        assert executor.status(job_id).stage == "SCHEDULING"
        hub.set_stage(job_id, "RUNNING")
        now[0] += 300
        hub.set_stage(job_id, "ERROR", "preempted again")       # no attempt left: it stays failed
        assert executor.status(job_id).stage == "ERROR"
        [record] = executor.list_jobs("r1")
        spend = job_spend(record, {"a10g-small": 1.0}, now[0])
        assert spend.running_s == 900 and spend.usd == pytest.approx(0.25)   # both attempts, not the last one
    finally:
        executor.stop()


def _run_attempt(run_dir: str, number: int | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "backend")}
    env.pop("GRPO_ATTEMPT", None)
    if number is not None:
        env["GRPO_ATTEMPT"] = str(number)
    return subprocess.run([sys.executable, "-m", "runtime.job.attempt", "--run-dir", run_dir], env=env,
                          capture_output=True, text=True, timeout=60)


def test_each_attempt_is_in_the_header_and_one_after_bad_data_does_not_start(tmp_path):
    store = FolderStore(str(tmp_path))
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    (run_dir / "spec.json").write_text("{}")
    assert _run_attempt(str(run_dir), 1).returncode == 0
    view = RunView("r1", store, LocalExecutor(str(tmp_path / "home")), {})
    view.refresh()
    assert view.retries == []                                   # a first attempt is no retry
    # The trainer fails for a reason a retry can fix (a lost connection): the next attempt starts.
    run_end.record_end(str(run_dir), "trainer", ConnectionError("replica went away"))
    assert _run_attempt(str(run_dir), 2).returncode == 0
    view.refresh()
    assert len(view.retries) == 1 and view.retries[0].startswith("trainer retried at ") and "(attempt 2)" in \
        view.retries[0]
    # Bad data: the failed event says a retry cannot help, the trainer exits NO_RETRY_EXIT, and the next attempt
    # stops at once with the reason, recording nothing.
    try:
        raise RuntimeError("could not load the task") from TaskDataError("line 3 of data.jsonl is not JSON")
    except RuntimeError as error:
        message = run_end.record_end(str(run_dir), "trainer", error)
    with pytest.raises(SystemExit) as leaving:
        run_end.leave(message)
    assert leaving.value.code == 3
    refused = _run_attempt(str(run_dir), 3)
    assert refused.returncode == 3 and "a retry cannot fix" in refused.stdout and "could not load" in refused.stdout
    events = [json.loads(line) for f in sorted((run_dir / "events").iterdir()) for line in f.read_text().splitlines()]
    assert [e["event"] for e in events] == ["attempt", "failed", "attempt", "failed"]
    assert events[-1]["retry"] is False and "retry" not in events[1]


def test_the_local_wrapper_retries_a_failed_job_but_not_one_that_says_a_retry_cannot_help(tmp_path):
    executor = LocalExecutor(str(tmp_path / "home"))
    counter = tmp_path / "runs.txt"
    try:
        # Fails twice, then succeeds: three runs of the same command, the job COMPLETED.
        flaky = (f'echo "run $GRPO_ATTEMPT" >> {counter}; '
                 f'[ "$(wc -l < {counter})" -ge 3 ] || {{ echo "boom"; exit 1; }}')
        job = JobSpec(run_id="w1", role="vllm-0", image="local", command=["bash", "-c", flaky], flavor="local",
                      timeout_s=60, volumes=(VolumeSpec("local/b", "/bucket"),), attempts=3)
        job_id = executor.submit(job)
        status = executor.wait(job_id, 60)
        assert status.stage == "COMPLETED" and counter.read_text().split("\n")[:3] == ["run 1", "run 2", "run 3"]
        log = "".join(executor.all_logs(job_id))
        assert "attempt 1 of 3 failed (exited with code 1: boom); starting attempt 2" in log
        # Exit code 3 (runtime.job.attempt's NO_RETRY_EXIT): one run, whatever attempts are left.
        counter.unlink()
        job_id = executor.submit(replace(job, command=["bash", "-c", f"echo x >> {counter}; exit 3"]))
        status = executor.wait(job_id, 60)
        assert status.stage == "ERROR" and counter.read_text() == "x\n"
    finally:
        executor.cancel_all()


# ---- the proxy on a private network sends no token

class _Recorder(BaseHTTPRequestHandler):
    seen: ClassVar[list] = []

    def do_GET(self):
        type(self).seen.append(self.headers.get("Authorization"))
        self.send_response(503)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("auth", ["none", None])
def test_rollout_requests_carry_the_token_only_off_the_private_network(monkeypatch, auth):
    planted = "hf_" + "PlAnTeDtOkEnPlAnTeDtOkEnPlAnTeDtOk"
    monkeypatch.setenv("HF_TOKEN", planted)
    if auth:
        monkeypatch.setenv("GRPO_REPLICA_AUTH", auth)
    else:
        monkeypatch.delenv("GRPO_REPLICA_AUTH", raising=False)
    recorder = type("Recorder", (_Recorder,), {"seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    proxy = start_proxy([f"http://127.0.0.1:{server.server_address[1]}"], health_interval_s=0.1)
    try:
        wait_until(lambda: len(recorder.seen) >= 2, 10)
        assert set(recorder.seen) == ({None} if auth == "none" else {f"Bearer {planted}"})
    finally:
        proxy.stop()
        server.shutdown()
        server.server_close()


def test_a_replica_alias_is_expanded_inside_the_job_and_refused_outside_a_group(monkeypatch):
    url = "http://${HF_NETWORK_GROUP_PREFIX}vllm-0:8000"
    monkeypatch.setenv("HF_NETWORK_GROUP_PREFIX", "grpo-r1.")
    assert expand_replica_url(url) == "http://grpo-r1.vllm-0:8000"
    assert expand_replica_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000"
    monkeypatch.delenv("HF_NETWORK_GROUP_PREFIX")
    with pytest.raises(ValueError, match="in no network group.*--network-group"):
        expand_replica_url(url)


# ---- 3. resource groups

def test_a_run_in_the_orgs_resource_group_says_so_and_the_hub_records_it(hub, make_panel):
    hub.resource_groups = {RESOURCE_GROUP: "acme"}
    panel = make_panel()
    form = {**FORM, "bucket": "acme/grpo-runs", "resource_group_id": RESOURCE_GROUP}
    result, shown = launch_reviewed(panel, form)
    assert result.run_id, result.message
    assert f"Resource group `{RESOURCE_GROUP}` of `acme`" in shown.markdown and "spending limits" in shown.markdown
    assert f"--resource-group-id {RESOURCE_GROUP}" in shown.markdown
    assert [p.json["resourceGroupId"] for p in hub.job_posts()] == [RESOURCE_GROUP] * 3
    group = f"grpo-{result.run_id}"
    assert set(hub.network_members("acme", group, RESOURCE_GROUP)) == {"vllm-0", "vllm-1", "trainer"}


def test_a_resource_group_the_hub_does_not_know_or_a_hostile_id_launches_nothing(hub, make_panel):
    hub.resource_groups = {RESOURCE_GROUP: "someone-else"}
    panel = make_panel()
    form = {**FORM, "bucket": "acme/grpo-runs", "resource_group_id": RESOURCE_GROUP}
    result, _ = launch_reviewed(panel, form)
    assert result.run_id is None and "Not launched" in result.message and "Resource group" in result.message
    assert all(job.stage == "CANCELED" for job in hub.run_jobs.values())
    posted = len(hub.job_posts())
    for hostile in ("../../admin", "66980ecfc1e12a49c8f0e42d --flavor h200x8", "<script>x</script>"):
        shown = panel.preview({**form, "resource_group_id": hostile})
        assert shown.fingerprint is None and "resource_group_id" in shown.fields, shown.markdown
        assert "24 hex digits" in shown.markdown and "<script>" not in shown.markdown
    assert len(hub.job_posts()) == posted


def _usd(markdown: str) -> float:
    return float(markdown.split("Estimated cost at most **$", 1)[1].split("**", 1)[0].replace(",", ""))


def test_a_replica_outlasts_a_trainer_failure_its_retry_may_fix_but_not_its_last_attempt(tmp_path):
    from backend.runtime.records import write_event
    from backend.runtime.serving.run_ends import TrainerEndWatch

    (tmp_path / "spec.json").write_text(json.dumps({"attempts": 2}))
    watch = TrainerEndWatch(str(tmp_path), since=0)
    write_event(str(tmp_path), "trainer", "attempt", role="trainer")
    write_event(str(tmp_path), "trainer", "failed", error="ConnectionError: replica went away")
    assert watch.ended() is None                    # its job starts it again: the heartbeat says when it is gone
    write_event(str(tmp_path), "trainer", "attempt", role="trainer")
    write_event(str(tmp_path), "trainer", "failed", error="ConnectionError: again")
    assert watch.ended() == "the trainer has failed"     # the last attempt
    fresh = tmp_path / "other"
    fresh.mkdir()
    (fresh / "spec.json").write_text(json.dumps({"attempts": 3}))
    write_event(str(fresh), "trainer", "attempt", role="trainer")
    write_event(str(fresh), "trainer", "failed", error="TaskDataError: bad row", retry=False)
    assert TrainerEndWatch(str(fresh), since=0).ended() == "the trainer has failed"   # no retry is coming


def test_bad_platform_fields_are_refused_naming_the_field():
    from backend.plan.spec import RunSpec, SpecError

    hub = dict(executor="hf_jobs", bucket="acme/grpo-runs", mode="distributed", model="Qwen/Qwen2.5-0.5B-Instruct")
    for values, field, words in [
        ({"attempts": 9}, "attempts", "between 1 and 5"),
        ({"attempts": 0}, "attempts", "between 1 and 5"),
        ({"network": "public"}, "network", "one of private, exposed"),
        ({"resource_group_id": "66980ecfc1e12a49c8f0e42"}, "resource_group_id", "24 hex digits"),
        ({"executor": "local", "bucket": "local/grpo-runs", "model": "builtin:tiny-qwen2",
          "resource_group_id": RESOURCE_GROUP}, "resource_group_id", "Hugging Face Jobs"),
    ]:
        errors = RunSpec(**{**hub, **values}).validate()
        assert [e for e in errors if e.field == field and words in e.message], (values, errors)
    with pytest.raises(SpecError, match="attempts: enter a whole number"):
        RunSpec.from_dict({**hub, "attempts": "three"})


class _Jobs:
    """Job stages as an executor reports them (the view's logs and samples stay empty)."""

    name = "local"

    def __init__(self, stages: dict[str, str]):
        self.stages = stages

    def status(self, job_id):
        from backend.plan.jobspec import JobStatus

        return JobStatus(self.stages[job_id])

    def read_logs(self, job_id, cursor):
        return [], cursor

    def tail_cursor(self, job_id, lines):
        return 0

    def read_resources(self, job_id, cursor, limit=None):
        return [], cursor

    def resources_tail_cursor(self, job_id, samples):
        return 0

    def unreadable_records(self, run_id):
        return {}


def test_a_replica_down_after_it_joined_degrades_the_run_until_the_proxy_takes_it_back(tmp_path):
    from backend.runtime.serving.proxy_stats import StatsRecorder
    from backend.runtime.serving.replicas import Replica

    run_dir = tmp_path / "runs" / "r1"
    (run_dir / "metrics").mkdir(parents=True)
    (run_dir / "spec.json").write_text(json.dumps({"mode": "distributed"}))
    stages = {"t": "RUNNING", "v0": "RUNNING", "v1": "RUNNING"}
    view = RunView("r1", FolderStore(str(tmp_path)), _Jobs(stages), {"trainer": "t", "vllm-0": "v0", "vllm-1": "v1"})
    view.min_refresh_s = 0
    recorder = StatsRecorder(str(run_dir / "metrics"), 0, 0)
    replicas = [Replica("http://a"), Replica("http://b")]

    def snapshot(*healthy: bool) -> None:
        for replica, up in zip(replicas, healthy):
            replica.joined += up and not replica.healthy
            replica.healthy = up
        recorder.sample(replicas, force=True)
        view.refresh()

    snapshot(True, False)                  # vllm-1 still starting: not a lost replica
    assert view.degraded is None
    snapshot(True, True)
    snapshot(True, False)                  # its process died; its job (RUNNING) is starting it again
    assert view.degraded == "degraded (1/2 replicas)" and view.retries == []
    replicas[1].restarted += 1             # it came back holding none of its adapters: a new server
    snapshot(True, True)                   # healthy again: the proxy took it back
    assert view.degraded is None and view.retries == ["vllm-1 taken back 1x after a restart"]
    snapshot(True, False)                  # it stops answering for a while, and comes back holding its adapters
    replicas[1].reconnected += 1           # (the proxy counts such a return as a reconnect, not a restart)
    snapshot(True, True)
    assert view.retries == ["vllm-1 taken back 1x after a restart", "vllm-1 stopped answering and came back 1x"]
    stages["v1"] = "ERROR"                 # a job that ended is down whatever the proxy last said
    view.refresh()
    assert view.degraded == "degraded (1/2 replicas)"


def test_a_fleet_replica_lost_degrades_a_sweep_member_that_has_no_replica_job_of_its_own(tmp_path):
    """A member's jobs are its trainer alone (the fleet's replica jobs are the fleet's): its proxy's snapshot says
    the shared fleet lost a replica, and the member, training on, shows degraded until the proxy takes it back."""
    from backend.runtime.serving.proxy_stats import StatsRecorder
    from backend.runtime.serving.replicas import Replica

    run_dir = tmp_path / "runs" / "m0"
    (run_dir / "metrics").mkdir(parents=True)
    spec = {"mode": "distributed", "sweep_member": "m0", "fleet": "sweep-1", "replicas": 2}
    (run_dir / "spec.json").write_text(json.dumps(spec))
    view = RunView("m0", FolderStore(str(tmp_path)), _Jobs({"t": "RUNNING"}), {"trainer": "t"})
    view.min_refresh_s = 0
    recorder = StatsRecorder(str(run_dir / "metrics"), 0, 0)
    replicas = [Replica("http://a"), Replica("http://b")]
    for replica in replicas:
        replica.joined, replica.healthy = 1, True
    recorder.sample(replicas, force=True)
    view.refresh()
    assert view.replicas_up == (2, 2) and view.degraded is None
    replicas[1].healthy = False            # a fleet replica died: this member's proxy routes around it
    recorder.sample(replicas, force=True)
    view.refresh()
    assert view.degraded == "degraded (1/2 replicas)"
    replicas[1].healthy = True
    recorder.sample(replicas, force=True)
    view.refresh()
    assert view.degraded is None
