"""Incremental readers: fragments and adapter versions are read once, torn or half-written data waits."""

import json
import os

import pytest

from backend.runtime.layout import FragmentWriter
from backend.storage.adapters import final_adapter_files, list_adapter_versions
from backend.storage.observers import FragmentCursor, read_new_records
from backend.storage.store import FolderStore

pytestmark = pytest.mark.unit

RUN = "r1"
METRICS = f"runs/{RUN}/metrics"


class CountingStore(FolderStore):
    """A FolderStore that counts the bytes read, to show a refresh reads only what is new."""

    def __init__(self, root):
        super().__init__(root)
        self.bytes_read = 0

    def read_bytes(self, path, start=0):
        data = super().read_bytes(path, start)
        self.bytes_read += len(data)
        return data


def test_fragments_are_read_once_in_order(tmp_path):
    store = CountingStore(tmp_path)
    writer = FragmentWriter(store.local_path(METRICS), "trainer")
    writer.write([{"step": 1}, {"step": 2}])
    cursor = FragmentCursor()
    assert [r["step"] for _, r in read_new_records(store, METRICS, cursor)] == [1, 2]
    first = store.bytes_read
    assert read_new_records(store, METRICS, cursor) == []
    assert store.bytes_read == first, "a second refresh with nothing new must read nothing"
    writer.write([{"step": 3}])
    assert [(w, r["step"]) for w, r in read_new_records(store, METRICS, cursor)] == [("trainer", 3)]


def test_a_torn_last_line_waits_until_it_is_complete(tmp_path):
    store = FolderStore(tmp_path)
    path = store.local_path(f"{METRICS}/trainer-000000.jsonl")
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:
        f.write(json.dumps({"step": 1}) + "\n" + '{"step": 2, "rew')
    cursor = FragmentCursor()
    assert [r["step"] for _, r in read_new_records(store, METRICS, cursor)] == [1]
    assert read_new_records(store, METRICS, cursor) == []
    with open(path, "a") as f:
        f.write('ard": 0.5}\n')
    assert [r for _, r in read_new_records(store, METRICS, cursor)] == [{"step": 2, "reward": 0.5}]


def test_temporary_files_and_other_names_are_not_fragments(tmp_path):
    store = FolderStore(tmp_path)
    folder = store.local_path(METRICS)
    os.makedirs(folder)
    for name in ("_tmpabc", "notes.txt", "trainer-1.jsonl"):
        with open(os.path.join(folder, name), "w") as f:
            f.write('{"step": 9}\n')
    assert read_new_records(store, METRICS, FragmentCursor()) == []


def test_resumed_writer_continues_the_numbering(tmp_path):
    folder = str(tmp_path / "m")
    FragmentWriter(folder, "trainer").write([{"a": 1}])
    FragmentWriter(folder, "trainer").write([{"a": 2}])
    assert sorted(os.listdir(folder)) == ["trainer-000000.jsonl", "trainer-000001.jsonl"]


def _adapter(root, folder, files=("adapter_config.json", "adapter_model.safetensors"), meta=None):
    os.makedirs(os.path.join(root, folder), exist_ok=True)
    for name in files:
        with open(os.path.join(root, folder, name), "wb") as f:
            f.write(b"x" * 100)
    if meta:
        with open(os.path.join(root, folder, "version.json"), "w") as f:
            json.dump(meta, f)


def test_only_complete_adapter_versions_are_listed(tmp_path):
    store = FolderStore(tmp_path)
    base = f"runs/{RUN}"
    _adapter(tmp_path, f"{base}/adapters/trl-policy-v1", meta={"step": 10, "time": 1.0})
    _adapter(tmp_path, f"{base}/adapters/trl-policy-v2", files=("adapter_config.json",))   # half-written
    _adapter(tmp_path, f"{base}/adapters/_tmp-trl-policy-v3")                              # not yet renamed
    _adapter(tmp_path, f"{base}/.vllm_lora/trl-policy-v4")
    versions = list_adapter_versions(store, RUN)
    assert sorted(versions) == [1, 4]
    assert versions[1].step == 10 and versions[1].size_bytes == 200 and versions[1].name == "trl-policy-v1"
    assert list_adapter_versions(store, RUN, known={1, 4}) == {}


def test_final_adapter_appears_only_when_complete(tmp_path):
    store = FolderStore(tmp_path)
    _adapter(tmp_path, f"runs/{RUN}/final", files=("adapter_config.json",))
    assert final_adapter_files(store, RUN) == []
    _adapter(tmp_path, f"runs/{RUN}/final")
    assert {os.path.basename(f.path) for f in final_adapter_files(store, RUN)} == {
        "adapter_config.json", "adapter_model.safetensors"}


def test_store_refuses_paths_that_escape_the_bucket(tmp_path):
    import pytest

    with pytest.raises(ValueError):
        FolderStore(tmp_path / "b").read_bytes("../secret")


def test_a_distributed_runs_engine_event_is_an_event_and_proxy_stats_are_replica_stats(tmp_path):
    from backend.runtime.records import write_event
    from backend.view.runview import RunView

    store = FolderStore(tmp_path)
    run_dir = store.local_path(f"runs/{RUN}")
    engine = "vLLM replicas behind the LoRA-aware proxy (2/2 healthy at start, adapter-only sync)"
    write_event(run_dir, "trainer", "engine", engine=engine, replicas=2, healthy=2)   # carries a `replicas` count
    FragmentWriter(store.local_path(METRICS), "proxy").write([{"time": 1.0, "replicas": [{"url": "a"}]}])
    FragmentWriter(store.local_path(METRICS), "trainer").write([{"step": 1, "reward": 0.5}])
    view = RunView(RUN, store, executor=None, jobs={})
    view.refresh()
    assert view.engine == engine
    assert [r["replicas"] for r in view.replica_stats] == [[{"url": "a"}]]
    assert [r["step"] for r in view.metrics] == [1]


def test_events_of_several_writers_are_read_in_the_order_they_happened(tmp_path):
    from backend.runtime.layout import EVENTS_DIR
    from backend.view.runview import RunView

    store = FolderStore(tmp_path)
    events = store.local_path(f"runs/{RUN}/{EVENTS_DIR}")
    # A restarted panel clears the alert an earlier panel raised; its writer name sorts first.
    FragmentWriter(events, "alerts.ffff").write([{"time": 10.0, "event": "alert", "key": "ratio", "message": "m"}])
    FragmentWriter(events, "alerts.0000").write([{"time": 20.0, "event": "alert_cleared", "key": "ratio"}])
    view = RunView(RUN, store, executor=None, jobs={})
    view.refresh()
    assert [e["event"] for e in view.events] == ["alert", "alert_cleared"]
    assert view.open_alerts == {}
