"""A sweep's shared fleet, its cost split between the members by the tokens their proxies counted.

The records are written the way a member's proxy writes them: its `Members` counts each answer's
`usage.completion_tokens` and its `StatsRecorder` writes the snapshots as `proxy-*` fragments into the member's
`metrics/` folder (only their clock is the test's, so the windows are known). Job records are written as the local
executor's wrapper writes them (job.json, process.json, exit.json), and the member's cost line (and the fleet's own
header) is read through the page's handler that draws the open run (`dashboard_view.draw`).
"""

import json
import os
from types import SimpleNamespace

import pytest

from backend.plan.cost import spend_curve
from backend.plan.jobspec import JobRecord
from backend.plan.spec import RunSpec
from backend.runs.access import Visitor
from backend.runtime import layout
from backend.runtime.serving import proxy_stats
from backend.runtime.serving.proxy_members import Members, MemberTraffic
from backend.runtime.serving.replicas import Replica
from backend.view.fleet_cost import WINDOW_S, TokenLog, fleet_split, split_by_tokens
from panel import dashboard_view, spend_view

pytestmark = pytest.mark.unit

T0 = 1_800_000_000.0 - 1_800_000_000.0 % WINDOW_S      # a window's start: the figures below are exact
SWEEP = "sweep-20260101-000000-abcdef"
BUCKET = "local/bench"
SHOWN = ("trainer", "", "step", 0.0, "latest", "")


class Proxy:
    """A member's proxy's counting and recording, as `runtime/serving/proxy.py` wires them, on the test's clock."""

    def __init__(self, metrics_dir: str, tag: str, monkeypatch, clock):
        monkeypatch.setattr(proxy_stats, "time", SimpleNamespace(time=clock, monotonic=clock))
        os.makedirs(metrics_dir, exist_ok=True)
        self.members = Members(tag)
        self.recorder = proxy_stats.StatsRecorder(metrics_dir, 1.0, 0.0)
        self.replicas = [Replica("http://127.0.0.1:1", healthy=True)]
        self.tag = tag

    def answered(self, tokens: int) -> None:
        traffic = self.members.traffic.setdefault(self.tag, MemberTraffic())
        Members.count(traffic, json.dumps({"usage": {"completion_tokens": tokens}}).encode())
        self.recorder.sample(self.replicas, force=True, members=self.members.snapshot())


class Clock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


def proxy_records(metrics_dir: str) -> list[dict]:
    out = []
    for name in sorted(os.listdir(metrics_dir), key=lambda n: int(layout.FRAGMENT_RE.match(n).group("seq"))):
        with open(os.path.join(metrics_dir, name)) as f:
            out += [json.loads(line) for line in f]
    return out


def generate(tmp_path, monkeypatch, plan: dict[str, list[tuple[float, int]]]) -> dict[str, TokenLog]:
    """Each member's proxy answers generations of so many tokens at so many seconds after T0; the token logs read
    back from the fragments the proxies wrote."""
    clock = Clock(T0)
    logs = {}
    for tag, answers in plan.items():
        folder = str(tmp_path / tag / "metrics")
        proxy = Proxy(folder, tag, monkeypatch, clock)
        for at, tokens in answers:
            clock.t = T0 + at
            proxy.answered(tokens)
        logs[tag] = TokenLog(tag)
        logs[tag].add(proxy_records(folder))
    return logs


def fleet_records(end: float | None, replicas: int = 2, flavor: str = "local") -> list[JobRecord]:
    stage = "COMPLETED" if end is not None else "RUNNING"
    return [JobRecord(f"{SWEEP}--vllm-{i}", SWEEP, f"vllm-{i}", stage, T0, flavor=flavor, bucket=BUCKET,
                      started_at=T0, finished_at=None if end is None else T0 + end) for i in range(replicas)]


SECONDS = {"local": 3600.0}


def test_the_fleet_is_split_by_the_tokens_each_members_proxy_counted(tmp_path, monkeypatch):
    logs = generate(tmp_path, monkeypatch, {"m0": [(30, 150), (90, 150), (150, 300)],
                                            "m1": [(40, 50), (100, 50), (160, 100)]})
    assert (logs["m0"].tokens, logs["m1"].tokens) == (600, 200)
    split = fleet_split(fleet_records(180.0), {"m0": ("r0", []), "m1": ("r1", [])}, logs, {}, False, T0 + 500)
    assert split.fleet_s == 360.0, "two replicas for 180 s"
    assert split.members["m0"].token_share == 0.75 and split.members["m1"].token_share == 0.25
    assert split.members["m0"].fleet_s == pytest.approx(270.0) and split.members["m1"].fleet_s == pytest.approx(90.0)
    assert split.members["m0"].fleet_usd is None, "an engine that bills nothing has no dollars to split"


def test_a_member_that_ended_early_keeps_its_share_up_to_its_end_and_pays_nothing_after(tmp_path, monkeypatch):
    # Both generate alike for the first 3 windows; m1 then ends, m0 goes on for 3 windows more.
    logs = generate(tmp_path, monkeypatch, {"m0": [(30 + 60 * k, 100) for k in range(6)],
                                            "m1": [(30 + 60 * k, 100) for k in range(3)]})
    split = fleet_split(fleet_records(360.0), {}, logs, {}, False, T0 + 400)
    assert split.members["m1"].fleet_s == pytest.approx(0.5 * 2 * 180), "half of the first 3 minutes, nothing after"
    assert split.members["m0"].fleet_s == pytest.approx(720 - 180)
    # By the whole count alone m1 would have paid a third of everything (300 of 900 tokens): it does not.
    assert split.members["m1"].token_share == pytest.approx(1 / 3)


def test_the_start_up_goes_by_all_tokens_an_idle_window_with_the_next_and_the_tail_as_the_last(tmp_path, monkeypatch):
    # One replica for 7 windows: 2 starting (no token), m0 alone, m1 alone, an idle window, both alike, idle again.
    logs = generate(tmp_path, monkeypatch, {"m0": [(150, 30), (330, 10)], "m1": [(190, 10), (340, 10)]})
    cost_at = spend_curve(fleet_records(420.0, replicas=1), SECONDS, T0 + 420)
    shares = split_by_tokens(cost_at, logs, T0, T0 + 420)
    start_up = {"m0": 120 * 40 / 60, "m1": 120 * 20 / 60}       # by every token each got: 40 and 20
    expected = {"m0": start_up["m0"] + 60 + 60 + 30, "m1": start_up["m1"] + 60 + 60 + 30}
    assert shares == pytest.approx(expected) and sum(shares.values()) == pytest.approx(420.0)


def test_no_tokens_yet_splits_nothing_and_a_member_without_tokens_gets_no_share(tmp_path, monkeypatch):
    logs = generate(tmp_path, monkeypatch, {"m0": [], "m1": []})
    split = fleet_split(fleet_records(None), {}, logs, {}, False, T0 + 120)
    assert split.members["m0"].token_share is None and split.members["m0"].fleet_s is None
    said = spend_view.fleet_markdown(split, "m0")
    assert "no member has generated tokens" in said and "240 replica-s" in said, said

    logs = generate(tmp_path / "later", monkeypatch, {"m0": [(30, 40)], "m1": []})
    split = fleet_split(fleet_records(None), {}, logs, {}, False, T0 + 120)
    assert split.members["m1"].token_share == 0.0 and split.members["m1"].fleet_s == 0.0
    assert "no tokens generated for m1 yet (40 for the other members)" in spend_view.fleet_markdown(split, "m1")


def test_a_restarted_proxy_counts_from_zero_and_the_log_keeps_what_the_one_before_counted(tmp_path, monkeypatch):
    clock = Clock(T0)
    folder = str(tmp_path / "m0" / "metrics")
    first = Proxy(folder, "m0", monkeypatch, clock)
    first.answered(500)
    clock.t += 70
    again = Proxy(folder, "m0", monkeypatch, clock)     # a retried trainer's new proxy: its counts start at 0
    again.answered(20)
    log = TokenLog("m0")
    log.add(proxy_records(folder))
    assert log.tokens == 520 and log.increments(log.windows and min(log.windows), max(log.windows)) == [500, 20]


def test_on_a_billed_engine_the_dollars_split_alike_and_the_sweep_total_adds_the_trainers(tmp_path, monkeypatch):
    logs = generate(tmp_path, monkeypatch, {"m0": [(30, 300)], "m1": [(40, 100)]})
    trainer = [JobRecord("r0--trainer", "r0", "trainer", "COMPLETED", T0, flavor="a10g-small", bucket=BUCKET,
                         started_at=T0, finished_at=T0 + 3600)]
    prices = {"l4x1": 0.8, "a10g-small": 1.0}
    split = fleet_split(fleet_records(3600.0, flavor="l4x1"), {"m0": ("r0", trainer), "m1": ("r1", [])}, logs,
                        prices, True, T0 + 4000)
    assert split.fleet_usd == pytest.approx(1.6)
    assert split.members["m0"].fleet_usd == pytest.approx(1.2) and split.members["m1"].fleet_usd == pytest.approx(0.4)
    assert split.members["m0"].own_usd == pytest.approx(1.0) and split.total_usd == pytest.approx(2.6)
    said = spend_view.fleet_markdown(split, "m0")
    assert "$1.20 of the fleet's $1.60, by tokens (75% of its generated tokens: 300 of 400)" in said, said
    assert "this trainer $1.00" in said and "sweep total $2.60" in said, said


# ---- through the page: the open member's cost line

def _job(home: str, run_id: str, role: str, start: float, end: float | None) -> None:
    from backend.runtime.job.job_wrapper import process_start_time

    job_id = f"{run_id}--{role}--000000"
    folder = os.path.join(home, "jobs", job_id)
    os.makedirs(folder, exist_ok=True)
    spec = {"run_id": run_id, "role": role, "flavor": "local",
            "volumes": [{"bucket": BUCKET, "mount_path": "/bucket", "read_only": False}]}
    _write(os.path.join(folder, "job.json"), {"job_id": job_id, "spec": spec, "created_at": start,
                                              "pid": os.getpid(), "pid_started_at": process_start_time(os.getpid())})
    _write(os.path.join(folder, "process.json"), {"started_at": start})
    if end is not None:
        _write(os.path.join(folder, "exit.json"), {"stage": "COMPLETED", "code": 0, "message": "", "time": end})


def _write(path: str, data) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(data if isinstance(data, str) else json.dumps(data))


@pytest.mark.usefixtures("no_hub_login")
def test_a_members_cost_line_on_the_page_shows_its_fleet_share_by_tokens(panel, monkeypatch):
    home = panel.settings.home
    root = os.path.join(home, "buckets", *BUCKET.split("/"))
    members = {"m0": "20260101-000000-sweep0", "m1": "20260101-000001-sweep1"}
    _write(os.path.join(root, layout.sweep_record_path(SWEEP)), {"sweep_id": SWEEP, "members": members,
                                                                 "fleet": SWEEP})
    for role in ("vllm-0", "vllm-1"):
        _job(home, SWEEP, role, T0, T0 + 300)
    clock = Clock(T0)
    for tag, run_id in members.items():
        spec = RunSpec(name=f"lr-{tag}", mode="distributed", bucket=BUCKET, run_id=run_id, sweep_id=SWEEP,
                       sweep_member=tag, fleet=SWEEP, max_steps=10)
        _write(os.path.join(root, layout.run_prefix(run_id), layout.SPEC_FILE), spec.to_json())
        _job(home, run_id, "trainer", T0 + 10, T0 + 290)
        proxy = Proxy(os.path.join(root, layout.run_prefix(run_id), layout.METRICS_DIR), tag, monkeypatch, clock)
        for k in range(4):
            clock.t = T0 + 30 + 60 * k
            proxy.answered(30 if tag == "m0" else 10)

    m0 = dashboard_view.draw(panel, Visitor(), members["m0"], *SHOWN, None)["cost"]
    assert "**Fleet share (m0):** 75% by tokens (120 of 160 generated): 450 of the fleet's 600 replica-s" in m0, m0
    assert "this trainer 280 s" in m0 and "sweep total 1,160 job-s (fleet 600 replica-s + 2 members' trainers 560 s)" \
        in m0, m0
    m1 = dashboard_view.draw(panel, Visitor(), members["m1"], *SHOWN, None)["cost"]
    assert "**Fleet share (m1):** 25% by tokens (40 of 160 generated): 150 of the fleet's 600 replica-s" in m1, m1


@pytest.mark.usefixtures("no_hub_login")
def test_the_fleets_own_dashboard_header_names_it_and_says_whose_fleet_it_is(panel):
    """The fleet's row, opened: it has no spec.json, so its header reads its name and sweep from its fleet.json, as its
    row in the runs list does."""
    root = os.path.join(panel.settings.home, "buckets", *BUCKET.split("/"))
    _write(os.path.join(root, layout.run_prefix(SWEEP), layout.FLEET_FILE),
           {"sweep_id": SWEEP, "members": {"m0": "r0", "m1": "r1", "m2": "r2"}, "max_loras": 9, "max_lora_rank": 8,
            "name": "lr-fleet", "mode": "distributed", "executor": "local", "attempts": 1})
    for role in ("vllm-0", "vllm-1"):
        _job(panel.settings.home, SWEEP, role, T0, None)
    status = dashboard_view.draw(panel, Visitor(), SWEEP, *SHOWN, None)["status"]
    assert status.startswith(f"### lr-fleet · Run `{SWEEP}` — **RUNNING**"), status
    assert (f"Shared vLLM fleet of sweep `{SWEEP}` · 3 member(s): m0, m1, m2 · 9 adapter slots (`--max-loras`) · "
            "LoRA rank up to 8") in status, status
