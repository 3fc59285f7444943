"""The bucket layout of a run: the one contract between jobs that write and the panel that reads.

    runs/<run_id>/spec.json                     the RunSpec, as launched (no secrets)
    runs/<run_id>/launch.json                   the panel's record of the newest launch (backend/storage/journal.py)
    runs/<run_id>/code/runtime/...              the runtime code that ran
    runs/<run_id>/code/user_rewards.py          the run's own reward functions, if it has any
    runs/<run_id>/data/<file>                   the run's own dataset file (.jsonl or .parquet), if it has one
    runs/<run_id>/metrics/<writer>-<seq>.jsonl  write-once metric fragments, one record per logging step
    runs/<run_id>/adapters/trl-policy-v<N>/     LoRA adapter versions, published by atomic rename
    runs/<run_id>/.vllm_lora/trl-policy-v<N>/   (distributed runs) versions TRL's async trainer syncs to vLLM
                                                (a sweep member's: trl-policy-<member>-v<N>, `adapter_name`)
    runs/<run_id>/checkpoints/                  trainer checkpoints, for resume
    runs/<run_id>/final/                        the last adapter, written when training ends
    runs/<run_id>/samples/<writer>-<seq>.jsonl  write-once fragments of a few completions per step, one fragment
                                                per flush like metrics (runs written before: one per step)
    runs/<run_id>/base-model/                   a builtin model, built by the first job that needs it
    runs/<run_id>/events/<writer>-<seq>.jsonl   write-once event fragments (started, adapter_published,
                                                finished, failed, ...: records.py declares every kind)
    runs/<run_id>/heartbeat/trainer.json        the distributed trainer's heartbeat, replaced every few seconds
    runs/<run_id>/evals/<writer>-<seq>.jsonl    write-once held-out evaluation fragments, one record per evaluated
                                                adapter version (runtime/trainer/evaluate.py says what a record holds)
    runs/<run_id>/best/                         the adapter of the best-scoring version so far, with best.json
    runs/<run_id>/trackio/                      (RunSpec `trackio`, no Space named) trackio's own folder: its
                                                SQLite project database, written by trackio, read by trackio only
    sweeps/<sweep_id>.json                      a sweep's record: its members' run ids by tag, what was swept
                                                (`sweep_record_path`; written by the panel before the members launch)
    runs/<fleet>/fleet.json                     a sweep's shared fleet (its id is the sweep's; no spec.json): the
                                                sweep, its members, --max-loras and --max-lora-rank; beside it the
                                                fleet's code/, events/ (its replicas' ends) and a builtin base-model/
                                                that every member's trainer and the fleet's replicas use

Every file is written once: to a temporary name beside its destination, then renamed. Readers ignore
names that start with "." or "_tmp" (except `.vllm_lora`, a TRL name) and adapter folders without both
adapter files.
"""

import contextlib
import json
import os
import re
import shutil
import tempfile

RUNS_DIR = "runs"
SPEC_FILE = "spec.json"
FLEET_FILE = "fleet.json"      # a sweep's shared fleet's record in its folder runs/<fleet>/ (no spec.json there)
NOTES_FILE = "notes.json"      # the run's notes and tags, written by the panel (`backend/runs/notes.py`)
SWEEPS_DIR = "sweeps"
CODE_DIR = "code"
USER_REWARDS_MODULE = "user_rewards"    # code/user_rewards.py, imported by the trainer as a module
DATA_DIR = "data"
METRICS_DIR = "metrics"
EVENTS_DIR = "events"
SAMPLES_DIR = "samples"
ADAPTERS_DIR = "adapters"
VLLM_LORA_DIR = ".vllm_lora"
CHECKPOINTS_DIR = "checkpoints"
FINAL_DIR = "final"
HEARTBEAT_DIR = "heartbeat"
EVALS_DIR = "evals"
BEST_DIR = "best"
BEST_FILE = "best.json"
ADAPTER_META_FILE = "version.json"
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
# What a download or a push takes from an adapter's folder: PEFT's own files (its config, its weights in either
# format) and the version record; anything else a run's jobs put there (a README, a link, a subfolder) stays.
SHIPPED_ADAPTER_FILES = (*ADAPTER_FILES, "adapter_model.bin", ADAPTER_META_FILE)
ROLLOUT_STATE_FILE = "rollout_state.json"   # in an async trainer's checkpoint: TRL's policy version at that step

TRACKIO_DIR = "trackio"                # trackio's folder (TRACKIO_DIR) when a run logs to trackio without a Space
# A sweep member's trainer on its sweep's shared fleet: the fleet's folder, where the replicas record their ends.
FLEET_DIR_ENV = "GRPO_FLEET_DIR"
BASE_MODEL_DIR = "base-model"          # a builtin model, built into the run folder by the first job that needs it

# Writers: the `<writer>` of a fragment's name. Readers pick some out by name.
TRAINER_WRITER = "trainer"      # both trainers: metrics, events, samples, the heartbeat
PROXY_WRITER = "proxy"          # the proxy's per-replica snapshots
CANARY_WRITER = "canary"        # the proxy's proofs that a replica serves the version it loaded
LOADS_WRITER = "adapter-loads"  # the proxy's seconds per replica for each adapter load it broadcast
PANEL_WRITER = "panel"          # prefix of the panel's own event writers (`panel-budget`, ...)
REPLICA_WRITER = "replica"      # prefix of a replica job's event writer (`replica-vllm-0`)

ADAPTER_BASE = "trl-policy"   # TRL's async trainer names each synced version `<its _lora_name>-v<N>`: this is TRL's own
# A sweep member's tag (RunSpec `sweep_member`): its versions are `trl-policy-<member>-v<N>`, so N runs on one replica
# fleet never share a name (vLLM serves an adapter by name: a shared one would give a run its neighbour's policy).
MEMBER_RE = re.compile(r"^[a-z0-9]{1,12}$")
# Neither pattern takes a name starting with "." or "_tmp": a file or folder on its way to its final name.
ADAPTER_NAME_RE = re.compile(r"^trl-policy(?:-(?P<member>[a-z0-9]{1,12}))?-v(?P<version>\d+)$")
FRAGMENT_RE = re.compile(r"^(?!\.|_tmp)(?P<writer>[A-Za-z0-9_.-]+)-(?P<seq>\d{6})\.jsonl$")


def run_prefix(run_id: str) -> str:
    """Path of a run's folder relative to the bucket root."""
    return f"{RUNS_DIR}/{run_id}"


def sweep_record_path(sweep_id: str) -> str:
    """Path of a sweep's record relative to the bucket root (`SweepSpec.record`)."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", sweep_id or ""):
        raise ValueError(f"not a sweep id: {sweep_id!r:.80}")
    return f"{SWEEPS_DIR}/{sweep_id}.json"


def adapter_base(member: str = "") -> str:
    """The name TRL's trainer numbers versions under: `trl-policy` for a lone run, `trl-policy-<member>` for a sweep
    member. The one place a version's name is made: the trainer's sync, the proxy, the readers and the bucket's
    version folders all go through it (or `adapter_name`)."""
    if member and not MEMBER_RE.match(member):
        raise ValueError(f"a sweep member's tag is 1-12 lowercase letters or digits, not {member!r}")
    return f"{ADAPTER_BASE}-{member}" if member else ADAPTER_BASE


def adapter_name(version: int, member: str = "") -> str:
    """Version `version`'s name (and folder name): `trl-policy-v7`, or `trl-policy-<member>-v7` in a sweep."""
    return f"{adapter_base(member)}-v{version}"


def adapter_version(name: str, member: str | None = None) -> int | None:
    """The version number in an adapter version's name; None for any other name, and, where `member` is given
    ("" for a lone run), for another member's version."""
    match = ADAPTER_NAME_RE.match(name) if isinstance(name, str) else None
    if not match or (member is not None and (match.group("member") or "") != member):
        return None
    return int(match.group("version"))


def adapter_member(name: str) -> str | None:
    """The sweep member an adapter version's name belongs to ("" for a lone run's), None for any other name."""
    match = ADAPTER_NAME_RE.match(name) if isinstance(name, str) else None
    return (match.group("member") or "") if match else None


def spec_member(spec: dict) -> str:
    """A run's sweep member tag from its spec (RunSpec `sweep_member`; "" for a lone run or an older spec)."""
    member = spec.get("sweep_member") if isinstance(spec, dict) else None
    return member if isinstance(member, str) else ""


def run_adapter_name(spec: dict, version: int) -> str:
    """Version `version`'s name in the run whose spec (spec.json, or a RunView's `spec`) is `spec`."""
    return adapter_name(version, spec_member(spec))


def fragment_name(writer: str, seq: int) -> str:
    return f"{writer}-{seq:06d}.jsonl"


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write `data` to `path` so that a reader sees either nothing or the whole file."""
    atomic_write_chunks(path, (data,))


def atomic_write_chunks(path: str, chunks) -> None:
    """`atomic_write_bytes` of the bytes `chunks` yields, written as they come (a long file is never held whole)."""
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="_tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise



@contextlib.contextmanager
def publish_folder(dest: str, *, replace: bool = True, prefix: str = "_tmp-"):
    """Publish a folder whole: yields a new folder beside `dest` (its name starts with `_tmp`, which readers skip)
    and renames it to `dest` once the block ends without error, so a reader sees nothing or all of it.

    With `replace`, a folder already at `dest` (final/ again after a resume: rename cannot replace a non-empty
    folder) is moved aside first and put back if the job stops between the two renames. Without it the rename
    raises OSError when `dest` is already there, and the caller decides whether that is another writer's copy."""
    parent = os.path.dirname(os.path.abspath(dest))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=prefix, dir=parent)
    old = None
    try:
        yield tmp
        if replace and os.path.exists(dest):
            old = tempfile.mkdtemp(prefix="_tmp-old-", dir=parent)
            os.rename(dest, os.path.join(old, "previous"))
        os.rename(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if old:
            if not os.path.exists(dest):  # stopped between the two renames: put the previous folder back
                os.rename(os.path.join(old, "previous"), dest)
            shutil.rmtree(old, ignore_errors=True)


class FragmentWriter:
    """Writes JSONL records as numbered write-once fragments (object storage cannot append)."""

    def __init__(self, folder: str, writer: str):
        self.folder = folder
        self.writer = writer
        self.seq = self._next_seq()

    def _next_seq(self) -> int:
        # A resumed trainer continues the numbering instead of overwriting earlier fragments.
        seqs = [0]
        if os.path.isdir(self.folder):
            for name in os.listdir(self.folder):
                m = FRAGMENT_RE.match(name)
                if m and m.group("writer") == self.writer:
                    seqs.append(int(m.group("seq")) + 1)
        return max(seqs)

    def write(self, records: list[dict]) -> str | None:
        if not records:
            return None
        body = "".join(json.dumps(r, default=float, allow_nan=True) + "\n" for r in records)
        path = os.path.join(self.folder, fragment_name(self.writer, self.seq))
        atomic_write_bytes(path, body.encode())
        self.seq += 1
        return path


def fragment_records(data: bytes) -> tuple[list[dict | None], int]:
    """The one parser of every JSONL the bucket holds: the complete lines of a fragment's bytes as records (None
    for a line that is not a JSON object, for the reader to skip and count), and the offset where they end (a torn
    last line is left for the next read)."""
    end = data.rfind(b"\n") + 1
    lines = [line for line in data[:end].splitlines() if line.strip()]
    try:        # one parse for the whole fragment; line by line only when something in it is not JSON
        decoded = json.loads(b"[" + b",".join(lines) + b"]")
    except ValueError:
        decoded = []
    if len(decoded) != len(lines):      # two torn lines can join into one valid value: read them one by one
        decoded = [_json_value(line) for line in lines]
    return [record if isinstance(record, dict) else None for record in decoded], end


def _json_value(line: bytes):
    try:
        return json.loads(line)
    except ValueError:
        return None


def rollout_state_version(data: bytes | str | None) -> int:
    """The policy version (`model_version`) in an async checkpoint's rollout_state.json; 0 where it is unreadable:
    the trainer then resumes as from no checkpoint, and the panel's resume preview must say the same."""
    try:
        return int(json.loads(data).get("model_version", 0))
    except (TypeError, ValueError, AttributeError):
        return 0


def reward_function_keys(keys) -> list[str]:
    """The canonical per-function reward keys, `rewards/<func>`, among a record's keys (TRL's raw
    `rewards/<func>/mean` and `/std`, kept beside them, are not functions)."""
    return sorted(k for k in keys if k.startswith("rewards/") and "/" not in k[len("rewards/"):])
