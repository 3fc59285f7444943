"""The dashboard never loses rows: timer ticks drawing, a trainer writing and first opens of a long run (each
reading its history in the background) all at once, then every series drawn compared with the bucket's rows."""

import os
import sys
import threading
import time

import pytest

from backend.executors.local import LocalExecutor
from backend.runtime import layout
from backend.storage.observers import FragmentReader
from backend.storage.series import SeriesTable
from backend.storage.store import FolderStore
from backend.view.run_records import _with_band
from backend.view.runview import RunView
from panel import chart_parts, dashboard, run_header

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from dashboard_scale import SyntheticRun

pytestmark = [pytest.mark.integration, pytest.mark.full]

ROWS = 3000          # past HISTORY_TAIL_FRAGMENTS * 10: a first look defers the older rows to a background read
OPENS = 4            # first opens, one after another, each with its own sessions ticking
SESSIONS = 3         # sessions ticking each view, each on its own x axis (so each draws sketches of its own)
TICKS = 8            # ticks per session


class SlowStore(FolderStore):
    """A folder bucket whose reads yield the processor, as a loaded machine or a remote bucket would: the history's
    background read then overlaps the sessions' ticks."""

    def read_bytes(self, path, start=0):
        time.sleep(0.0005)
        return super().read_bytes(path, start)


def _session(view, x: str, errors: list) -> None:
    """One browser session: refresh (when due) and draw, TICKS times, as a timer tick does."""
    try:
        for _ in range(TICKS):
            view.expire()
            view.refresh_if_due()
            dashboard.build_frame(view, chart_parts.ChartOptions(x=x, t0=view.table.times[0] if len(view.table) else 0))
    except Exception as e:  # every failure of a tick is the test's finding
        errors.append(f"tick ({x}): {type(e).__name__}: {e}")


def _writer(run: SyntheticRun, stop: threading.Event) -> None:
    while not stop.is_set():
        run.grow(10)
        time.sleep(0.02)


def test_ticks_a_writer_and_first_opens_together_draw_every_row_of_the_bucket(tmp_path, caplog):
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)      # threads trade places often, as on a machine whose cores are all busy
    run = SyntheticRun(str(tmp_path), ROWS)
    executor = LocalExecutor(str(tmp_path))
    store = SlowStore(executor.bucket_root("local/bench"))
    stop, errors, views = threading.Event(), [], []
    writer = threading.Thread(target=_writer, args=(run, stop), daemon=True)
    writer.start()
    try:
        for _ in range(OPENS):
            view = RunView(run.spec.run_id, store, executor, run.job_ids)
            view.min_refresh_s = 0
            sessions = [threading.Thread(target=_session, args=(view, x, errors), daemon=True)
                        for x in ("step", "time", "step")[:SESSIONS]]
            for thread in sessions:
                thread.start()
            for thread in sessions:
                thread.join(120)
            views.append(view)
    finally:
        stop.set()
        writer.join(30)
        sys.setswitchinterval(switch)
    assert not errors, errors[:5]
    assert not [r for r in caplog.records if "history" in r.getMessage()], "a history read failed"

    metrics = f"{layout.run_prefix(run.spec.run_id)}/{layout.METRICS_DIR}"
    whole = SeriesTable()            # the bucket's rows, read in one go (with the reward's band, as a view adds it)
    reader = FragmentReader(FolderStore(store.root), metrics, check=lambda r: "step" in r)
    whole.extend([_with_band(r) for _, r in reader.read()])
    assert len(whole) == run.step
    for i, view in enumerate(views):
        assert view.wait_for_history(60), f"open {i}: its history was never read"
        view.refresh()
        assert list(view.table.steps) == list(whole.steps), f"open {i}: rows lost or doubled"
        assert view.table.drawn(), f"open {i}: nothing drawn"
        for key, axis in view.table.drawn():
            assert view.table.sketch(key, axis).points() == whole.sketch(key, axis).points(), \
                f"open {i}: {key} against {axis} is drawn unlike the bucket's rows"
        usage = view.jobs["trainer"].usage.table
        assert list(usage.times) == [run.t0 + step for step in range(1, run.step + 1)], f"open {i}: samples lost"


class FailingStore(FolderStore):
    """A folder bucket whose first `failures` reads from a background thread fail, as a bucket that does not answer."""

    def __init__(self, root, failures: int):
        super().__init__(root)
        self.failures, self.main = failures, threading.get_ident()

    def read_bytes(self, path, start=0):
        if threading.get_ident() != self.main and self.failures > 0:
            self.failures -= 1
            raise OSError("the bucket did not answer")
        return super().read_bytes(path, start)


def test_a_failed_history_read_is_said_and_tried_again_until_every_row_is_in(tmp_path, monkeypatch):
    from backend.view import run_history

    monkeypatch.setattr(run_history, "HISTORY_RETRY_S", 0.2)
    run = SyntheticRun(str(tmp_path), ROWS)
    executor = LocalExecutor(str(tmp_path))
    store = FailingStore(executor.bucket_root("local/bench"), failures=2)
    view = RunView(run.spec.run_id, store, executor, run.job_ids)
    view.refresh()
    first = int(view.table.steps[0])
    view.history.rows_thread.join(30)
    assert view.history_failure == "OSError: the bucket did not answer"
    status = run_header.status_markdown(view)
    assert f"Could not read the run's earlier history before step {first} (OSError" in status, status
    assert view.history_pending, "the rows it did not bring are still to read"
    assert view.wait_for_history(60)
    assert list(view.table.steps) == list(range(1, ROWS + 1)), "every row, once"
    assert not view.history_failure and "earlier history" not in run_header.status_markdown(view)
