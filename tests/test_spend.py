"""Live cost, the budget cap and the orphan finder, against the loopback fake Hub through the real client.

The fake Hub's clock and the panel's are one fake clock, so spend and projection are exact: the prices are the
fake's hardware list (l4x1 $0.013333/min -> $0.80/h, a10g-small $0.016667/min -> $1.00/h).
"""

import json
from dataclasses import replace

import pytest

from backend.plan.cost import running_interval, spend_curve
from backend.plan.jobspec import JobRecord
from backend.plan.spec import RunSpec
from backend.runs.access import Visitor
from backend.runs.operations import SweepForm
from panel import spend_view
from panel.actions import Panel
from panel.runs_list import RUNS_HEADERS
from tests.fakehub import FakeHub, FakeUser
from tests.helpers import launch_reviewed

ALICE = "hf_oauth_aliceSpendToken0000000000"
DAVE = "hf_oauth_daveReadsAcme000000000000"
T0 = 1_800_000_000.0
FORM = {"executor": "hf_jobs", "model": "Qwen/Qwen2.5-0.5B-Instruct", "dataset": "trl-lib/DeepMath-103K",
        "bucket": "alice/grpo-runs", "flavor": "a10g-small", "rewards": ["format"], "max_steps": 100}
DISTRIBUTED = {**FORM, "mode": "distributed", "replicas": 2, "vllm_flavor": "l4x1"}
SWEEP = SweepForm((("learning_rate", "1e-4, 5e-4"),))


class FakeClock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock():
    return FakeClock(T0)


pytestmark = [pytest.mark.integration, pytest.mark.fake_hub(users={ALICE: FakeUser("alice", {"acme": "write"}),
                                          DAVE: FakeUser("dave", {"acme": "read"})}),
              pytest.mark.panel_settings(budget_check_s=0)]   # no enforcer thread: tests call enforce_budgets()


@pytest.fixture
def hub(hub, clock):
    """The shared fake Hub, on the fake clock."""
    hub.clock = clock
    return hub


@pytest.fixture
def make_panel(make_panel, clock):
    """The shared panel factory, each panel's spend on the fake clock."""
    def on_the_clock(**settings):
        panel = make_panel(**settings)
        panel.spend.clock = clock
        return panel

    return on_the_clock


def launch(panel: Panel, form: dict, visitor=None) -> str:
    result, _ = launch_reviewed(panel, form, visitor)
    assert result.run_id, result.message
    return result.run_id


def jobs_of(hub: FakeHub, run_id: str) -> dict:
    return {j.spec["labels"]["grpo-panel-role"]: j for j in hub.jobs.values()
            if j.spec["labels"]["grpo-panel-run"] == run_id}


def log_steps(hub: FakeHub, run_id: str, steps: range, start: float, every_s: float, bucket="alice/grpo-runs"):
    """The trainer's metric fragment: one record per step, `every_s` apart from `start`."""
    records = [{"step": s, "time": start + every_s * s, "reward": 0.01 * s} for s in steps]
    hub.put_file(bucket, f"runs/{run_id}/metrics/trainer-000000.jsonl",
                 "".join(json.dumps(r) + "\n" for r in records).encode())


def run_for(hub: FakeHub, clock: FakeClock, run_id: str, at: dict[str, float]) -> None:
    """Start each role's job at its time (fake clock)."""
    for role, t in sorted(at.items(), key=lambda kv: kv[1]):
        clock.t = t
        hub.set_stage(jobs_of(hub, run_id)[role].id, "RUNNING")


def test_spend_and_projection_are_exact_with_a_fake_clock_and_the_hubs_prices(hub, make_panel, clock):
    panel = make_panel()
    run_id = launch(panel, DISTRIBUTED)
    run_for(hub, clock, run_id, {"vllm-0": T0 + 60, "vllm-1": T0 + 60, "trainer": T0 + 120})
    log_steps(hub, run_id, range(1, 11), start=T0 + 120, every_s=6.0)    # 1/6 step per second
    clock.t = T0 + 720
    registry = panel.runs.find(run_id, Visitor())
    registry.forget_listing()

    prices = panel.spend.prices(registry)
    assert prices["l4x1"] == 0.8 and prices["a10g-small"] == 1.0
    cost, spec = panel.spend.cost(registry, run_id)
    spent = (2 * 660 * 0.8 + 600 * 1.0) / 3600      # two replicas 660 s, the trainer 600 s
    assert cost.spent_usd == pytest.approx(spent, rel=1e-12) and spent == pytest.approx(0.46)
    assert cost.usd_per_step == pytest.approx(spent / 10, rel=1e-12)
    assert cost.steps_per_s == pytest.approx(1 / 6, rel=1e-12)
    assert cost.eta_s == pytest.approx(90 * 6, rel=1e-12)                # 90 steps left
    assert cost.burn_usd_per_h == pytest.approx(2.6, rel=1e-12)
    assert cost.projected_usd == pytest.approx(spent + 540 * 2.6 / 3600, rel=1e-12)   # $0.85
    assert spec["budget_usd"] == 0.0 and cost.elapsed_s == 720

    view = panel.view(run_id)
    view.refresh()
    from_view, _, _ = spend_view.run_cost(panel, run_id, Visitor(), view)
    assert from_view.projected_usd == pytest.approx(cost.projected_usd, rel=1e-12), "the dashboard agrees"
    header = spend_view.cost_markdown(from_view, 0.0, view.events)
    assert "$0.460 spent ($0.046/step)" in header and "projected $0.850 at step 100 (ETA 9 min 00 s" in header
    [row] = [r for r in panel.runs_table() if r[0] == run_id]
    assert row[RUNS_HEADERS.index("time · cost")] == "$0.460 → $0.850 · ETA 9 min"
    assert row[2:5] == ["● running", "█░░░░░░░░░ 10/100", "0.100"], row

    cost_at = spend_curve(registry.job_records(run_id), prices, clock.t)
    assert cost_at(T0 + 60) == 0.0
    assert cost_at(T0 + 120) == pytest.approx(2 * 60 * 0.8 / 3600, rel=1e-12)
    assert cost_at(clock.t) == pytest.approx(spent, rel=1e-12)


def test_durations_alone_give_the_running_time_and_a_job_that_never_ran_costs_nothing():
    running = JobRecord("j", "r", "trainer", "RUNNING", T0, flavor="l4x1", running_s=300, listed_at=T0 + 400)
    assert running_interval(running, T0 + 460) == (T0 + 100, T0 + 460)
    ended = JobRecord("j", "r", "trainer", "COMPLETED", T0, flavor="l4x1", started_at=T0 + 10, running_s=50)
    assert running_interval(ended, T0 + 999) == (T0 + 10, T0 + 60)
    assert running_interval(JobRecord("j", "r", "trainer", "CANCELED", T0, flavor="l4x1"), T0 + 9) is None


def test_a_budget_on_a_local_run_is_refused_and_the_preview_names_the_cap(hub, make_panel):
    assert [e.field for e in RunSpec(budget_usd=5).validate()] == ["budget_usd"]
    assert [e.field for e in RunSpec(budget_usd=float("nan")).validate()] == ["budget_usd"]
    panel = make_panel()
    refused = panel.preview({"executor": "local", "budget_usd": 5})
    assert refused.fingerprint is None and "**budget_usd**: local runs cost nothing" in refused.markdown
    shown = panel.preview({**FORM, "budget_usd": 2.5})
    assert "Budget cap **$2.50**" in shown.markdown
    assert shown.fingerprint != panel.preview({**FORM, "budget_usd": 3}).fingerprint, "a new cap needs a new review"


def test_the_cap_cancels_every_job_of_a_distributed_run_and_survives_a_panel_restart(hub, make_panel, clock):
    first = make_panel()
    run_id = launch(first, {**DISTRIBUTED, "budget_usd": 0.5})
    run_for(hub, clock, run_id, {"vllm-0": T0, "vllm-1": T0, "trainer": T0})
    clock.t = T0 + 300                                 # $0.217 spent, no step logged: no projection yet
    assert first.watch.enforce_budgets() == []
    assert {j.stage for j in jobs_of(hub, run_id).values()} == {"RUNNING"}
    first.shutdown()

    clock.t = T0 + 700                                 # 700 s x $2.60/h = $0.506: past the cap
    restarted = make_panel()
    [stop] = restarted.watch.enforce_budgets()
    assert stop.run_id == run_id and "its spend, $0.506, reached the budget cap of $0.50" in stop.reason
    assert sorted(stop.cancelled) == sorted(j.id for j in jobs_of(hub, run_id).values())
    assert {j.stage for j in jobs_of(hub, run_id).values()} == {"CANCELED"}, "every job of the run stops"
    assert spend_view.orphan_rows(restarted, Visitor())[0] == [], "no orphan is left billing"

    files = hub.buckets["alice/grpo-runs"].files
    [event_path] = [p for p in files if p.startswith(f"runs/{run_id}/events/panel-budget-")]
    event = json.loads(files[event_path].data)
    assert event["event"] == "budget_cap" and len(event["cancelled"]) == 3 and event["budget_usd"] == 0.5
    view = restarted.view(run_id)
    view.refresh()
    cost, spec, _ = spend_view.run_cost(restarted, run_id, Visitor(), view)
    header = spend_view.cost_markdown(cost, spec["budget_usd"], view.events)
    assert "Budget cap reached:** the panel cancelled 3 job(s)" in header and "$0.506 spent" in header

    cancels = len([r for r in hub.requests if r.path.endswith("/cancel")])
    assert restarted.watch.enforce_budgets() == [], "a run that is over is not stopped again"
    late = make_panel()     # a second panel that decided a moment before the first acted: harmless
    registry = late.runs.find(run_id, Visitor())
    again = late.spend.stop(registry, run_id, "alice/grpo-runs", "late", cost, 0.5)
    assert again.cancelled == [] and len([r for r in hub.requests if r.path.endswith("/cancel")]) == cancels
    assert [p for p in files if "panel-budget-" in p] == [event_path], "the event is written once"
    posts = len(hub.job_posts())
    for answer in (restarted.resume_preview(run_id).markdown, restarted.resume(run_id, confirmed="any")):
        # The refusal's words are escaped as Markdown (panel/markdown.py escapes `$`): compared as they render.
        assert "has already spent $0.506 of its budget cap $0.50" in answer.replace("\\$", "$"), answer
    assert len(hub.job_posts()) == posts, "a capped run is not resumed into an instant cancel"


def test_a_projection_past_the_cap_stops_the_run_before_it_spends_it(hub, make_panel, clock):
    panel = make_panel()
    run_id = launch(panel, {**DISTRIBUTED, "budget_usd": 0.8})
    run_for(hub, clock, run_id, {"vllm-0": T0 + 60, "vllm-1": T0 + 60, "trainer": T0 + 120})
    log_steps(hub, run_id, range(1, 11), start=T0 + 120, every_s=6.0)
    clock.t = T0 + 720                                 # $0.46 spent, $0.85 projected at step 100
    [stop] = panel.watch.enforce_budgets()
    assert "its projected total at step 100, $0.850 (ETA 9 min 00 s" in stop.reason and "$0.460 spent" in stop.reason
    assert {j.stage for j in jobs_of(hub, run_id).values()} == {"CANCELED"}


def test_orphans_left_running_after_their_run_ended_are_listed_and_cancelled(hub, make_panel, clock):
    panel = make_panel()
    ended = launch(panel, DISTRIBUTED)
    gone = launch(panel, FORM)
    live = launch(panel, FORM)
    run_for(hub, clock, ended, {"vllm-0": T0, "vllm-1": T0, "trainer": T0})
    run_for(hub, clock, gone, {"trainer": T0})
    run_for(hub, clock, live, {"trainer": T0})
    hub.set_stage(jobs_of(hub, ended)["trainer"].id, "COMPLETED")      # its replicas did not stop
    bucket = hub.buckets["alice/grpo-runs"]
    for path in [p for p in bucket.files if p.startswith(f"runs/{gone}/")]:
        del bucket.files[path]                                          # the run's folder was deleted

    rows, note = spend_view.orphan_rows(panel, Visitor())
    orphans = {r[0]: r for r in rows}
    expected = {jobs_of(hub, ended)["vllm-0"].id, jobs_of(hub, ended)["vllm-1"].id, jobs_of(hub, gone)["trainer"].id}
    assert set(orphans) == expected and "3 job(s) still running" in note
    assert "trainer" in orphans[jobs_of(hub, ended)["vllm-0"].id][6] and "COMPLETED" in orphans[
        jobs_of(hub, ended)["vllm-0"].id][6]
    assert f"runs/{gone} is gone" in orphans[jobs_of(hub, gone)["trainer"].id][6]
    assert orphans[jobs_of(hub, ended)["vllm-1"].id][5] == "0.80", "what each orphan costs per hour"

    reader = spend_view.cancel_all_orphans(panel, Visitor(DAVE, "dave"))
    assert "Cancel requested for 0 orphan job(s)" in reader
    assert {jobs_of(hub, r)["trainer"].stage for r in (gone, live)} == {"RUNNING"}, "nothing cancelled by a reader"

    message = spend_view.cancel_all_orphans(panel, Visitor())
    assert "Cancel requested for 3 orphan job(s)" in message
    assert {hub.jobs[j].stage for j in expected} == {"CANCELED"}
    assert jobs_of(hub, live)["trainer"].stage == "RUNNING" and jobs_of(hub, ended)["trainer"].stage == "COMPLETED"
    assert spend_view.orphan_rows(panel, Visitor())[0] == []


def test_orphans_in_a_namespace_the_visitor_only_reads_are_shown_but_not_cancelled(hub, make_panel, clock):
    panel = make_panel(on_space=True)
    run_id = launch(panel, {**FORM, "bucket": "acme/grpo-runs"}, Visitor(ALICE, "alice"))
    run_for(hub, clock, run_id, {"trainer": T0})
    for path in [p for p in hub.buckets["acme/grpo-runs"].files if p.startswith(f"runs/{run_id}/")]:
        del hub.buckets["acme/grpo-runs"].files[path]
    dave = Visitor(DAVE, "dave")
    rows, _ = spend_view.orphan_rows(panel, dave)
    assert [r[1] for r in rows] == [run_id]
    message = spend_view.cancel_all_orphans(panel, dave)
    assert "Not cancelled: HF Jobs in acme: You have read-only access to acme" in message
    assert jobs_of(hub, run_id)["trainer"].stage == "RUNNING"
    assert "Sign in" in spend_view.cancel_all_orphans(panel, Visitor())


def launch_sweep(panel: Panel, form: dict, sweep: SweepForm):
    """Preview the sweep, then launch exactly what was previewed; the launch's answer and the preview."""
    shown = panel.preview(form, sweep=sweep)
    assert shown.fingerprint, shown.markdown
    result = panel.launch(form, confirmed=shown.fingerprint,
                          sweep=replace(sweep, sweep_id=shown.sweep_id, run_ids=shown.run_ids))
    assert result.run_ids == shown.run_ids, result.message
    return result, shown


def test_a_sweeps_cap_cancels_every_member_and_the_fleet_once_their_spend_together_reaches_it(hub, make_panel, clock):
    """One cap over the sweep: two members' trainers (a10g-small, $1.00/h each) and the shared fleet's two replicas
    (l4x1, $0.80/h each), $3.60/h together. No member's own spend comes near it, and the fleet has no cap of its own:
    only the sweep's total stops them, all of them, from the panel's background check (no page)."""
    panel = make_panel()
    result, shown = launch_sweep(panel, DISTRIBUTED, replace(SWEEP, budget_usd="0.5"))
    assert "**Sweep budget cap $0.500:** once the spend of every member's jobs and the shared fleet's" in shown.markdown
    fleet = shown.sweep_id
    runs = [*result.run_ids, fleet]
    for run_id in runs:
        run_for(hub, clock, run_id, {role: T0 for role in jobs_of(hub, run_id)})
    clock.t = T0 + 400                                  # 400 s x $3.60/h = $0.40: under the cap
    assert panel.watch.enforce_budgets() == []
    assert {j.stage for r in runs for j in jobs_of(hub, r).values()} == {"RUNNING"}
    view = panel.view(result.run_ids[0])
    view.refresh()
    line = spend_view.cost_line(panel, result.run_ids[0], Visitor(), view)
    assert "sweep budget cap $0.500 (80% spent: $0.400, every member and the fleet)" in line, line

    clock.t = T0 + 600                                  # $0.60: past the sweep's cap
    for run_id in runs:
        panel.runs.find(run_id, Visitor()).forget_listing()
    stops = panel.watch.enforce_budgets()
    assert [s.run_id for s in stops] == runs, "the members first, then the fleet"
    assert all("reached the sweep's budget cap of $0.500" in s.reason and "$0.600" in s.reason for s in stops)
    assert {j.stage for r in runs for j in jobs_of(hub, r).values()} == {"CANCELED"}, "every member and the fleet"
    assert sorted(j for s in stops for j in s.cancelled) == sorted(j.id for r in runs for j in jobs_of(hub, r).values())
    files = hub.buckets["alice/grpo-runs"].files
    for run_id in runs:
        [path] = [p for p in files if p.startswith(f"runs/{run_id}/events/panel-budget-")]
        event = json.loads(files[path].data)
        assert event["event"] == "budget_cap" and event["budget_usd"] == 0.5 and "sweep" in event["reason"]
    assert panel.watch.enforce_budgets() == [], "a sweep that is over is not stopped again"
    assert spend_view.orphan_rows(panel, Visitor())[0] == [], "no job of the sweep is left billing"


@pytest.mark.parametrize(("budget", "says"), [
    (-1, "is 0 (none) or a positive amount in USD"),
    ("twenty", "'twenty' is not a number"),
    (float("inf"), "is 0 (none) or a positive amount in USD"),
    # 2 replicas (l4x1) and 2 trainers (a10g-small), each billed its first minute: $0.060.
    (0.05, ("$0.050 is below what launching the sweep alone costs: its 4 jobs are each billed at least a minute, "
            "$0.060 together")),
])
def test_a_bad_sweep_cap_is_refused_by_name_and_launches_nothing(hub, make_panel, budget, says):
    panel = make_panel()
    posts = len(hub.job_posts())
    sweep = replace(SWEEP, budget_usd=budget)
    shown = panel.preview(DISTRIBUTED, sweep=sweep)
    assert shown.fingerprint is None and "sweep_budget_usd" in shown.fields, shown.markdown
    assert says in shown.markdown.replace("\\$", "$"), shown.markdown
    result = panel.launch(DISTRIBUTED, confirmed="any", sweep=sweep)
    assert not result.run_ids and "sweep_budget_usd" in result.fields, result.message
    assert len(hub.job_posts()) == posts, "no job submitted"
    bucket = hub.buckets.get("alice/grpo-runs")
    assert bucket is None or not [p for p in bucket.files if p.startswith("sweeps/")], "no sweep record written"


def test_a_sweep_cap_on_this_machine_is_refused_and_the_preview_says_none_without_one(hub, make_panel):
    panel = make_panel()
    local = panel.preview({"executor": "local", "mode": "distributed"}, sweep=replace(SWEEP, budget_usd=5))
    assert local.fingerprint is None and "sweep_budget_usd" in local.fields
    assert "runs on local processes bill nothing" in local.markdown, local.markdown
    shown = panel.preview(DISTRIBUTED, sweep=SWEEP)
    assert "**Sweep budget cap:** none" in shown.markdown
    capped = panel.preview(DISTRIBUTED, sweep=replace(SWEEP, budget_usd=5, sweep_id=shown.sweep_id,
                                                      run_ids=shown.run_ids))
    assert capped.fingerprint != shown.fingerprint, "a new cap needs a new review"
