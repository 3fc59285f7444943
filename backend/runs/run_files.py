"""A run's files in its bucket before any job is submitted: spec.json, the runtime code, its reward code and dataset
copy (all or nothing), and the `launch_failed` event a failed submission leaves there."""

import json
import os

from backend.plan.spec import RunSpec
from backend.runs.launch_errors import LaunchError, RunIdTaken, space_or
from backend.runtime import RUNTIME_DIR, layout, records
from backend.runtime.task import is_local_file, local_copy_path
from backend.storage.store import BucketStore

LAUNCH_WRITER = f"{layout.PANEL_WRITER}-launch"


def write_run_files(spec: RunSpec, store: BucketStore) -> None:
    """spec.json, the runtime code, the run's own reward code and dataset file, so the run can always be
    explained, relaunched and resumed, and a job on another machine finds everything in the bucket. All or nothing:
    a write that fails (a full disk) removes what was written, and the launch is refused in one sentence."""
    prefix = layout.run_prefix(spec.run_id)
    try:
        store.ensure_bucket()
        if any(f.path == f"{prefix}/{layout.SPEC_FILE}" for f in store.list_files(prefix)):
            raise RunIdTaken(f"run id {spec.run_id} is already used in bucket {spec.bucket}: preview the run again "
                             "for a new id. No job was submitted.")
    except RunIdTaken:
        raise
    except Exception as exc:
        raise LaunchError(f"could not write the run's files into bucket {spec.bucket}: {space_or(exc, str(exc))}. "
                          "No job was submitted.") from exc
    write_files(spec, store, prefix)


def write_files(spec: RunSpec, store: BucketStore, prefix: str) -> None:
    try:
        store.upload_folder(RUNTIME_DIR, f"{prefix}/{layout.CODE_DIR}/runtime")
        if spec.reward_code.strip():
            store.write_bytes(f"{prefix}/{layout.CODE_DIR}/{layout.USER_REWARDS_MODULE}.py",
                              spec.reward_code.encode())
        if is_local_file(spec.dataset):
            _upload_dataset(spec, store, prefix)
        if spec.eval_source == "file":
            _upload_dataset(spec, store, prefix, held_out=True)
        store.write_bytes(f"{prefix}/{layout.SPEC_FILE}", spec.to_json().encode())
    except Exception as exc:
        left = remove_quietly(store, prefix)
        raise LaunchError(f"could not write the run's files into bucket {spec.bucket}: {space_or(exc, str(exc))}. "
                          f"No job was submitted{left}.") from exc


def remove_quietly(store: BucketStore, prefix: str) -> str:
    """Remove a half-written run folder; '' when it is gone, else what is left and where."""
    try:
        store.delete_folder(prefix)
        return ", and nothing was left in the bucket"
    except Exception as exc:
        return f"; its half-written folder {prefix} could not be removed ({exc})"


def _upload_dataset(spec: RunSpec, store: BucketStore, prefix: str, held_out: bool = False) -> None:
    """The run's own copy of a local dataset file (or of its held-out file): its jobs (and a resume, long after)
    read that one."""
    path = spec.eval_file if held_out else spec.dataset
    source = os.path.expanduser(path)
    if not os.path.isfile(source):
        raise FileNotFoundError(f"{'held-out' if held_out else 'dataset'} file {path} is gone")
    name = os.path.basename(local_copy_path("", path, held_out))
    with open(source, "rb") as f:
        store.write_bytes(f"{prefix}/{layout.DATA_DIR}/{name}", f.read())


def remember_failed_launch(store: BucketStore, run_id: str, message: str, known: list[str]) -> None:
    """A `launch_failed` event in the run's folder: when, why, and the job ids the launch knew of."""
    folder = f"{layout.run_prefix(run_id)}/{layout.EVENTS_DIR}"
    seq = sum(1 for f in store.list_files(folder) if f.path.rsplit("/", 1)[-1].startswith(LAUNCH_WRITER + "-"))
    record = records.event_record(records.LAUNCH_FAILED, message=message, known=known)
    store.write_bytes(f"{folder}/{layout.fragment_name(LAUNCH_WRITER, seq)}", (json.dumps(record) + "\n").encode())
