"""A tick costs what is new: incremental fragment reads, one frame per run version for every session, only the
changed components sent, bounded payloads at any run length. (Figures: benchmarks/dashboard_scale.py.)"""

import json
import os
import sys
import threading
import time

import pytest

from backend.runtime import layout
from backend.storage.observers import FragmentReader
from backend.storage.series import SeriesTable
from backend.storage.store import FolderStore
from backend.view.bucket_reader import FIRST_LOOK_LOG_LINES, HISTORY_TAIL_FRAGMENTS, HISTORY_TAIL_SAMPLES
from backend.view.job_view import MAX_LOG_LINES
from backend.view.runview import RunView
from panel import adapters_table, dashboard, live, run_header, samples_table
from panel.tick import TICK_S

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from dashboard_scale import SyntheticRun

pytestmark = pytest.mark.unit


class CountingStore(FolderStore):
    """A folder bucket that counts listings and probes."""

    def __init__(self, root):
        super().__init__(root)
        self.listings = self.probes = 0

    def list_files(self, prefix):
        self.listings += 1
        return super().list_files(prefix)

    def sizes(self, paths):
        self.probes += 1
        return super().sizes(paths)


def _fragment(folder, writer, seq, records):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, layout.fragment_name(writer, seq)), "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records))


def test_between_listings_a_reader_probes_the_next_fragments_and_finds_new_writers_on_its_next_listing(tmp_path):
    store = CountingStore(str(tmp_path))
    folder = tmp_path / "runs" / "r" / "metrics"
    clock = [0.0]
    reader = FragmentReader(store, "runs/r/metrics", clock=lambda: clock[0])
    _fragment(folder, "trainer", 0, [{"step": 1}])
    assert [r["step"] for _, r in reader.read()] == [1] and store.listings == 1
    for seq in range(1, 7):                         # more than one probe round's worth
        _fragment(folder, "trainer", seq, [{"step": seq + 1}])
    _fragment(folder, "proxy", 0, [{"replicas": []}])
    clock[0] = 1.0
    assert [r["step"] for _, r in reader.read()] == [2, 3, 4, 5, 6, 7]
    assert store.listings == 1 and store.probes >= 2, "no listing: the trainer's next numbers were asked for"
    assert reader.read() == [], "nothing new: one probe, no listing"
    clock[0] = 1.0 + reader.rescan_s
    assert reader.read() == [], "a due re-listing is started, not waited for: the read probes as before"
    assert reader.wait_for_listing(10) and store.listings == 2
    _fragment(folder, "trainer", 7, [{"step": 8}])
    assert [(w, r.get("step")) for w, r in reader.read()] == [("proxy", None), ("trainer", 8)], \
        "the next read takes what the listing found (a new writer) and probes the known ones"
    assert store.listings == 2 and reader.read() == []


def test_a_named_writer_that_starts_after_the_first_look_is_read_at_the_next_read_not_the_next_listing(tmp_path):
    """A run's metrics folder holds only the proxy's snapshots when the panel first looks (the trainer is still
    loading); the trainer's first step must reach the charts at the next tick, not a listing up to a minute later."""
    store = CountingStore(str(tmp_path))
    folder = tmp_path / "runs" / "r" / "metrics"
    clock = [0.0]
    reader = FragmentReader(store, "runs/r/metrics", clock=lambda: clock[0], latest_only={"proxy": 3},
                            defer={"trainer": 2})
    _fragment(folder, "proxy", 0, [{"replicas": []}])
    assert [w for w, _ in reader.read()] == ["proxy"] and store.listings == 1
    reader.rescan_s = 60.0                          # a listing that cost 0.3 s: the next one a minute away
    clock[0] = 1.0
    assert reader.read() == []
    for seq in range(3):                            # more steps than the first look's tail
        _fragment(folder, "trainer", seq, [{"step": seq + 1}])
    clock[0] = 2.0
    assert [r["step"] for _, r in reader.read()] == [1, 2, 3], "the trainer's first steps, every one, at once"
    assert store.listings == 1 and not reader.deferred


class SlowListingStore(CountingStore):
    """A bucket whose listing takes a while (a folder of 100,000 fragments; on the Hub, an HTTP walk)."""

    def __init__(self, root):
        super().__init__(root)
        self.release = threading.Event()

    def list_files(self, prefix):
        if self.listings:           # the first look lists at once; later listings wait to be released
            self.release.wait(10)
        return super().list_files(prefix)


def test_no_read_waits_for_a_re_listing_of_the_folder(tmp_path):
    store = SlowListingStore(str(tmp_path))
    folder = tmp_path / "runs" / "r" / "samples"
    clock = [0.0]
    reader = FragmentReader(store, "runs/r/samples", clock=lambda: clock[0])
    _fragment(folder, "trainer", 0, [{"step": 1}])
    assert [r["step"] for _, r in reader.read()] == [1]
    clock[0] = 1000.0
    _fragment(folder, "trainer", 1, [{"step": 2}])
    _fragment(folder, "eval", 0, [{"step": 2, "score": 0.5}])
    assert [r["step"] for _, r in reader.read()] == [2], "the listing is under way; the read probed"
    assert reader.listing_pending
    store.release.set()
    assert reader.wait_for_listing(10)
    assert [(w, r["score"]) for w, r in reader.read()] == [("eval", 0.5)], "a new writer's folder, read once"
    assert reader.read() == [] and store.listings == 2


def test_a_first_look_reads_only_the_newest_snapshots_of_a_snapshot_writer(tmp_path):
    store = FolderStore(str(tmp_path))
    folder = tmp_path / "runs" / "r" / "metrics"
    for seq in range(10):
        _fragment(folder, "proxy", seq, [{"replicas": [{"served": seq}]}])
    reader = FragmentReader(store, "runs/r/metrics", latest_only={"proxy": 3})
    assert [r["replicas"][0]["served"] for _, r in reader.read()] == [7, 8, 9]


def _view(home, run):
    from backend.executors.local import LocalExecutor

    executor = LocalExecutor(home)
    return RunView(run.spec.run_id, FolderStore(executor.bucket_root("local/bench")), executor, run.job_ids)


def test_ten_sessions_on_one_run_share_one_frame_build(tmp_path, monkeypatch):
    run = SyntheticRun(str(tmp_path), 200)
    view = _view(str(tmp_path), run)
    view.refresh()
    builds = []
    original = dashboard.build_frame
    monkeypatch.setattr(dashboard, "build_frame", lambda *a, **k: builds.append(1) or original(*a, **k))
    frames = [dashboard.shared_frame(view) for _ in range(10)]
    assert len(builds) == 1 and all(f is frames[0] for f in frames)
    run.grow(10)
    view.refresh()
    assert dashboard.shared_frame(view) is not frames[0] and len(builds) == 2, "a new version, a new frame"


class OneRun:
    """The panel as `live.dashboard_update` sees it: one run's view."""

    def __init__(self, view):
        self._view = view

    def view(self, run_id, visitor=None):
        return self._view


def test_a_session_is_sent_only_the_components_that_changed_since_it_last_drew(tmp_path):
    run = SyntheticRun(str(tmp_path), 300)
    panel = OneRun(_view(str(tmp_path), run))
    session = {}
    first = live.dashboard_update(panel, run.spec.run_id, session)
    assert {"reward", "utilisation", "status", "adapters", live.LOG_KEY} <= set(first.values)
    panel.view(run.spec.run_id).expire()
    assert live.dashboard_update(panel, run.spec.run_id, session).values == {}, "nothing new, nothing sent"
    run.grow(10)
    panel.view(run.spec.run_id).expire()
    update = live.dashboard_update(panel, run.spec.run_id, session)
    assert "reward" in update.values and json.loads(update.values["reward"])["data"]
    other = {}
    assert set(live.dashboard_update(panel, run.spec.run_id, other).values) >= set(first.values), \
        "a session that drew nothing yet gets everything"


def test_a_long_runs_tick_sends_a_bounded_payload_and_the_adapters_table_pages(tmp_path):
    run = SyntheticRun(str(tmp_path), 20_000)
    panel = OneRun(_view(str(tmp_path), run))
    update = live.dashboard_update(panel, run.spec.run_id, {})
    plots = sum(len(update.values[name]) for name in dashboard.PLOTS)
    assert plots < 300_000, f"{plots} bytes of figures"
    assert len(update.values["adapters"]["data"]) == adapters_table.ADAPTER_PAGE
    assert update.values["adapters"]["data"][0][0] == "trl-policy-v1000", "newest first"


def test_a_long_runs_held_out_chart_is_sent_bounded_with_the_base_model_the_best_and_the_newest(tmp_path):
    run = SyntheticRun(str(tmp_path), 20_000, evals=True)       # 1,000 evaluated versions and the base model
    view = _view(str(tmp_path), run)
    update = live.dashboard_update(OneRun(view), run.spec.run_id, {})
    held_out = json.loads(update.values["heldout"])
    score = next(t for t in held_out["data"] if t["name"] == "held-out score")
    assert len(update.values["heldout"]) < 30_000 and len(score["x"]) <= 260, len(update.values["heldout"])
    assert score["text"][0] == "v0" and score["text"][-1] == "v1000" and score["x"] == sorted(score["x"])
    assert f"best: v{view.held_out.best_version}" in [t["name"] for t in held_out["data"]]


def test_a_first_look_at_a_long_log_starts_at_its_tail(tmp_path):
    from backend.executors.local import LocalExecutor

    executor = LocalExecutor(str(tmp_path))
    job_id = "r--trainer--000000"
    os.makedirs(os.path.join(executor.jobs_dir, job_id))
    with open(executor.log_path(job_id), "w") as f:
        f.write("".join(f"line {i}\n" for i in range(100_000)))
    lines, _ = executor.read_logs(job_id, executor.tail_cursor(job_id, 10))
    assert lines == [f"line {i}" for i in range(99_990, 100_000)]
    with open(executor.log_path(job_id), "w") as f:
        f.write("one\ntwo\n")
    assert executor.tail_cursor(job_id, 10) == 0


class GatedStore(FolderStore):
    """A folder bucket whose reads from any thread but the test's wait until `gate` is set."""

    def __init__(self, root):
        super().__init__(root)
        self.gate, self.main = threading.Event(), threading.get_ident()

    def read_bytes(self, path, start=0):
        if threading.get_ident() != self.main:
            assert self.gate.wait(60), "the test never opened the gate"
        return super().read_bytes(path, start)


def test_a_first_look_at_a_long_run_draws_its_newest_rows_and_reads_its_history_in_the_background(tmp_path):
    from backend.executors.local import LocalExecutor

    rows = 20_000
    run = SyntheticRun(str(tmp_path), rows)
    with open(os.path.join(run.metrics, layout.fragment_name("trainer", 5)), "a") as f:
        f.write("not json\n")                                   # an unreadable line deep in the history
    executor = LocalExecutor(str(tmp_path))
    store = GatedStore(executor.bucket_root("local/bench"))
    view = RunView(run.spec.run_id, store, executor, run.job_ids)
    view.refresh()
    tail = HISTORY_TAIL_FRAGMENTS * 10
    assert view.history_pending and list(view.table.steps) == list(range(rows - tail + 1, rows + 1))
    usage = view.jobs["trainer"].usage.table
    assert len(usage) == HISTORY_TAIL_SAMPLES and usage.times[-1] == run.t0 + rows
    logs = view.jobs["trainer"].logs
    assert len(logs) == FIRST_LOOK_LOG_LINES and logs[-1].startswith(f"step {rows}/"), "the log's newest lines"
    assert f"history before step {rows - tail + 1}" in run_header.status_markdown(view)
    before = view.version
    dashboard.shared_frame(view)                                 # drawn: the history joins drawn alike

    run.grow(10)                                                 # rows arriving while the history is read
    view.refresh()
    store.gate.set()
    assert view.wait_for_history(60) and view.version > before
    assert list(view.table.steps) == list(range(1, rows + 11))
    metrics = f"{layout.run_prefix(run.spec.run_id)}/{layout.METRICS_DIR}"
    whole = SeriesTable()                                        # the same rows read in one go, no deferral
    whole.extend([r for _, r in FragmentReader(FolderStore(store.root), metrics, check=lambda r: "step" in r).read()])
    assert view.table.sketch("reward").points() == whole.sketch("reward").points()
    assert view.table.sketch("kl", "time").points() == whole.sketch("kl", "time").points()
    assert view.first_step[0] == 1 and view.first_step[1] == 20, "policy versions from the history's first steps"
    usage = view.jobs["trainer"].usage.table
    assert list(usage.times) == [run.t0 + step for step in range(1, rows + 11)], "every sample once, in order"
    with open(executor.log_path(run.job_ids["trainer"])) as f:
        assert list(view.jobs["trainer"].logs) == f.read().splitlines()[-MAX_LOG_LINES:], "the whole tail, once"
    assert view.unreadable == {f"{metrics}/{layout.fragment_name('trainer', 5)}": 1}
    assert "earlier history" not in run_header.status_markdown(view)
    run.grow(10)
    view.refresh()
    assert view.table.steps[-1] == rows + 20 and len(view.table) == rows + 20


def test_a_first_look_at_a_large_folder_lists_nothing_and_finds_each_writers_newest_fragment(tmp_path):
    store = CountingStore(str(tmp_path))
    folder = tmp_path / "f"
    counts = {"one": 1, "two": 2, "seventeen": 17, "many": 1000, "more": 4097}
    for writer, count in counts.items():
        for seq in range(count):
            _fragment(folder, writer, seq, [{"step": seq}])
    reader = FragmentReader(store, "f", defer=dict.fromkeys([*counts, "none"], 1), list_below=0)
    newest = sorted((w, r["step"]) for w, r in reader.read())
    assert newest == sorted((w, n - 1) for w, n in counts.items()), "the newest fragment of each, nothing else"
    assert store.listings == 0 and store.probes <= 8, "a few sizes calls, all writers at once"


def test_a_first_look_defers_what_its_listing_finds_before_and_reads_what_it_finds_beside(tmp_path):
    store = CountingStore(str(tmp_path))
    folder = tmp_path / "f"
    for seq in range(3000):
        _fragment(folder, "trainer", seq, [{"step": seq}])
    for seq in range(500):
        _fragment(folder, "proxy", seq, [{"replicas": [], "seq": seq}])
    for seq in [*range(200), *range(300, 310)]:              # numbers with a gap: the listing finds the rest
        _fragment(folder, "gappy", seq, [{"step": seq}])
    _fragment(folder, "other", 0, [{"step": -1}])            # a writer no first look knows of
    clock = [0.0]
    reader = FragmentReader(store, "f", clock=lambda: clock[0], latest_only={"proxy": 5},
                            defer={"trainer": 10, "gappy": 10}, list_below=100)
    first = reader.read()
    assert store.listings == 0 and reader.looking_back
    assert [r["step"] for w, r in first if w == "trainer"] == list(range(2990, 3000))
    assert [r["seq"] for w, r in first if w == "proxy"] == list(range(495, 500))
    assert not [w for w, _ in first if w == "other"]
    _fragment(folder, "trainer", 3000, [{"step": 3000}])
    clock[0] = 1.0
    assert [r["step"] for _, r in reader.read()] == [3000], "probed; the listing is started, not waited for"
    assert reader.wait_for_listing(30) and store.listings == 1
    later = reader.read()
    assert ("other", {"step": -1}) in later and not [w for w, _ in later if w in ("trainer", "proxy")]
    assert not reader.looking_back
    deferred = [r["step"] for batch in reader.read_deferred(reader.deferred) for w, r in batch if w == "trainer"]
    assert deferred == list(range(2990)), "the trainer's history, in order, set aside"
    gappy = sorted([r["step"] for w, r in [*first, *later] if w == "gappy"]
                   + [r["step"] for batch in reader.read_deferred(reader.deferred) for w, r in batch if w == "gappy"])
    assert gappy == [*range(200), *range(300, 310)], "every fragment once, read now or set aside"


def _long_run_with_old_events(tmp_path, monkeypatch):
    """A 3,000-row run (150 version events) whose first events (started, engine, an alert nobody cleared) are
    older than what a first look reads, with a folder bucket that counts its listings per folder."""
    from backend.storage import observers

    monkeypatch.setattr(observers, "LIST_FIRST_BELOW", 100)
    run = SyntheticRun(str(tmp_path), 3000, samples="flush")
    with open(os.path.join(run.events, layout.fragment_name("trainer", 0)), "a") as f:
        f.write(json.dumps({"time": run.t0, "event": "started"}) + "\n")
        f.write(json.dumps({"time": run.t0, "event": "engine", "engine": "vllm", "proxy_url": "http://x"}) + "\n")
    _fragment(run.events, "panel-alerts.0a1b", 0, [
        {"time": run.t0 + 5, "event": "alert", "key": "stall", "kind": "stall", "message": "no new step"},
        {"time": run.t0 + 6, "event": "alert", "key": "ratio", "kind": "ratio", "message": "drifting"}])

    class ListingStore(FolderStore):
        def list_files(self, prefix):
            self.listed = [*getattr(self, "listed", []), prefix.rsplit("/", 1)[-1]]
            return super().list_files(prefix)

    from backend.executors.local import LocalExecutor

    executor = LocalExecutor(str(tmp_path))
    return run, RunView(run.spec.run_id, ListingStore(executor.bucket_root("local/bench")), executor, run.job_ids)


def test_a_first_look_reads_a_long_runs_newest_events_and_joins_the_older_ones_in_order(tmp_path, monkeypatch):
    from backend.outcome.best_version import choose
    from backend.outcome.try_live import view_engine_event
    from backend.runs.resume import finished
    from backend.view.alerts import AlertBook
    from backend.view.bucket_reader import EVENTS_TAIL_FRAGMENTS

    run, view = _long_run_with_old_events(tmp_path, monkeypatch)
    view.refresh()
    listed = getattr(view.store, "listed", [])
    assert not {layout.METRICS_DIR, layout.EVENTS_DIR, layout.SAMPLES_DIR} & set(listed), "no folder walked"
    assert view.events_loading and view.history_pending and len(view.events) == EVENTS_TAIL_FRAGMENTS
    assert view.engine is None and not view.open_alerts and len(view.adapters) == EVENTS_TAIL_FRAGMENTS
    assert view.trainer_started == (0, None), "its 'started' event is among the older ones"
    sent, stalled = [], time.time() + 3600                      # an hour without a step: the stall fires
    book = AlertBook(view.store, run.spec.run_id, "http://hook.invalid", send=lambda *a: sent.append(a))
    assert book.update(view, stalled) == [] and len(os.listdir(run.events)) == 151, "nothing fired meanwhile"
    assert choose(view, "trl-policy-v3").files, "an old version picked by hand is found in its folder"

    run.grow(40)                                              # new versions while the older events are read
    view.expire()
    view.refresh()
    assert view.wait_for_history(60) and not view.events_loading
    times = [e["time"] for e in view.events]
    assert times == sorted(times) and len(view.events) == 150 + 2 + 2 + 2, "every event once, in time order"
    assert [e["event"] for e in view.events[:2]] == ["started", "engine"]
    assert sorted(view.adapters) == list(range(1, 153)) and view.engine == "vllm"
    assert view.open_alerts.keys() == {"stall", "ratio"} and view.trainer_end["event"] == "started"
    assert view.trainer_started == (1, run.t0), "counted as the older events joined, not by walking them each tick"
    assert view_engine_event(view)["proxy_url"] == "http://x" and not finished(view)
    assert book.update(view, stalled) == [], "the stall was recorded long ago: not fired again"
    written = [json.loads(line) for name in os.listdir(run.events) if name.startswith(book.writer)
               for line in open(os.path.join(run.events, name))]
    assert [(e["event"], e["key"]) for e in written] == [("alert_cleared", "ratio")] and not sent


class ReadCountingStore(FolderStore):
    """A folder bucket that records each file it reads."""

    def read_bytes(self, path, start=0):
        self.read = [*getattr(self, "read", []), path]
        return super().read_bytes(path, start)


def _long_evaluated_run(root: str, versions: int, best: int) -> str:
    """A run folder of `versions` evaluated versions and the base model's (v0), one record per fragment as the trainer
    writes them, version `best` (far older than a first look reads) the best and published as best/."""
    prefix = os.path.join(root, layout.run_prefix("long-evals"))
    folder = os.path.join(prefix, layout.EVALS_DIR)
    os.makedirs(folder)
    for v in range(versions + 1):
        score = 0.95 if v == best else 0.35 if v == 0 else 0.3 + 0.4 * ((v * 7919) % 101) / 101
        with open(os.path.join(folder, layout.fragment_name("trainer", v)), "w") as f:
            f.write(json.dumps({"time": 1.0e9 + v, "step": 20 * v, "policy_version": v, "n_prompts": 16,
                                "score": score, "score_std": 0.01,
                                "rewards": {"digits": {"mean": score, "weight": 1.0},
                                            "distinct_chars": {"mean": 0.6 - v / 1e5, "weight": 0.0}},
                                "samples": [{"prompt_index": 0, "prompt": "q", "completion": f"v{v}"}]}) + "\n")
    os.makedirs(os.path.join(prefix, layout.BEST_DIR))
    for name in layout.ADAPTER_FILES:
        with open(os.path.join(prefix, layout.BEST_DIR, name), "w") as f:
            f.write("{}")
    with open(os.path.join(prefix, layout.BEST_DIR, layout.BEST_FILE), "w") as f:
        json.dump({"policy_version": best, "step": 20 * best, "score": 0.95, "best_by": {}, "baseline": 0.35}, f)
    return "long-evals"


def test_a_first_look_reads_a_long_runs_newest_held_out_records_and_best_json_and_joins_the_rest(tmp_path):
    from backend.outcome.best_version import change_best_by
    from backend.outcome.held_out import HeldOut
    from backend.view.bucket_reader import EVALS_TAIL_FRAGMENTS

    run_id = _long_evaluated_run(str(tmp_path), 5000, best=1234)
    view = RunView(run_id, ReadCountingStore(str(tmp_path)), None, {})
    view.refresh()
    held = view.held_out
    read = [p for p in view.store.read if f"/{layout.EVALS_DIR}/" in p]
    assert len(read) == EVALS_TAIL_FRAGMENTS + 1, "the newest records and the base model's, not 5,001"
    assert sorted(held.scores) == [0, *range(5001 - EVALS_TAIL_FRAGMENTS, 5001)] and held.span == (0, 5000)
    assert held.best_version == 1234 and held.rule_score(1234) == 0.95, "best.json names it before its record is read"
    assert held.baseline == 0.35 and held.best_files and view.history_pending and held.older_pending
    assert "best **trl-policy-v1234** (held-out 0.950)" in run_header.best_line(view)
    chart = held.chart_records()
    assert {0, 5000} <= set(chart) and len(chart) <= EVALS_TAIL_FRAGMENTS + 2

    assert view.wait_for_history(120) and not held.older_pending
    full = HeldOut(FolderStore(str(tmp_path)), run_id)      # every record at once
    full.refresh()
    assert len(full.scores) == 5001 and held.scores == full.scores and held.records == full.records
    assert held.span == full.span == (0, 5000)
    assert (held.best_version, held.baseline, held.evaluated) == (full.best_version, full.baseline, 5000) == (
        1234, 0.35, 5000)
    assert held.chart_records() == full.chart_records()
    assert all(held.rule_score(v) == full.rule_score(v) for v in full.scores)
    assert held.set_rule({"distinct_chars": 1.0}) and full.set_rule({"distinct_chars": 1.0})
    assert held.best_version is None and full.best_version is None, "the monitor falls from v0: none beats it"

    again = RunView(run_id, FolderStore(str(tmp_path)), None, {})     # a change of rule on a first look
    again.refresh()
    assert again.held_out.older_pending and again.held_out.best_version == 1234
    assert "no version beats the base model" in change_best_by(again, "distinct_chars")
    assert len(again.held_out.scores) == 5001, "ranked over every record, not the first look's"


def test_a_short_run_is_read_at_once(tmp_path):
    run = SyntheticRun(str(tmp_path), HISTORY_TAIL_FRAGMENTS * 10)
    view = _view(str(tmp_path), run)
    view.refresh()
    assert not view.history_pending and len(view.table) == HISTORY_TAIL_FRAGMENTS * 10


# ---- files that stay few, old runs still read

def test_samples_are_written_one_fragment_per_flush_and_a_run_of_one_file_per_step_still_reads(tmp_path):
    from backend.runtime.trainer.samples import SampleWriter, sample_record

    run_dir = tmp_path / "runs" / "r"
    writer = SampleWriter(str(run_dir), flush_every_s=3600)
    for step in range(1, 6):
        writer.write([sample_record(step, None, "p", f"c{step}-{i}", {"r": 1.0}, 0.0, 3, False) for i in range(9)])
    assert not (run_dir / layout.SAMPLES_DIR).exists(), "nothing written before a flush"
    writer.flush()
    writer.flush()                                              # nothing new: no empty fragment
    files = sorted(os.listdir(run_dir / layout.SAMPLES_DIR))
    assert files == [layout.fragment_name("trainer", 0)]
    records = [json.loads(line) for line in (run_dir / layout.SAMPLES_DIR / files[0]).read_text().splitlines()]
    assert [r["step"] for r in records] == [s for s in range(1, 6) for _ in range(4)], "4 a step, 5 steps, 1 file"

    for samples in ("flush", "step"):                            # the reader reads both layouts alike
        home = tmp_path / samples
        run = SyntheticRun(str(home), 60, samples=samples)
        view = _view(str(home), run)
        view.refresh()
        assert samples_table.sample_steps(view)[0] == 60 and len(samples_table.sample_rows(view)) == 4
        assert len(os.listdir(run.samples_dir)) == (6 if samples == "flush" else 60)


# ---- the background watch: a bounded summary of each live run

def test_the_watch_keeps_a_bounded_summary_of_a_live_run_nobody_watches(tmp_path, monkeypatch):
    from backend.runs.access import Visitor
    from backend.view.bucket_reader import SUMMARY_ROWS
    from panel.actions import Panel, Settings

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    run = SyntheticRun(str(tmp_path), 3000, samples="flush")
    run._fragment(run.events, "trainer", run.event_fragment, [{"time": run.t0, "event": "started"}])
    run.event_fragment += 1
    panel = Panel(Settings(home=str(tmp_path), on_space=False, budget_check_s=0))
    try:
        panel.watch.check()
        registry = panel.runs.find(run.spec.run_id, Visitor())
        summary = registry.watched_view(run.spec.run_id)
        assert registry.open_view(run.spec.run_id) is None and summary.bounded
        assert summary.latest["step"] == 3000 and len(summary.table) <= SUMMARY_ROWS * 2
        assert summary.table.steps[0] > 3000 - 2 * SUMMARY_ROWS, "no history read"
        assert not summary.samples and not summary.jobs["trainer"].logs and not len(summary.jobs["trainer"].usage.table)
        assert summary.jobs["trainer"].resources, "the newest resource samples, which the alerts read"
        assert [e["event"] for e in summary.events] == ["started"], "its events, but the adapter versions"
        run.grow(2 * SUMMARY_ROWS + 10)
        summary.expire()
        panel.watch.check()
        assert summary.latest["step"] == 3000 + 2 * SUMMARY_ROWS + 10 and len(summary.table) <= 2 * SUMMARY_ROWS
        [row] = panel.runs_table()
        assert f"{3000 + 2 * SUMMARY_ROWS + 10}/{run.spec.max_steps}" in row[3], "the runs list reads the summary"
        opened = panel.view(run.spec.run_id)                       # a dashboard opens it: a whole view
        assert not opened.bounded and registry.watched_view(run.spec.run_id) in (None, opened)
        panel.watch.check()
        assert registry.watched_view(run.spec.run_id) is opened, "the watch reads the open view, no second one"
    finally:
        panel.shutdown()


# ---- through Gradio's request path: a session's tick sends only what changed for it

def _live_run_panel(tmp_path, monkeypatch):
    """A 300-row live run (samples written a fragment per flush), a panel over it and its Gradio app."""
    from panel.actions import Panel, Settings
    from panel.ui import build_ui

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    run = SyntheticRun(str(tmp_path), 300, samples="flush")
    panel = Panel(Settings(home=str(tmp_path), on_space=False, budget_check_s=0))
    try:
        return run, panel, build_ui(panel)
    except BaseException:
        panel.shutdown()
        raise


def test_a_sessions_tick_through_gradio_sends_no_choices_or_state_it_already_has(tmp_path, monkeypatch):
    import asyncio

    from dashboard_requests import Browser

    run, panel, demo = _live_run_panel(tmp_path, monkeypatch)
    try:
        browser = Browser(demo, run.spec.run_id)
        tick = browser.fns["on_tick"]
        names = [getattr(block, "elem_id", None) or type(block).__name__ for block in tick.outputs]

        async def ticks():
            await browser.open()
            out = []
            for _ in range(3):
                run.grow(10)
                panel.view(run.spec.run_id).expire()
                answer = await demo.process_api(tick, [run.spec.run_id, "trainer", "", "step", 0, "latest", "",
                                                       None, None, "", "all", None, TICK_S, None],
                                                state=browser.state, session_hash=browser.session)
                out.append(dict(zip(names, answer["data"])))
            steps = await demo.process_api(browser.fns["on_steps"], [run.spec.run_id], state=browser.state,
                                           session_hash=browser.session)
            opened = [(await demo.process_api(browser.fns[name], [run.spec.run_id], state=browser.state,
                                              session_hash=browser.session))["data"][0]
                      for name in ("on_versions", "on_picks")]
            return out, steps["data"], opened

        answers, steps, (versions, picks) = asyncio.run(ticks())
        skipped = {"__type__": "update"}
        first, *later = answers
        assert first["run-pick"]["choices"] == [[run.spec.run_id, run.spec.run_id]], "the first list has the runs"
        for answer in later:
            assert answer["reward-plot"] != skipped and answer["runs-table"] != skipped, "new rows are sent"
            assert answer["run-pick"] == answer["compare-pick"] == skipped, "the same runs: no choices again"
            assert answer["sample-step"] == skipped and answer["config-json"] == skipped
            assert answer["version-pick"] == answer["try-picks"] == skipped, "new versions: sent when opened"
            assert answer["Timer"] == skipped, "a live run keeps its tick's period"
        assert steps[0]["choices"][:2] == [["latest", "latest"], ["330", 330]], "opened, the picker gets the steps"
        assert versions["choices"][0] == ["trl-policy-v16", "trl-policy-v16"], "the newest version"
        assert picks["choices"][:2] == [["base model", "base"], ["trl-policy-v16", "trl-policy-v16"]]
        assert all(browser.state[b._id] is not None for b in tick.outputs if b.stateful), "the session's state kept"
    finally:
        panel.shutdown()


def test_ten_sessions_ticking_one_run_build_its_summary_samples_and_components_once(tmp_path, monkeypatch):
    import asyncio

    import gradio as gr
    from dashboard_requests import Browser

    from backend.view.summary import RunSummaries
    run, panel, demo = _live_run_panel(tmp_path, monkeypatch)
    try:
        browsers = [Browser(demo, run.spec.run_id) for _ in range(10)]
        built = {"summary": 0, "samples": 0, "plots": 0}

        def counting(name, original):
            def count(*args, **kwargs):
                built[name] += 1
                return original(*args, **kwargs)
            return count

        async def ticks():
            for browser in browsers:
                await browser.open()
            monkeypatch.setattr(RunSummaries, "_glance", counting("summary", RunSummaries._glance))
            monkeypatch.setattr(samples_table, "sample_rows", counting("samples", samples_table.sample_rows))
            monkeypatch.setattr(gr.Plot, "postprocess", counting("plots", gr.Plot.postprocess))
            panel.spend.clock = lambda: 1e9          # one second of the summaries' clock
            run.grow(10)
            panel.view(run.spec.run_id).expire()
            return [await browser.tick() for browser in browsers]

        sent = asyncio.run(ticks())
        assert len(set(sent)) == 1 and sent[0] > 10_000, "every session is sent the same new charts and rows"
        assert built["summary"] == built["samples"] == 1, built
        assert 0 < built["plots"] <= len(dashboard.PLOTS), f"each changed chart once, not once a session: {built}"
    finally:
        panel.shutdown()


def test_the_version_picker_follows_the_runs_default_but_not_over_a_version_picked_by_hand(tmp_path, monkeypatch):
    """A tick sends the picker again when the run's default moves (its first best version, final/ written), unless
    the visitor's picker shows another version than the default it was sent: a pick by hand stands."""
    run = SyntheticRun(str(tmp_path), 300)
    panel = OneRun(_view(str(tmp_path), run))
    default = ["trl-policy-v10"]
    monkeypatch.setattr(dashboard, "default_choice", lambda view: default[0])
    following, picking = {}, {}
    for session in (following, picking):
        assert live.dashboard_update(panel, run.spec.run_id, session).values["version_pick"]["value"] == default[0]
    default[0] = "trl-policy-v20"
    run.grow(10)
    panel.view(run.spec.run_id).expire()
    moved = live.dashboard_update(panel, run.spec.run_id, following, shown="trl-policy-v10").values
    assert moved["version_pick"]["value"] == "trl-policy-v20", "a picker left on the default follows it"
    kept = live.dashboard_update(panel, run.spec.run_id, picking, shown="trl-policy-v5").values
    assert "reward" in kept and "version_pick" not in kept, "a version picked by hand is not taken away"


def test_the_runs_list_of_a_home_of_ended_runs_costs_what_changed(tmp_path, monkeypatch):
    """A home of ended runs is listed once: a tick after the registry's listing expired rebuilds nothing (no job
    folder read, no row built) until a job folder comes; then the new run shows at the top."""
    from dashboard_scale import finished_runs

    from backend.executors.local import LocalExecutor
    from backend.executors.local_listing import FINAL_LISTING_S
    from panel.actions import Panel, Settings, as_visitor

    finished_runs(str(tmp_path), 60)
    settled = time.time() - FINAL_LISTING_S - 5      # the jobs folder has not changed for a while
    os.utime(tmp_path / "jobs", (settled, settled))
    reads, built = [], []
    listed_jobs, run_row = LocalExecutor._listed_jobs, Panel._run_row
    monkeypatch.setattr(LocalExecutor, "_listed_jobs", lambda self, *a: reads.append(1) or listed_jobs(self, *a))
    monkeypatch.setattr(Panel, "_run_row", lambda self, *a: built.append(1) or run_row(self, *a))
    panel = Panel(Settings(home=str(tmp_path), on_space=False, host="127.0.0.1"))
    try:
        first = panel.runs_table()
        assert len(first) == 50 and first[0][0] == "done-059" and reads == [1]

        def relisted() -> list[list]:
            for registry in panel.runs.registries(as_visitor(None)):
                registry.forget_listing()       # as when the listing's few seconds are up
            return panel.runs_table()

        reads.clear(), built.clear()
        assert relisted() == first and reads == [] and built == [], "nothing changed: nothing read or built again"
        finished_runs(str(tmp_path), 61)         # one more run (done-060) comes
        rows = relisted()
        assert rows[0][0] == "done-060" and rows[1:] == first[:49] and reads == [1]
    finally:
        panel.shutdown()


def test_a_runs_summary_reads_its_published_best_again_once_its_jobs_have_ended(tmp_path):
    from types import SimpleNamespace

    from backend.plan.jobspec import JobRecord
    from backend.view.summary import RunSummaries

    run_id = "ended-best"
    best = os.path.join(str(tmp_path), layout.run_prefix(run_id), layout.BEST_DIR)
    os.makedirs(best)

    def publish(version: int, score: float) -> None:
        with open(os.path.join(best, layout.BEST_FILE), "w") as f:
            json.dump({"policy_version": version, "score": score, "best_by": {}, "baseline": 0.1}, f)

    records = {"stage": "RUNNING"}
    registry = SimpleNamespace(
        job_records=lambda _id: [JobRecord("j", run_id, "trainer", records["stage"], 1.0, bucket="local/b")],
        store_for=lambda _bucket: FolderStore(str(tmp_path)), engine=SimpleNamespace(billed=False), executor=None)
    clock = [1000.0]
    summaries = RunSummaries(clock=lambda: clock[0])
    publish(3, 0.4)
    assert summaries.glance(registry, run_id).best.text == "0.400 · v3"
    publish(9, 0.7)             # the last version's evaluation, then the trainer ends
    records["stage"] = "COMPLETED"
    clock[0] += 1
    assert summaries.glance(registry, run_id).best.text == "0.700 · v9", "read again once it ended"
    publish(4, 0.5)             # (a change of rule on the ended run shows within BEST_REREAD_S: not read now)
    clock[0] += 1
    assert summaries.glance(registry, run_id).best.text == "0.700 · v9"
