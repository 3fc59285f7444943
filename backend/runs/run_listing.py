"""A run registry's listing: every run of its executor, newest first, summed up from the executor's jobs (found by
labels) and the home's launch journal, asked at most as often as the registry says and shared by every session's
tick (`RunListing`, part of `registry.RunRegistry`)."""

import time
from dataclasses import dataclass, field

from backend.plan.jobspec import ERROR, TERMINAL_STAGES, JobRecord, run_stage
from backend.storage.journal import FAILED, LAUNCHING, ROLLED_BACK, RUN

FRESH_LIST_AGE_S = 3.0   # a "fresh" run list may be this old: a view of an unknown run id must not relist every tick
SHARED_LIST_AGE_S = 1.0  # a listing this young serves every session's tick (a local one reads each job's files)


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    bucket: str | None
    created_at: float
    jobs: dict[str, str]       # role -> job id (the newest attempt)
    stages: dict[str, str]     # role -> stage
    earlier: dict[str, str] = field(default_factory=dict)   # "<role>#<launch>" -> job id of earlier launches
    timed_out: frozenset[str] = frozenset()    # roles whose newest job ended because it ran past its timeout
    unreadable: frozenset[str] = frozenset()   # roles whose newest job's record could not be read
    launch_failed: bool = False    # its newest launch failed or was rolled back (this home's journal says so)

    @property
    def stage(self) -> str:
        """`jobspec.run_stage` of its newest jobs; ERROR where its newest launch failed (what it had started was
        cancelled)."""
        return ERROR if self.launch_failed else run_stage(self.stages)


class RunListing:
    """What `RunRegistry` knows of its runs from listings: it sets `executor`, `namespace`, `journal`, `list_every_s`,
    `_views` and the listing's own state (`_listed`, `_records`, `_built`, `_final`, `_launch_states`,
    `_list_lock`)."""

    def knows(self, run_id: str) -> bool:
        """Whether this registry has seen the run (an open view, its last listing, this home's record of its launch),
        asking nobody: what the panel can tell of the runs of namespaces the asking visitor does not reach."""
        return (run_id in self._views or run_id in self._records or self.recorded_launch(run_id) is not None)

    def forget_listing(self) -> None:
        self._listed = (0.0, [])

    def list_runs(self, fresh: bool = False) -> list[RunSummary]:
        """Every run of this executor, newest first. `fresh` asks again unless the list is a few seconds old; any
        list serves the callers of the same second (sessions ticking together: one listing, not one each)."""
        max_age = (min(FRESH_LIST_AGE_S, self.list_every_s) if fresh else self.list_every_s) or SHARED_LIST_AGE_S
        listed_at, cached = self._listed
        if time.time() - listed_at < max_age:
            return cached
        with self._list_lock:        # asked at once: the first one lists, the others take its list
            listed_at, cached = self._listed
            if time.time() - listed_at < max_age:
                return cached
            return self._list_runs()

    def _list_runs(self) -> list[RunSummary]:
        jobs = self.executor.list_jobs()                # newest first
        kept_jobs, summaries = self._final
        if jobs is not kept_jobs:       # not the executor's same final list (local: every job ended, none came)
            summaries = self._summaries_of(jobs)
        self._listed = (time.time(), summaries)
        return summaries

    def _summaries_of(self, jobs: list[JobRecord]) -> list[RunSummary]:
        """Every run's summary, newest first; a run whose records are the same objects as last time keeps its own."""
        records: dict[str, list[JobRecord]] = {}
        for rec in jobs:
            records.setdefault(rec.run_id, []).append(rec)
        records = {run_id: own_jobs(recs) for run_id, recs in records.items()}
        summaries, built, all_settled = [], {}, True
        for run_id, recs in records.items():
            kept = self._built.get(run_id)
            # An ended job's record is the executor's same object from listing to listing: a run whose records are
            # all the same as last time has the same summary (a listing costs the runs that changed).
            if kept is not None and len(kept[0]) == len(recs) and all(a is b for a, b in zip(kept[0], recs)):
                summary = kept[1]
            else:
                summary, settled = self._summary(run_id, recs)
                if not settled:     # its launch is being rolled back: asked again at the next listing
                    all_settled = False
                    summaries.append(summary)
                    continue
            built[run_id] = (recs, summary)
            summaries.append(summary)
        summaries.sort(key=lambda r: r.created_at, reverse=True)
        self._records, self._built = records, built
        self._final = (jobs, summaries) if all_settled else (None, [])
        return summaries

    def _summary(self, run_id: str, recs: list[JobRecord]) -> tuple[RunSummary, bool]:
        """A run's summary from its job records (newest first): each role's newest job, the earlier launches; and
        whether it is settled (False while the journal says its launch is being rolled back)."""
        run = {"bucket": recs[0].bucket, "created_at": recs[0].created_at, "jobs": {}, "stages": {}, "earlier": {},
               "timed_out": frozenset(), "unreadable": frozenset()}
        older: dict[str, list[str]] = {}        # role -> job ids of earlier launches, newest first
        for rec in recs:
            if rec.role in run["jobs"]:
                older.setdefault(rec.role, []).append(rec.job_id)
            else:
                for flag in ("timed_out", "unreadable"):
                    if getattr(rec, flag):
                        run[flag] |= {rec.role}
            run["jobs"].setdefault(rec.role, rec.job_id)
            run["stages"].setdefault(rec.role, rec.stage)
            run["created_at"] = min(run["created_at"], rec.created_at)
            run["bucket"] = run["bucket"] or rec.bucket
        run["earlier"] = {f"{role}#{n}": job_id for role, ids in older.items()
                          for n, job_id in enumerate(reversed(ids), start=1)}
        settled = True
        if all(stage in TERMINAL_STAGES for stage in run["stages"].values()):
            jobs = tuple(sorted(run["jobs"].values()))
            run["launch_failed"] = self._launch_failed(run_id, jobs)
            settled = (run_id, jobs) in self._launch_states
        return RunSummary(run_id, **run), settled

    def job_records(self, run_id: str) -> list[JobRecord]:
        """Every job of the run (each launch and resume) as a listing at most a few seconds old saw it (the runs
        list asks this for every run it shows: one listing serves them all), newest first."""
        if time.time() - self._listed[0] > FRESH_LIST_AGE_S:
            self.list_runs()
        return list(self._records.get(run_id, []))

    def has_run(self, run_id: str, fresh: bool = False) -> bool:
        return (run_id in self._views or self.recorded_launch(run_id) is not None
                or any(r.run_id == run_id for r in self.list_runs(fresh=fresh)))

    def _launch_failed(self, run_id: str, jobs: tuple[str, ...]) -> bool:
        """Whether the home's journal says the launch of these (ended) jobs failed or was rolled back; read once
        per run and set of jobs (a resume's new jobs are asked again), so a listing reads no file twice."""
        key = (run_id, jobs)
        if key not in self._launch_states:
            record = self.recorded_launch(run_id) or {}
            if record.get("state") == LAUNCHING:
                return False        # being rolled back right now: asked again next time
            self._launch_states[key] = record.get("state") in (FAILED, ROLLED_BACK)
        return self._launch_states[key]

    def recorded_launch(self, run_id: str) -> dict | None:
        """The home's record of the run's newest launch through this registry's executor and namespace, if any:
        its bucket and job ids, known at once, whatever the executor's job list shows yet."""
        record = self.journal.get(run_id) if self.journal is not None else None
        if record is None or record.get("kind") != RUN or record.get("executor") != self.executor.name \
                or record.get("namespace") != self.namespace:
            return None
        return record

    def run_bucket(self, run_id: str) -> str:
        """The bucket that holds the run's folder (its jobs' records, else this home's record of its launch); raises
        KeyError for a run this registry does not know."""
        summary = next((r for r in self.list_runs() if r.run_id == run_id), None)
        bucket = summary.bucket if summary is not None else None
        bucket = bucket or (self.recorded_launch(run_id) or {}).get("bucket")
        if not bucket:
            raise KeyError(f"no run {run_id!r}")
        return bucket


def own_jobs(records: list[JobRecord]) -> list[JobRecord]:
    """A run's jobs (newest first) among those labelled with its id: the ones that write its bucket, the bucket of its
    first job. A job labelled with the id but writing another bucket is another run's under a reused id (made outside
    the panel): it is neither shown nor cancelled as this run's."""
    buckets = [r.bucket for r in records if r.bucket]
    if not buckets:
        return records
    first = buckets[-1]
    return [r for r in records if r.bucket in (None, first)]
