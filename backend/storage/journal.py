"""The launch journal: what a launch is about to create, written before its first submission, so a launch its panel
never finished (the process killed between two submissions) is found and rolled back, and a run's jobs are known by
their ids whatever the Hub's job list shows yet.

One record per launch, in two places:
- `<home>/launches/<id>.json`, the panel's own copy: the next panel on the same home (or another one running beside
  it) reads it. While its launch runs, the launching process holds an exclusive lock (`flock`) on `<id>.lock` beside
  it; the kernel drops the lock when that process dies however it dies, so a record still `launching` whose lock can
  be taken was left by a panel that stopped part way (`LaunchJournal.abandoned`).
  A launch takes the lock first (`claim`) and only then looks whether its id is free: a second launch of the same id
  (a retry after a lost answer) never overwrites the first one's record, and finds it (`launch.existing_launch`).
  A sweep holds `<sweep id>.sweep.lock` the same way for the whole of its launch (its record is `sweeps/<id>.json`
  in the bucket, `backend/runs/sweep_launch.py`).
- `runs/<run id>/launch.json` in the run's bucket folder (a run, not a task check): the same record, for every panel
  that sees the run, also one whose home is not this one (the orphan finder reads it).

A record names the executor, its namespace and the bucket, the roles the launch will create (`planned`), each job
id as it is created (`jobs`), and its state: `launching`, then `launched`, `failed` (the launch failed and cancelled
what it had started) or `rolled_back` (a later pass cancelled what an abandoned launch had created). Task checks
(`backend/task/check_job.py`) are recorded the same way with kind `check`: their folder is `checks/<id>/`, removed
with their job. Records of finished launches are kept for a day (a restarted panel cancels by them while the Hub's
list lags), then dropped.
"""

import contextlib
import fcntl
import json
import logging
import os
import time
from dataclasses import dataclass, field

from backend.runtime import layout
from backend.runtime.redact import redact_tokens

log = logging.getLogger(__name__)

JOURNAL_DIR = "launches"
LAUNCH_FILE = "launch.json"        # runs/<run id>/launch.json, the bucket's copy
RUN, CHECK = "run", "check"
LAUNCHING, LAUNCHED, FAILED, ROLLED_BACK = "launching", "launched", "failed", "rolled_back"
KEEP_S = 24 * 3600                 # how long a finished launch's record stays in the home
STOPPED_DURING_LAUNCH = "the panel stopped during launch"


def bucket_copy_path(run_id: str) -> str:
    return f"{layout.run_prefix(run_id)}/{LAUNCH_FILE}"


class UnderWay(RuntimeError):
    """A live process holds the launch's lock: it is launching (or checking) that id right now."""


@dataclass
class Launch:
    """One launch being recorded. Holds its lock from `LaunchJournal.begin` (or `abandoned`) until `close`."""

    journal: "LaunchJournal"
    record: dict
    store: object | None = None        # the run's bucket, for its copy (None: a check, home only)
    _lock_fd: int | None = field(default=None, repr=False)

    @property
    def id(self) -> str:
        return self.record["id"]

    @property
    def jobs(self) -> dict[str, str]:
        return dict(self.record.get("jobs") or {})

    def created(self, role: str, job_id: str) -> None:
        """A job of the launch exists: its id, into both copies before anything else happens. Never raises: the job
        runs whatever is recorded (a lost id is still found by the run's label)."""
        self.record["jobs"] = {**self.jobs, role: job_id}
        self._save(quiet=True)

    def finish(self, state: str, why: str = "") -> None:
        """The launch is over (`launched`, `failed`, `rolled_back`): recorded, then the lock released."""
        self.record.update(state=state, **({"why": redact_tokens(why)} if why else {}))
        try:
            self._save(quiet=True)
        finally:
            self.close()

    def abandon(self, why: str) -> None:
        """Leave the launch `launching` with why it stopped, and release the lock: the next pass rolls it back."""
        self.record["why"] = redact_tokens(why)     # an error's text can quote a token
        try:
            self._save(quiet=True)
        finally:
            self.close()

    def close(self) -> None:
        """Release the lock (the record stays as it is: one still `launching` is rolled back by the next pass)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _save(self, quiet: bool = False) -> None:
        self.record["updated"] = time.time()
        data = json.dumps(self.record, sort_keys=True).encode()
        try:
            layout.atomic_write_bytes(self.journal.path(self.id), data)
            if self.store is not None:
                self.store.write_bytes(bucket_copy_path(self.record["run_id"]), data)
        except Exception as exc:
            if not quiet:
                raise
            log.warning("could not record launch %s: %s", self.id, redact_tokens(str(exc)))


class LaunchJournal:
    """The launches recorded in one panel home."""

    def __init__(self, home: str):
        self.folder = os.path.join(home, JOURNAL_DIR)

    def path(self, launch_id: str) -> str:
        return os.path.join(self.folder, f"{launch_id}.json")

    def claim(self, launch_id: str) -> Launch:
        """Take the launch's lock for this process, writing nothing yet: what the launch finds under it (a run id
        already used, a retry of a launch already made) is decided before anything is recorded, so a second launch
        never overwrites the first one's record. Raises UnderWay when a live process holds it; `close` (or `begin`
        with it, then `finish`) releases it."""
        os.makedirs(self.folder, exist_ok=True)
        fd = os.open(os.path.join(self.folder, f"{launch_id}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise UnderWay(f"a launch of {launch_id} is already under way") from None
        return Launch(self, {"id": launch_id, "jobs": {}}, None, fd)

    def begin(self, kind: str, launch_id: str, *, run_id: str, executor: str, namespace: str | None, bucket: str,
              folder: str, planned: list[str], store=None, claimed: Launch | None = None) -> Launch:
        """Record a launch about to submit `planned` (roles), locked for as long as this process runs it (`claimed`:
        the lock `claim` took already). Raises when it cannot be recorded: nothing may be submitted then."""
        launch = claimed or self.claim(launch_id)
        launch.store = store
        launch.record = {"kind": kind, "id": launch_id, "run_id": run_id, "executor": executor,
                         "namespace": namespace, "bucket": bucket, "folder": folder, "planned": list(planned),
                         "jobs": {}, "state": LAUNCHING, "started": time.time(), "pid": os.getpid()}
        try:
            launch._save()
        except Exception:
            launch.close()
            raise
        return launch

    def records(self) -> list[dict]:
        """Every record in the home (a torn or foreign file is skipped); records older than KEEP_S that are over
        are dropped on the way."""
        found = []
        try:
            names = sorted(os.listdir(self.folder))
        except OSError:
            return []
        for name in names:
            if not name.endswith(".json"):
                continue
            record = _read(os.path.join(self.folder, name))
            if record is None:
                continue
            if record.get("state") != LAUNCHING and time.time() - float(record.get("updated") or 0) > KEEP_S:
                self._drop(record["id"])
                continue
            found.append(record)
        return found

    def get(self, launch_id: str) -> dict | None:
        return _read(self.path(launch_id))

    def under_way(self, launch_id: str) -> bool:
        """Whether a live process holds the launch's lock (its launch, or its check, is still going)."""
        try:
            fd = os.open(os.path.join(self.folder, f"{launch_id}.lock"), os.O_RDWR)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return False
        except OSError:
            return True
        finally:
            os.close(fd)

    def abandoned(self) -> list[Launch]:
        """Launches still `launching` whose process is gone (their lock is free), each now locked by the caller,
        who must `finish` or `close` it."""
        found = []
        for record in self.records():
            if record.get("state") != LAUNCHING:
                continue
            fd = os.open(os.path.join(self.folder, f"{record['id']}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)        # a live process runs this launch
                continue
            fresh = self.get(record["id"])       # read again under the lock: it may have just finished
            if fresh is None or fresh.get("state") != LAUNCHING:
                os.close(fd)
                continue
            found.append(Launch(self, fresh, None, fd))
        return found

    def _drop(self, launch_id: str) -> None:
        for suffix in (".json", ".lock"):
            with contextlib.suppress(OSError):
                os.remove(os.path.join(self.folder, launch_id + suffix))


def _read(path: str) -> dict | None:
    try:
        with open(path, "rb") as f:
            record = json.loads(f.read())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("id"), str) or not isinstance(record.get("jobs"),
                                                                                                dict):
        return None
    return record
