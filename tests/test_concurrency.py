"""Many browser sessions on one panel: shared views refresh safely, and what the panel keeps stays bounded."""

import os
import sys
import threading

import pytest

from backend.executors.hf_jobs import _Feed
from backend.executors.local import LocalExecutor
from backend.plan.jobspec import JobSpec, VolumeSpec
from backend.runs.registry import RunRegistry
from backend.runtime import layout
from backend.storage.hub_store import trim_cache
from backend.storage.store import FolderStore

pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_sessions_refreshing_one_run_at_once_never_duplicate_a_line_or_an_event(tmp_path):
    executor = LocalExecutor(str(tmp_path))
    store = FolderStore(executor.bucket_root("local/runs"))
    run_dir = store.local_path(layout.run_prefix("r1"))
    script = ("import sys, time\nfrom backend.runtime.records import write_event\n"
              f"for i in range(300):\n    print(f'line {{i}}', flush=True)\n"
              f"    if i % 10 == 0: write_event({run_dir!r}, 'trainer', 'attempt', role='trainer', i=i)\n"
              "    time.sleep(0.005)\n")
    job = JobSpec(run_id="r1", role="trainer", image="local", command=[sys.executable, "-c", script],
                  flavor="local", timeout_s=60, env={"PYTHONPATH": ROOT},
                  volumes=(VolumeSpec("local/runs", "/mnt/runs"),))
    registry = RunRegistry(executor, lambda bucket: store)
    job_id = executor.submit(job)
    view = registry.view("r1")
    stop = threading.Event()

    def session():
        while not stop.is_set():
            view.refresh()

    sessions = [threading.Thread(target=session) for _ in range(6)]
    for t in sessions:
        t.start()
    executor.wait(job_id, 60)
    stop.set()
    for t in sessions:
        t.join()
    view.refresh()
    assert list(view.jobs["trainer"].logs) == [f"line {i}" for i in range(300)]
    assert [e["i"] for e in view.events] == list(range(0, 300, 10))
    executor.cancel_all()


def test_a_job_stream_buffer_keeps_the_newest_items_and_counts_from_the_start():
    feed = _Feed(limit=3)
    for i in range(5):
        feed.append(i)
    assert feed.count == 5 and list(feed.items) == [2, 3, 4]
    assert feed.since(0) == ([2, 3, 4], 5), "a reader that fell behind loses only the oldest"
    assert feed.since(4) == ([4], 5)
    assert feed.since(5) == ([], 5)


def test_the_bucket_file_cache_drops_the_least_recently_used_past_its_size(tmp_path):
    for i, name in enumerate(["old", "mid", "new"]):
        path = tmp_path / name
        path.write_bytes(b"x" * 100)
        os.utime(path, (1000 + i, 1000 + i))
    trim_cache(str(tmp_path), max_bytes=200, keep={str(tmp_path / "old")})
    assert sorted(os.listdir(tmp_path)) == ["new", "old"], "the entry in use stays, the next oldest goes"
