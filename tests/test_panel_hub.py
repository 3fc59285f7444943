"""The panel on Hugging Face Jobs, end to end through its handlers, against the loopback fake of the Hub.

(The same paths through Gradio's own request handling and a real browser are in test_space_browser.py.)
"""

import functools
import json
import os
import re
import shlex
import time
import zipfile
from dataclasses import replace

import pytest

from backend.plan.jobspec import LABEL_RUN
from backend.runs.access import Visitor
from backend.runs.operations import SweepForm
from backend.view.alerts import AlertBook
from panel import dashboard
from panel.runs_list import RUNS_HEADERS
from tests.fakehub import TOKEN_SHAPES, FakeUser, wait_until
from tests.helpers import launch_reviewed

PLANTED = "hf_" + "PlAnTeDtOkEnPlAnTeDtOkEnPlAnTeDtOk"
FORM = {"executor": "hf_jobs", "model": "Qwen/Qwen2.5-0.5B-Instruct", "dataset": "trl-lib/DeepMath-103K",
        "bucket": "alice/grpo-runs", "flavor": "a10g-small", "use_vllm": True, "rewards": ["format"]}
ALICE = "hf_oauth_aliceToken000000000000"
BOB = "hf_oauth_bobToken00000000000000"
CAROL = "hf_oauth_carolToken0000000000"
DAN = "hf_oauth_danToken000000000000000"
EXECUTOR = RUNS_HEADERS.index("executor")


pytestmark = [pytest.mark.integration, pytest.mark.fake_hub(users={ALICE: FakeUser("alice", {"acme": "write"}),
                                         BOB: FakeUser("bob", {"acme": "write"}), CAROL: FakeUser("carol")})]

def test_launch_a_colocated_run_and_watch_logs_gpus_and_metrics(hub, make_panel):
    panel = make_panel()
    result = panel.launch(FORM)
    assert result.run_id is None and "Estimated cost" in result.message and hub.job_posts() == [], "review first"
    result, shown = launch_reviewed(panel, FORM)
    run_id = result.run_id
    assert run_id == shown.run_id, result.message
    [post] = hub.job_posts()
    body = post.json
    assert body["flavor"] == "a10g-small" and body["timeoutSeconds"] == 30 * 60
    assert body["labels"][LABEL_RUN] == run_id
    assert [v["mountPath"] for v in body["volumes"]] == ["/bucket"]
    assert "HF_TOKEN" in body["secrets"] and "HF_TOKEN" not in (body.get("environment") or {})
    assert ALICE not in json.dumps(body.get("environment")) and ALICE not in json.dumps(body["command"])
    spec_json = hub.buckets["alice/grpo-runs"].files[f"runs/{run_id}/spec.json"].data.decode()
    assert ALICE not in spec_json and json.loads(spec_json)["run_id"] == run_id
    assert f"runs/{run_id}/code/runtime/trainer/train.py" in hub.buckets["alice/grpo-runs"].files

    view = panel.view(run_id)
    job_id = view.jobs["trainer"].job_id
    hub.set_stage(job_id, "RUNNING")
    hub.append_logs(job_id, "generation engine: vLLM colocated", f"HF_TOKEN={PLANTED} leaked by a user script",
                    "step 1/500 reward 0.10")
    hub.append_metrics(job_id, {"cpu_usage_pct": 50.0, "memory_used_bytes": 2**30, "gpus": {
        "GPU-a": {"utilization": 87.0, "memory_used_bytes": 20 * 2**30, "memory_total_bytes": 24 * 2**30}}})
    records = [{"step": 1, "time": 1.0, "reward": 0.1, "reward_std": 0.05}, {"step": 2, "time": 2.0, "reward": 0.3}]
    hub.put_file("alice/grpo-runs", f"runs/{run_id}/metrics/trainer-000000.jsonl",
                 "".join(json.dumps(r) + "\n" for r in records).encode())
    trainer = view.jobs["trainer"]

    def everything_arrived() -> bool:
        view.refresh()
        return len(trainer.logs) >= 3 and bool(trainer.resources) and len(view.metrics) == 2

    wait_until(everything_arrived, timeout=15)
    assert [r["reward"] for r in view.metrics] == [0.1, 0.3]
    frame = dashboard.build_frame(view)
    gpu = [t for t in json.loads(frame.utilisation)["data"] if t["name"] == "trainer GPU0"]
    assert gpu and gpu[0]["y"] == [87.0]
    logs = dashboard.log_text(view, "trainer")
    assert "step 1/500" in logs and PLANTED not in logs and ALICE not in logs
    assert "RUNNING" in frame.status

    # The full-log download is masked too, and repeated downloads replace one file instead of piling up.
    log_path = panel.full_log_file(run_id, "trainer")
    text = open(log_path).read()
    assert "step 1/500" in text and PLANTED not in text and ALICE not in text
    assert panel.full_log_file(run_id, "trainer") == log_path
    assert panel.final_adapter(run_id) is None, "no final adapter yet"
    for name, data in [("adapter_config.json", b'{"r": 8}'), ("adapter_model.safetensors", b"weights")]:
        hub.put_file("alice/grpo-runs", f"runs/{run_id}/final/{name}", data)
    zip_path = panel.final_adapter(run_id)
    with zipfile.ZipFile(zip_path) as zf:
        assert zf.read("adapter_config.json") == b'{"r": 8}' and zf.read("adapter_model.safetensors") == b"weights"
    assert sorted(os.listdir(panel.downloads)) == sorted(map(os.path.basename, [log_path, zip_path]))
    cache = os.path.join(panel.settings.home, "cache", "bucket-files")
    assert os.listdir(cache), "bucket files are cached under the panel's home"

    restarted = make_panel()
    assert run_id in [row[0] for row in restarted.runs_table()], "a restarted panel lists the run"
    assert restarted.view(run_id).jobs["trainer"].job_id == job_id


def test_the_preview_and_the_launch_describe_the_same_run(hub, make_panel):
    panel = make_panel()
    result, shown = launch_reviewed(panel, FORM)
    assert result.run_id == shown.run_id and f"grpo-panel-run={shown.run_id}" in shown.markdown
    [post] = hub.job_posts()
    assert post.json["labels"][LABEL_RUN] == shown.run_id


def test_a_changed_form_needs_a_new_review_before_it_launches(hub, make_panel):
    panel = make_panel()
    shown = panel.preview(FORM)
    changed = {**FORM, "flavor": "l4x4", "timeout_minutes": 600}
    result = panel.launch(changed, confirmed=shown.fingerprint, run_id=shown.run_id)
    assert result.run_id is None and "form changed since the reviewed preview" in result.message
    assert hub.job_posts() == []
    assert result.preview.fingerprint != shown.fingerprint and "l4x4" in result.preview.markdown
    assert panel.launch(changed, confirmed=result.preview.fingerprint).run_id, "the new review launches"


def test_a_reused_preview_launches_the_run_once(hub, make_panel):
    panel = make_panel()
    first, shown = launch_reviewed(panel, FORM)
    assert first.run_id == shown.run_id
    again = panel.launch(FORM, confirmed=shown.fingerprint, run_id=shown.run_id)
    assert again.already and again.run_id == first.run_id and "was launched already" in again.message, again.message
    assert len(hub.job_posts()) == 1


def test_anonymous_space_visitor_cannot_launch_or_cancel_on_hf_jobs(hub, make_panel):
    panel = make_panel(on_space=True)
    shown = panel.preview(FORM)
    result = panel.launch(FORM, confirmed=shown.fingerprint)
    assert result.run_id is None and "Sign in" in result.message
    assert hub.job_posts() == []
    assert panel.runs_table() == [] and "Sign in" in panel.runs_hint()


def test_a_visitor_cannot_launch_into_a_namespace_they_do_not_own(hub, make_panel):
    panel = make_panel(on_space=True)
    form = {**FORM, "bucket": "someone-else/runs"}
    result = panel.launch(form, ALICE, confirmed=panel.preview(form, ALICE).fingerprint)
    assert result.run_id is None and "nothing was launched" in result.message and result.fields == ("bucket",)
    assert hub.job_posts() == []


def test_a_bucket_the_visitor_cannot_write_is_refused_at_preview_naming_the_bucket_field(hub, make_panel):
    """Another user's namespace, or an org the visitor only reads (whoami-v2's roleInOrg), is refused by Preview
    itself: no cost, no review code, the Bucket field named; Launch refuses it the same way."""
    hub.users[DAN] = FakeUser("dan", {"acme": "read", "dan-lab": "admin"})
    panel = make_panel(on_space=True)
    panel.field_labels = {"bucket": "Bucket (namespace/name)"}
    for bucket, words in (("acme/grpo-runs", "read-only access to acme"), ("carol/grpo-runs", "someone else")):
        form = {**FORM, "bucket": bucket}
        shown = panel.preview(form, DAN)
        assert shown.fingerprint is None and "bucket" in shown.fields, shown.markdown
        assert "**Bucket (namespace/name)** (`bucket`)" in shown.markdown and words in shown.markdown, shown.markdown
        assert "Estimated cost" not in shown.markdown and "dan, dan-lab" in shown.markdown, shown.markdown
        result = panel.launch(form, DAN, confirmed="anything")
        assert result.run_id is None and "bucket" in result.fields, result.message
    assert panel.preview({**FORM, "bucket": "dan-lab/grpo-runs"}, DAN).fingerprint, "an org dan administers is fine"
    assert hub.job_posts() == []


def test_unknown_hardware_is_refused_with_the_valid_flavors(hub, make_panel):
    panel = make_panel()
    shown = panel.preview({**FORM, "flavor": "quantum-xl"})
    assert shown.fingerprint is None and "quantum-xl" in shown.markdown and "a10g-small" in shown.markdown
    result = panel.launch({**FORM, "flavor": "quantum-xl"}, confirmed="anything")
    assert result.run_id is None and "**flavor**" in result.message and hub.job_posts() == []


def test_each_executor_offers_and_accepts_only_its_own_hardware(hub, make_panel, monkeypatch):
    """Where no Ray cluster answers, no Ray flavor is listed; where one does, an HF Jobs run still cannot pick a Ray
    flavor (the Hub would refuse it at submission, after the review): refused at preview, naming the field."""
    from backend.plan.engines import ray

    panel = make_panel()
    assert "ray" not in panel.offered_executors()
    assert not [f.name for f in panel.flavors() if f.name.startswith("ray-")]
    monkeypatch.setattr(ray.ENGINE, "runtime_problem", lambda: None)     # a cluster answers
    assert "ray" in panel.offered_executors()
    assert {f.name for f in panel.flavors(None, "ray")} == set(ray.RAY_FLAVORS)
    assert not [f.name for f in panel.flavors(None, "hf_jobs") if f.name.startswith("ray-")]
    for field in ("flavor", "vllm_flavor"):
        form = {**FORM, "mode": "distributed", "replicas": 1, "vllm_flavor": "l4x1", field: "ray-1gpu"}
        shown = panel.preview(form)
        assert shown.fingerprint is None and f"**{field}**" in shown.markdown, shown.markdown
        assert "a10g-small" in shown.markdown and "ray-cpu" not in shown.markdown, shown.markdown
    assert hub.job_posts() == []


def test_a_failed_second_submission_cancels_the_first_and_says_so(hub, make_panel):
    panel = make_panel()
    hub.fail_nth_job_submission(2)
    result, _ = launch_reviewed(panel, {**FORM, "mode": "distributed", "replicas": 2, "vllm_flavor": "l4x1"})
    assert result.run_id is None and "Cancelled the 1 job(s) already submitted" in result.message
    [first] = [r for r in hub.requests if r.method == "POST" and r.path.endswith("/cancel")]
    assert first.path.startswith("/api/jobs/alice/")


SWEEP_FORM = {**FORM, "mode": "distributed", "replicas": 2, "vllm_flavor": "l4x1"}
SWEEP = SweepForm((("max_staleness", "1, 2"), ("lora_r", "8, 16")), grid=False)


def estimated_usd(markdown: str) -> float:
    return float(re.search(r"at most \*\*\$([0-9.]+)\*\*", markdown).group(1))


def test_a_sweep_launches_one_fleet_and_each_members_trainer_after_one_review_and_cancel_sweep_stops_them_all(
        hub, make_panel):
    """On HF Jobs a sweep's members share one fleet: its replica jobs are submitted once (labelled with the sweep's
    id, sized for every member), each member submits its trainer alone, on the fleet's network group, reaching the
    fleet's replicas at their aliases; the preview's cost counts the fleet once; Cancel sweep stops the members,
    then the fleet."""
    panel = make_panel()
    unreviewed = panel.launch(SWEEP_FORM, sweep=SWEEP)
    assert unreviewed.run_id is None and "Not launched yet" in unreviewed.message, unreviewed.message
    assert "Estimated cost of all 2 members at most" in unreviewed.message and hub.job_posts() == []
    shown = panel.preview(SWEEP_FORM, sweep=SWEEP)
    assert "**One fleet** for all members: 2 replica job(s) started once" in shown.markdown, shown.markdown
    assert "fleet's network group" in shown.markdown, "the preview says how the trainers reach the fleet"
    # One fleet, then a trainer per member: a lone distributed run's jobs (its replicas, its trainer) and one more
    # trainer (a colocated run's one job, on the same flavor and timeout).
    lone = estimated_usd(panel.preview(SWEEP_FORM).markdown)
    trainer = estimated_usd(panel.preview({**FORM, "use_vllm": False}).markdown)
    assert estimated_usd(shown.markdown) == pytest.approx(lone + trainer, abs=0.011), shown.markdown
    reviewed = replace(SWEEP, sweep_id=shown.sweep_id, run_ids=shown.run_ids)
    assert f"Review code **`{shown.fingerprint}`**" in shown.markdown and len(shown.run_ids) == 2
    changed = panel.launch({**SWEEP_FORM, "max_steps": 7}, confirmed=shown.fingerprint, sweep=reviewed)
    assert changed.run_id is None and "the form changed" in changed.message and hub.job_posts() == []

    result = panel.launch(SWEEP_FORM, confirmed=shown.fingerprint, sweep=reviewed)
    assert result.run_ids == shown.run_ids, result.message
    bodies = [r.json for r in hub.job_posts()]
    assert [(b["labels"][LABEL_RUN], b["labels"]["grpo-panel-role"]) for b in bodies] == [
        (shown.sweep_id, "vllm-0"), (shown.sweep_id, "vllm-1"),
        (shown.run_ids[0], "trainer"), (shown.run_ids[1], "trainer")], "the fleet once, then each member's trainer"
    group = f"grpo-{shown.sweep_id}"
    assert [b["network"] for b in bodies] == [{"group": group, "aliases": [alias]} for alias in
                                             ("vllm-0", "vllm-1", "trainer-m0", "trainer-m1")], bodies
    assert sorted(hub.network_members("alice", group)) == ["trainer-m0", "trainer-m1", "vllm-0", "vllm-1"]
    fleet = bodies[0]["command"][-1]
    assert "--max-loras 7 --max-cpu-loras 7" in fleet and "--max-lora-rank 16" in fleet, "(1+2) + (2+2), the largest"
    assert all(f"--member-run-dir /bucket/runs/{run_id}" in fleet for run_id in shown.run_ids), fleet
    for body, run_id in zip(bodies[2:], shown.run_ids):
        command = shlex.split(body["command"][-1])
        replicas = [command[i + 1] for i, arg in enumerate(command) if arg == "--replica"]
        assert replicas == [f"http://${{HF_NETWORK_GROUP_PREFIX}}vllm-{i}:8000" for i in range(2)], command
        assert f"/bucket/runs/{run_id}" in command and body["environment"]["GRPO_FLEET_DIR"] == \
            f"/bucket/runs/{shown.sweep_id}"
    record = json.loads(hub.buckets["alice/grpo-runs"].files[f"runs/{shown.sweep_id}/fleet.json"].data)
    assert (record["name"], record["attempts"]) == ("tiny-demo-fleet", 1), record
    rows = {row[0]: row for row in panel.runs_table()}
    assert rows[shown.sweep_id][1] == f"tiny-demo-fleet · sweep {shown.sweep_id}", "the fleet's row names it"

    said = panel.cancel_sweep(shown.run_ids[1])
    assert f"Cancel requested for sweep {shown.sweep_id}: 4 job(s) of its 2 members" in said, said
    assert f"its fleet {shown.sweep_id} (2 job(s))" in said, said
    cancels = [r.path.split("/")[-2] for r in hub.requests if r.method == "POST" and r.path.endswith("/cancel")]
    roles = [hub.jobs[job_id].spec["labels"]["grpo-panel-role"] for job_id in cancels]
    assert roles[:2] == ["trainer", "trainer"] and sorted(roles[2:]) == ["vllm-0", "vllm-1"], "members, then the fleet"
    wait_until(lambda: {job.stage for job in hub.jobs.values()} == {"CANCELED"}, what="every member cancelled")
    lone_run, _ = launch_reviewed(panel, FORM)
    assert "is not a member of a sweep" in panel.cancel_sweep(lone_run.run_id)
    assert any(job.stage != "CANCELED" for job in hub.jobs.values()), "a lone run is not cancelled as a sweep"


def test_a_sweep_whose_fleet_fails_to_submit_launches_no_member(hub, make_panel):
    panel = make_panel()
    shown = panel.preview(SWEEP_FORM, sweep=SWEEP)
    hub.fail_nth_job_submission(2, status=500)          # the fleet's second replica
    result = panel.launch(SWEEP_FORM, confirmed=shown.fingerprint,
                          sweep=replace(SWEEP, sweep_id=shown.sweep_id, run_ids=shown.run_ids))
    assert result.run_id is None and not result.run_ids, result.message
    assert "the sweep's fleet did not launch" in result.message and "No member was launched" in result.message
    assert [r.json["labels"]["grpo-panel-role"] for r in hub.job_posts()] == ["vllm-0", "vllm-1"], "no trainer"
    wait_until(lambda: {job.stage for job in hub.jobs.values()} == {"CANCELED"}, what="the fleet's replica cancelled")


def _cancels(hub) -> list[str]:
    """The job ids the panel asked the Hub to cancel, in order."""
    return [r.path.split("/")[-2] for r in hub.requests if r.method == "POST" and r.path.endswith("/cancel")]


def test_a_sweep_launched_twice_with_the_same_review_code_answers_the_first_and_changes_nothing(hub, make_panel):
    """An agent retrying a launch whose answer it lost: while the first request still submits the fleet, the retry
    answers that the sweep is being launched (the sweep's lock is held); afterwards it finds the sweep (its record
    in the bucket, the same id and review code) and answers with it; its fleet and members keep running, nothing is
    submitted or cancelled. The same sweep id with other settings (their own review code) is refused, changing
    nothing."""
    import threading

    panel = make_panel()
    shown = panel.preview(SWEEP_FORM, sweep=SWEEP)
    reviewed = replace(SWEEP, sweep_id=shown.sweep_id, run_ids=shown.run_ids)
    arrived, release = hub.hold_nth_job_submission(1)      # the fleet's first replica: the first launch is under way
    launches = []
    thread = threading.Thread(target=lambda: launches.append(
        panel.launch(SWEEP_FORM, confirmed=shown.fingerprint, sweep=reviewed)))
    thread.start()
    try:
        wait_until(arrived.is_set, 120, what="the first launch submitting the fleet")
        during = panel.launch(SWEEP_FORM, confirmed=shown.fingerprint, sweep=reviewed)
    finally:
        release.set()
        thread.join(120)
    assert during.already and during.run_ids == shown.run_ids, during.message
    assert "is being launched by an earlier request" in during.message, during.message
    [first] = launches
    assert first.run_ids == shown.run_ids and not first.already, first.message
    jobs = {job.id: job.spec["labels"][LABEL_RUN] for job in hub.jobs.values()}
    assert sorted(jobs.values()) == sorted([shown.sweep_id] * 2 + list(shown.run_ids)), jobs
    for job_id in jobs:
        hub.set_stage(job_id, "RUNNING")
    posts = len(hub.job_posts())

    again = panel.launch(SWEEP_FORM, confirmed=shown.fingerprint, sweep=reviewed)
    assert again.already and again.sweep_id == shown.sweep_id and again.run_ids == shown.run_ids, again.message
    assert f"Sweep **{shown.sweep_id}** was launched already" in again.message, again.message
    assert "submitted nothing and cancelled nothing" in again.message, again.message
    assert len(hub.job_posts()) == posts and _cancels(hub) == [], "the retry submits and cancels nothing"
    assert {hub.jobs[job_id].stage for job_id in jobs} == {"RUNNING"}, "the first sweep's fleet and members run on"

    # Other settings under the same sweep id: its members' ids name runs already, refused at the preview (one run id
    # names one run), so no review code for them exists to launch with.
    other = panel.preview({**SWEEP_FORM, "max_steps": 7}, sweep=reviewed)
    assert other.fingerprint is None and other.fields == ("run_ids",), other.markdown
    assert "already" in other.markdown and "Nothing was launched" in other.markdown, other.markdown
    assert len(hub.job_posts()) == posts and _cancels(hub) == []
    assert {hub.jobs[job_id].stage for job_id in jobs} == {"RUNNING"}
    record = json.loads(hub.buckets["alice/grpo-runs"].files[f"sweeps/{shown.sweep_id}.json"].data)
    assert (record["state"], record["review_code"]) == ("launched", shown.fingerprint), record


def test_a_sweep_launch_failing_half_way_cancels_only_the_jobs_it_submitted(hub, make_panel, monkeypatch):
    """A member's trainer submission fails (the Hub creates the job and answers 504): the launch cancels the fleet's
    replicas and the members' trainers it submitted, and the job the failed answer created (found by the member's
    label, created since the launch began), and nothing else: stand-ins of an earlier launch carrying the fleet's
    and that member's labels keep running, also through the panel's background sweep of failed launches."""
    from backend.plan.jobspec import JobSpec, VolumeSpec

    panel = make_panel(budget_check_s=0)          # its background pass is run by hand below
    shown = panel.preview(SWEEP_FORM, sweep=SWEEP)
    registry = panel.runs.hub_registry(ALICE, "alice")
    registry.store_for("alice/grpo-runs").ensure_bucket()

    def earlier(run_id: str, role: str) -> str:
        job = JobSpec(run_id=run_id, role=role, image="img", command=["sleep", "1"], flavor="cpu-basic",
                      timeout_s=3600, volumes=(VolumeSpec("alice/grpo-runs", "/bucket"),))    # the run's labels
        job_id = registry.executor.submit(job)
        hub.set_stage(job_id, "RUNNING")
        return job_id

    hub.clock = lambda: time.time() - 600           # an earlier launch, ten minutes ago
    stand_ins = [earlier(shown.sweep_id, "vllm-0"), earlier(shown.run_ids[1], "trainer")]
    hub.clock = time.time
    # The stand-ins' ids name runs, so a launch now refuses these ids (one run id, one run: issue 46); they stand for
    # jobs of the same labels that the launch's id check could not see (the Hub lists new jobs late).
    monkeypatch.setattr(panel.operations, "sweep_ids_taken", lambda *args: [])
    # Job posts: the two stand-ins, the fleet's two replicas, m0's trainer, then m1's: created, answered 504.
    hub.create_then_fail_nth_job_submission(6, status=504)
    result = panel.launch(SWEEP_FORM, confirmed=shown.fingerprint,
                          sweep=replace(SWEEP, sweep_id=shown.sweep_id, run_ids=shown.run_ids))
    assert result.run_id is None and not result.run_ids, result.message
    assert f"member m1 (run {shown.run_ids[1]}) did not launch" in result.message, result.message
    assert "Cancelled what this launch had started" in result.message and "its fleet" in result.message
    own = [job.id for job in hub.jobs.values() if job.id not in stand_ins]
    assert len(own) == 4, own                       # 2 replicas, m0's trainer, m1's trainer behind the 504
    wait_until(lambda: {hub.jobs[job_id].stage for job_id in own} == {"CANCELED"},
               what=f"every job of the failed launch cancelled: {[hub.jobs[j].stage for j in own]}")
    assert sorted(_cancels(hub)) == sorted(own), "cancelled by the ids it submitted, nothing found by label alone"
    panel.watch.sweep_failed_launches()             # the background pass sweeping m1's label again
    assert [hub.jobs[job_id].stage for job_id in stand_ins] == ["RUNNING", "RUNNING"], \
        "the earlier launch's jobs with the same labels keep running"
    record = json.loads(hub.buckets["alice/grpo-runs"].files[f"sweeps/{shown.sweep_id}.json"].data)
    assert record["state"] == "failed" and "did not launch" in record["why"], record
    retry = panel.launch(SWEEP_FORM, confirmed=shown.fingerprint,
                         sweep=replace(SWEEP, sweep_id=shown.sweep_id, run_ids=shown.run_ids))
    assert retry.run_id is None and "its launch failed" in retry.message, retry.message
    assert len(hub.jobs) == 6 and [hub.jobs[j].stage for j in stand_ins] == ["RUNNING", "RUNNING"]


def test_a_run_launched_twice_answers_the_same_run_and_another_spec_under_its_id_is_refused(hub, make_panel):
    """A second launch of a run id with the same reviewed spec: while the first request still submits, it answers
    that the run is being launched; afterwards, with the run and its job; either way it submits nothing. A spec of
    other settings under that id stays refused, saying why."""
    import threading

    panel = make_panel()
    shown = panel.preview(FORM)
    arrived, release = hub.hold_nth_job_submission(1)
    first = []
    thread = threading.Thread(target=lambda: first.append(
        panel.launch(FORM, confirmed=shown.fingerprint, run_id=shown.run_id)))
    thread.start()
    try:
        wait_until(arrived.is_set, 120, what="the first launch's submission")
        during = panel.launch(FORM, confirmed=shown.fingerprint, run_id=shown.run_id)
    finally:
        release.set()
        thread.join(60)
    assert during.already and during.run_id == shown.run_id, during.message
    assert "is being launched by an earlier request" in during.message, during.message
    [launched] = first
    assert launched.run_id == shown.run_id and not launched.already, launched.message
    [job] = hub.jobs.values()
    hub.set_stage(job.id, "RUNNING")

    again = panel.launch(FORM, confirmed=shown.fingerprint, run_id=shown.run_id)
    assert again.already and again.run_id == shown.run_id and job.id in again.message, again.message
    assert "was launched already" in again.message, again.message
    other = panel.preview({**FORM, "max_steps": 7}, run_id=shown.run_id)
    refused = panel.launch({**FORM, "max_steps": 7}, confirmed=other.fingerprint, run_id=shown.run_id)
    assert refused.run_id is None and f"run id {shown.run_id} is already used" in refused.message, refused.message
    assert "other settings" in refused.message and "Preview again for a new run id" in refused.message
    assert len(hub.job_posts()) == 1 and _cancels(hub) == [] and job.stage == "RUNNING"
    spec = json.loads(hub.buckets["alice/grpo-runs"].files[f"runs/{shown.run_id}/spec.json"].data)
    assert spec["max_steps"] != 7, "the first run's files are as it launched them"


def test_a_job_the_hub_created_behind_a_timeout_is_found_by_label_and_cancelled(hub, make_panel):
    panel = make_panel()
    hub.create_then_fail_nth_job_submission(2, status=504)
    result, _ = launch_reviewed(panel, {**FORM, "mode": "distributed", "replicas": 2, "vllm_flavor": "l4x1"})
    assert result.run_id is None and "created 1 job(s) anyway" in result.message, result.message
    assert len(hub.jobs) == 2
    assert {job.stage for job in hub.jobs.values()} == {"CANCELED"}, "no job of the failed launch keeps billing"


def test_a_run_the_hub_stopped_at_its_timeout_reads_timed_out_in_the_runs_list(hub, make_panel):
    result, _ = launch_reviewed(make_panel(), {**FORM, "timeout_minutes": 30})
    assert result.run_id, result.message
    [job] = hub.jobs.values()
    hub.set_stage(job.id, "RUNNING")
    hub.clock = lambda: time.time() + 31 * 60            # the Hub's time passes the job's 30 minutes
    row = next(r for r in make_panel().runs_table() if r[0] == result.run_id)
    assert (job.stage, job.message) == ("ERROR", "Job timeout"), "the Hub's own words for a timeout"
    assert row[RUNS_HEADERS.index("status")] == "✗ timed out", row


def test_a_job_created_behind_a_timeout_that_the_list_shows_late_is_found_and_cancelled(hub, make_panel):
    """The Hub answers the submission with a 504 yet creates the job, and its job list shows it 5 s later: the
    launch's own sweep finds nothing, so the orphan finder and the panel's background sweep must."""
    from panel import spend_view

    panel = make_panel(budget_check_s=0)             # its background check is run by hand below
    hub.list_lag_s = 5.0
    hub.create_then_fail_nth_job_submission(1, status=504)
    result, _ = launch_reviewed(panel, FORM)
    assert result.run_id is None and "keeps looking" in result.message, result.message
    [job] = hub.jobs.values()
    assert job.stage == "SCHEDULING", "created, and not listed yet"
    assert panel.watch.check() == [] and job.stage == "SCHEDULING", "nothing to sweep while the list lags"
    finder = make_panel(budget_check_s=0)            # a second panel (or this one after a restart), asked by a click
    rows, note = wait_until(lambda: (found := spend_view.orphan_rows(finder, Visitor()))[0] and found, timeout=20,
                            interval=0.5, what="the orphan finder listing the job")
    [row] = rows
    assert row[0] == job.id and "launch failed" in row[6], (rows, note)
    panel.watch.check()                              # the launching panel's next background pass
    assert job.stage == "CANCELED", "the job the failed launch created is cancelled"


def test_parallelism_larger_than_the_flavor_is_refused(hub, make_panel):
    panel = make_panel()
    result = panel.launch({**FORM, "num_processes": 4, "per_device_batch_size": 8}, confirmed="x")
    assert result.run_id is None and "has 1 GPU(s)" in result.message and hub.job_posts() == []


def test_org_members_share_a_run_and_an_outsider_reaches_none_of_it(hub, make_panel):
    panel = make_panel(on_space=True)
    bob, alice, carol = Visitor(BOB, "bob"), Visitor(ALICE, "alice"), Visitor(CAROL, "carol")
    assert panel.runs_table(bob) == []            # bob lists first: his listing must not claim the org's runs
    form = {**FORM, "bucket": "acme/grpo-runs"}
    result, _ = launch_reviewed(panel, form, alice)
    run_id = result.run_id
    assert run_id, result.message
    assert run_id in [row[0] for row in panel.runs_table(bob)]
    assert panel.view(run_id, bob).run_id == run_id and panel.view(run_id, alice).run_id == run_id
    assert run_id not in [row[0] for row in panel.runs_table(carol)]
    with pytest.raises(KeyError):
        panel.view(run_id, carol)
    assert "Not cancelled" in panel.cancel(run_id, carol) and "Not cancelled" in panel.cancel(run_id, None)
    assert {job.stage for job in hub.run_jobs.values()} == {"SCHEDULING"}
    assert "Cancel requested for 1 job(s)" in panel.cancel(run_id, bob), "a member with write access may cancel"
    assert {job.stage for job in hub.run_jobs.values()} == {"CANCELED"}
    cancels = [r for r in hub.requests if r.path.endswith("/cancel")]
    assert [r.user for r in cancels] == ["bob"], "the Hub sees bob's own token, not the launcher's"


def test_cancel_needs_only_the_job_labels_when_the_bucket_cannot_be_read(hub, make_panel):
    result, _ = launch_reviewed(make_panel(), {**FORM, "mode": "distributed", "replicas": 2, "vllm_flavor": "l4x1"})
    assert result.run_id
    hub.bucket_read_error = 500                   # spec.json unreadable: a failing bucket, after a restart
    restarted = make_panel()
    message = restarted.cancel(result.run_id)
    assert "Cancel requested for 3 job(s)" in message, message
    assert {job.stage for job in hub.run_jobs.values()} == {"CANCELED"}


def test_resume_on_hf_jobs_is_previewed_and_confirmed_like_a_launch(hub, make_panel):
    panel = make_panel()
    result, _ = launch_reviewed(panel, FORM)
    run_id = result.run_id
    panel.cancel(run_id)
    hub.put_file("alice/grpo-runs", f"runs/{run_id}/checkpoints/checkpoint-50/trainer_state.json", b"{}")
    panel.view(run_id).refresh()
    posts = len(hub.job_posts())
    message = panel.resume(run_id)
    assert "Not resumed yet" in message and "resumes from checkpoint-50" in message and "Estimated cost" in message
    assert len(hub.job_posts()) == posts, "nothing is resubmitted unreviewed"
    shown = panel.resume_preview(run_id)
    assert "Resumed run" in panel.resume(run_id, confirmed=shown.fingerprint)
    assert len(hub.job_posts()) == posts + 1


def test_a_run_longer_than_the_visitors_token_lives_is_refused(hub, make_panel):
    panel = make_panel(on_space=True)
    soon = Visitor(ALICE, "alice", expires_at=time.time() + 3600)
    form = {**FORM, "mode": "distributed", "replicas": 1, "vllm_flavor": "l4x1", "timeout_minutes": 240}
    shown = panel.preview(form, soon)
    assert "token expires in 1.0 h" in shown.markdown
    result = panel.launch(form, soon, confirmed=shown.fingerprint)
    assert result.run_id is None and "lower the timeout to at most 59 minutes" in result.message
    assert hub.job_posts() == []


def test_a_panel_reachable_from_other_machines_lends_no_token_unless_the_operator_opts_in(hub, make_panel):
    exposed = make_panel(host="0.0.0.0")
    result = exposed.launch(FORM, confirmed=exposed.preview(FORM).fingerprint)
    assert result.run_id is None and "GRPO_PANEL_AUTH" in result.message and hub.job_posts() == []
    assert exposed.runs_table() == [] or all(row[EXECUTOR] == "local" for row in exposed.runs_table())
    opted_in = make_panel(host="0.0.0.0", allow_host_token=True)
    assert launch_reviewed(opted_in, FORM)[0].run_id


def test_a_token_typed_into_the_form_is_refused_and_never_echoed(hub, make_panel):
    panel = make_panel()
    for form in ({**FORM, "bucket": f"alice/{PLANTED}"}, {**FORM, "name": f"run_{PLANTED}"},
                 {**FORM, "max_steps": PLANTED}):
        shown = panel.preview(form)
        assert shown.fingerprint is None and PLANTED not in shown.markdown, shown.markdown
        result = panel.launch(form, confirmed="x")
        assert result.run_id is None and PLANTED not in result.message
    assert hub.job_posts() == [] and not hub.buckets


def test_an_idle_visitors_registry_is_dropped_and_rebuilt_on_their_return(hub, make_panel):
    panel = make_panel(on_space=True)
    alice, bob = Visitor(ALICE, "alice"), Visitor(BOB, "bob")
    result, _ = launch_reviewed(panel, FORM, alice)
    run_id = result.run_id
    view = panel.view(run_id, alice)
    view.refresh()                                  # starts alice's log reader
    executor = view.executor
    panel.settings.registry_idle_s = 0.0            # everything not used this instant is idle
    panel.runs_table(bob)                           # bob's visit sweeps alice's registry away
    assert executor._stopping.is_set(), "the dropped registry's log readers are told to stop"
    panel.settings.registry_idle_s = 3600.0
    again = panel.view(run_id, alice)
    assert again.run_id == run_id and again is not view, "alice's run comes back from the Hub's job list"


def test_the_same_form_launches_a_distributed_run_on_hf_jobs(hub, make_panel):
    hub.expose_url_format = "https://{job_id}-p{port}.jobs.example"    # the URL the Hub reports wins
    panel = make_panel()
    # The published recipe's exposed ports (the private network group is test_platform.py's). An l4x4 replica job
    # runs one vLLM server on each of its 4 GPUs (servers_per_gpu 1), each on its own exposed port.
    form = {**FORM, "mode": "distributed", "replicas": 2, "vllm_flavor": "l4x4", "max_staleness": 2,
            "network": "exposed"}
    result, _ = launch_reviewed(panel, form)
    run_id = result.run_id
    assert run_id, result.message
    replicas, trainer = hub.job_posts()[:2], hub.job_posts()[2]
    assert [p.json["labels"]["grpo-panel-role"] for p in hub.job_posts()] == ["vllm-0", "vllm-1", "trainer"]
    for post in replicas:
        body = post.json
        assert body["flavor"] == "l4x4" and body["expose"]["ports"] == [8000, 8001, 8002, 8003]
        assert [(v["mountPath"], v["readOnly"]) for v in body["volumes"]] == [("/bucket", True)]
        assert "--max-loras 4" in body["command"][-1] and "runtime.serving.serve_replica" in body["command"][-1]
    replica_ids = [panel.view(run_id).jobs[f"vllm-{i}"].job_id for i in range(2)]
    urls = trainer.json["environment"]["VLLM_REPLICA_URLS"].split(",")
    assert urls == [f"https://{job_id}-p{port}.jobs.example" for job_id in replica_ids for port in range(8000, 8004)]
    assert [(v["mountPath"], v.get("readOnly", False)) for v in trainer.json["volumes"]] == [("/bucket", False)]
    assert "runtime.trainer.train_async" in trainer.json["command"][-1]


def test_local_runs_on_a_space_belong_to_its_owner_when_turned_on(hub, make_panel):
    panel = make_panel(on_space=True, local_runs="owner", space_owner="acme")
    tiny = {"executor": "local", "max_steps": 1}
    refused = panel.launch(tiny, Visitor(CAROL, "carol"))
    assert refused.run_id is None and "belong to its owner (acme)" in refused.message
    assert panel.launch(tiny, None).run_id is None
    assert panel.local.list_jobs() == []
    assert all(row[EXECUTOR] != "local" for row in panel.runs_table(Visitor(CAROL, "carol")))
    from backend.runs.access import local_runs_problem

    assert local_runs_problem(Visitor(BOB, "bob"), panel.settings) is None, "a member of the owning org may"


def test_the_hubs_job_status_message_is_masked_in_the_header_the_alert_events_and_the_webhook(hub, make_panel):
    """The Hub's own status words can quote a job's command or output: every token shape is masked wherever the
    message goes."""
    from backend.runtime import layout

    panel = make_panel()
    result, _ = launch_reviewed(panel, FORM)
    view = panel.view(result.run_id)
    job_id = view.jobs["trainer"].job_id
    hub.set_stage(job_id, "ERROR", message=f"Job failed: exit code 1 (HF_TOKEN={PLANTED}; hf_oauth_{'Q' * 30})")
    sent = []
    wait_until(lambda: (view.refresh() or True) and view.jobs["trainer"].status.stage == "ERROR", timeout=15)
    frame = dashboard.build_frame(view)
    assert "exit code 1" in frame.status and PLANTED not in frame.status and "Q" * 30 not in frame.status
    book = AlertBook(view.store, result.run_id, "http://127.0.0.1:9/hook", send=lambda url, text, alert:
                     sent.append((text, alert.message)))
    fired = book.update(view)
    assert fired, "a failed job raises an alert"
    wait_until(lambda: sent, timeout=5)
    events = b"".join(hub.buckets["alice/grpo-runs"].files[p].data for p in hub.buckets["alice/grpo-runs"].files
                      if p.startswith(f"runs/{result.run_id}/{layout.EVENTS_DIR}/")).decode()
    assert "exit code 1" in events + repr(sent)
    for where in (events, repr(sent)):
        assert PLANTED not in where and "Q" * 30 not in where


def test_every_token_shape_is_masked_in_the_job_status_the_full_log_the_events_and_the_webhook(hub, make_panel):
    """Tokens of every shape the Hub has issued (hf_, hf_oauth_, api_, api-, api_org_, api-org-) in a job's status
    message, its log, and an event a job wrote raw into the bucket (in its keys too): none reaches the header, the
    full-log download, the alert events or the webhook."""
    from backend.runtime import layout

    panel = make_panel()
    result, _ = launch_reviewed(panel, FORM)
    run_id = result.run_id
    view = panel.view(run_id)
    job_id = view.jobs["trainer"].job_id
    every = " ".join(TOKEN_SHAPES)
    hub.append_logs(job_id, f"step 1/500 printed {every}", *[f"MYVAR_{t}_x leaked" for t in TOKEN_SHAPES])
    hub.put_file("alice/grpo-runs", f"runs/{run_id}/{layout.EVENTS_DIR}/trainer-000000.jsonl", (json.dumps(
        {"time": 1.0, "event": "alert", "kind": "stall", "key": "stall", "message": f"stuck {every}",
         TOKEN_SHAPES[2]: TOKEN_SHAPES[3]}) + "\n").encode())
    hub.set_stage(job_id, "ERROR", message=f"Job failed: exit code 1 ({every})")
    wait_until(lambda: (view.refresh() or True) and view.jobs["trainer"].status.stage == "ERROR"
               and len(view.jobs["trainer"].logs) >= 1 + len(TOKEN_SHAPES), timeout=15)
    sent = []
    book = AlertBook(view.store, run_id, "http://127.0.0.1:9/hook", send=lambda url, text, alert:
                     sent.append((text, alert.message)))
    assert book.update(view), "a failed job raises an alert"
    wait_until(lambda: sent, timeout=5)
    frame = dashboard.build_frame(view)
    events = b"".join(f.data for p, f in hub.buckets["alice/grpo-runs"].files.items()
                      if p.startswith(f"runs/{run_id}/{layout.EVENTS_DIR}/panel")).decode()
    full_log = open(panel.full_log_file(run_id, "trainer")).read()
    sinks = {"job status": frame.status, "log pane": dashboard.log_text(view, "trainer"), "full log": full_log,
             "events read": json.dumps(view.events), "alert events written": events, "webhook": repr(sent)}
    assert "exit code 1" in frame.status and "step 1/500" in full_log and events and sent
    for where, text in sinks.items():
        for token in TOKEN_SHAPES:
            assert token not in text, (where, token)


def _hint(client) -> str:
    """The line above the runs list, as the page's filter (Enter in its box) answers it through Gradio."""
    answer = client.predict("", "all", api_name="/on_filter")
    texts = [value for value in answer if isinstance(value, str)]
    assert len(texts) == 1, answer      # the other outputs: the table and the pickers' choices
    return texts[0]


@pytest.mark.fake_hub(users={CAROL: FakeUser("carol")})     # one namespace: one listing to fail
@pytest.mark.panel_settings(hub_list_every_s=1.0)           # asked again after 1 s, not 15: the same path, sooner
def test_a_jobs_listing_the_hub_refuses_or_cannot_answer_says_what_failed_and_what_to_do(hub, make_panel,
                                                                                          monkeypatch):
    from huggingface_hub.utils import _pagination, close_session

    from tests.helpers import served

    # The client still retries a dead connection as often as it does for a user (5 times), with short waits between
    # (1+2+4+8+8 s otherwise): what is checked is the panel's answer once the client gives up, not its patience.
    monkeypatch.setattr(_pagination, "http_backoff", functools.partial(_pagination.http_backoff,
                                                                       base_wait_time=0.05, max_wait_time=0.2))
    hub.list_error = 403
    with served(make_panel()) as client:
        hint = _hint(client)        # no error toast: the answer came back
        assert "Could not list your runs on Hugging Face Jobs: the Hub refused the token (HTTP 403)" in hint
        assert "Sign in again" in hint and "Runs on this machine are listed as usual" in hint
        assert "httpx" not in hint.lower() and "Internal Error" not in hint and hub.token not in hint, hint
        hub.list_error = None       # the Hub answers again: the line goes at the next listing (1 s here)
        wait_until(lambda: _hint(client) == "", timeout=60, interval=1, what="the hint to go")
    hub.stop()      # the Hub down: a new panel's first listing finds nobody there
    # The stopped fake accepts no connection, but its handler threads would still answer the client's kept-alive
    # ones, which a Hub that went down would have dropped: the client's pool goes too.
    close_session()
    with served(make_panel()) as client:
        hint = _hint(client)
        assert "Could not list your runs on Hugging Face Jobs: the Hub did not answer" in hint, hint
        assert "network connection" in hint and "status.huggingface.co" in hint and hub.token not in hint
