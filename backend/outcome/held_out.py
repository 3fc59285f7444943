"""The held-out evaluation of a run as the panel reads it: each version's score, its samples and the best version.

The trainer evaluates each published version on the run's held-out prompts and writes one record per version into
`evals/` (write-once fragments, `layout.EVALS_DIR`); the best-scoring version so far is republished whole as `best/`
with `best/best.json` saying why, so it survives TRL deleting old serving copies. `HeldOut` reads both with a
cursor, like the metrics, and keeps the versions ranked under the run's rule as records arrive (`ranking.Ranking`).
"""

import json
import math
import posixpath
import time
from collections import OrderedDict
from dataclasses import dataclass

from backend.outcome.ranking import Ranking
from backend.runtime import layout
from backend.runtime.best_rule import rule_score, why_text
from backend.runtime.redact import redact_record
from backend.storage.adapters import adapter_folder_files
from backend.storage.observers import FragmentReader
from backend.storage.series import Sketch
from backend.storage.store import BucketStore, StoredFile

SAMPLE_VERSIONS_KEPT = 100      # versions whose held-out samples a view keeps (the newest)
# The held-out chart draws at most 2 * CHART_GROUPS + CHART_NEWEST versions besides the base model and the best: the
# newest as they are, the rest as the lowest and highest of groups of versions (a `Sketch` of their scores). About
# what a 1,000-step run's 50 versions draw whole, so its tick (this chart is redrawn with the training reward behind
# it) costs the same at any length.
CHART_GROUPS, CHART_NEWEST = 20, 10
RANK_ONE_BY_ONE = 64            # more new records than this at once are ranked anew, not inserted one by one
BEST_RECHECK_S = 10.0           # how often best/ is looked at again while it lags behind the scores read


@dataclass(frozen=True)
class HeldOutScore:
    version: int
    step: int
    score: float
    score_std: float | None
    n_prompts: int | None
    rewards: dict             # reward name -> {"mean", "std", "weight", "solved"}


def finite_number(value) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def is_eval_record(record: dict) -> bool:
    """One evaluated version: an integer version and step and a finite score (anything else is skipped, counted)."""
    return (type(record.get("policy_version")) is int and record["policy_version"] >= 0
            and type(record.get("step")) is int and finite_number(record.get("score")))


class HeldOut:
    """The held-out scores of one run's versions, their samples and the best version, read incrementally."""

    def __init__(self, store: BucketStore, run_id: str, tail: int | None = None):
        """`tail`: how many of the newest evaluation fragments a first look at a long run reads (with the base
        model's); the older ones are set aside for `take_older`, `read_older` and `join_older` (a RunView reads them
        in the background). None: every record is read at once."""
        self.store, self.run_id = store, run_id
        self.prefix = layout.run_prefix(run_id)
        self.reader = FragmentReader(store, f"{self.prefix}/{layout.EVALS_DIR}", check=is_eval_record,
                                     defer={layout.TRAINER_WRITER: tail} if tail else None)
        self._joining = False                   # older records taken to be read in the background, not joined yet
        self.scores: dict[int, HeldOutScore] = {}
        self.records: dict[int, dict] = {}       # version -> its record without samples (what the chart draws)
        self.samples: OrderedDict[int, list[dict]] = OrderedDict()     # version -> its held-out samples
        self.best_json: dict = {}
        self._best_files: list[StoredFile] = []
        self._best_read_at = float("-inf")
        self.rule: dict[str, float] = {}        # best_by in force ({}: the trained rewards' weighted score)
        self.member = ""                        # the run's sweep member tag, once its spec is read (RunView)
        self._ranked: tuple = (None, None)      # (best version, version 0's score) under the rule, or None: stale
        self._sketch = Sketch(CHART_GROUPS, CHART_NEWEST)    # (version, score) of every version, for the chart
        self._scored: dict[int, float | None] = {}     # version -> its score under the rule, kept as records arrive
        self._ranking = Ranking()                      # the same scores of versions >= 1, highest first
        self.span: tuple[int, int] | None = None       # (the first, the newest version evaluated), kept as they arrive

    @property
    def unreadable(self) -> dict[str, int]:
        return dict(self.reader.cursor.bad)

    def refresh(self, full: bool = False) -> bool:
        """Read new evaluation records; look at best/ again when there were any. Whether anything changed. A first
        look at a long run reads the newest records and the base model's (v0: the baseline) only."""
        first, pending = self.reader.listed_at == float("-inf"), self.older_pending
        new = [record for _writer, record in self.reader.read(full)]
        if first and self.reader.looking_back and 0 not in self.scores:
            new += self._base_records()
        self._add(new)
        if self.older_pending != pending:
            self._ranked = None         # best.json no longer stands in for the records (or now does)
        # best/ is republished just after the record of the version that beat it: while best.json names another
        # version than the highest score read, look again now and then.
        stale = self.best_version is not None and self.best_json.get("policy_version") != self.best_version
        due = stale and time.monotonic() - self._best_read_at >= BEST_RECHECK_S
        if not new and not (full and self.scores) and not due:
            return False
        self._best_read_at = time.monotonic()
        return self._read_best() or bool(new)

    def _add(self, new: list[dict], samples: bool = True) -> None:
        """Evaluation records read (newest last), into the scores, the chart's records and the ranking; their
        samples too unless `samples` is False (older records: the newest versions' samples are the ones kept)."""
        if not new:
            return
        self._ranked = None
        # A new mapping, not one changed in place: a frame being drawn holds the old one.
        self.records = {**self.records, **{r["policy_version"]: redact_record(_chart_record(r)) for r in new}}
        self._sketch_scores(new)
        versions = [r["policy_version"] for r in new]
        first, newest = self.span or (min(versions), max(versions))
        self.span = min(first, *versions), max(newest, *versions)
        for record in new:
            version = record["policy_version"]
            std = record.get("score_std")
            rewards = record.get("rewards") if isinstance(record.get("rewards"), dict) else {}
            self.scores[version] = HeldOutScore(version, record["step"], float(record["score"]),
                                                float(std) if finite_number(std) else None,
                                                record.get("n_prompts") if type(record.get("n_prompts")) is int
                                                else None, redact_record(rewards))
            self._scored[version] = self._score_of(self.scores[version])
            if len(new) <= RANK_ONE_BY_ONE:
                self._ranking.put(version, self._scored[version])
            if not samples:
                continue
            kept = [redact_record(s) for s in record.get("samples") or [] if _is_sample(s)]
            self.samples.pop(version, None)
            self.samples[version] = kept
            while len(self.samples) > SAMPLE_VERSIONS_KEPT:
                self.samples.popitem(last=False)
        if len(new) > RANK_ONE_BY_ONE:     # a long run's older records: ranked once, not inserted one by one
            self._ranking = Ranking(self._scored)

    def _base_records(self) -> list[dict]:
        """The base model's record for a first look that read only the newest ones: the trainer evaluates it first,
        so it is in the first fragment (read again with the older ones, then kept as read here)."""
        path = f"{self.reader.folder}/{layout.fragment_name(layout.TRAINER_WRITER, 0)}"
        try:
            decoded, _end = layout.fragment_records(self.store.read_bytes(path))
        except (OSError, KeyError):
            return []
        return [r for r in decoded if r is not None and is_eval_record(r) and r["policy_version"] == 0]

    # ---- the older records of a long run, read in the background (`RunHistory.start`)
    @property
    def older_pending(self) -> bool:
        """Whether older records a first look left for later are still being found, read or joined: until they are,
        the best version is ranked over the records read and the version best.json names."""
        return self.reader.looking_back or bool(self.reader.deferred) or self._joining

    def take_older(self) -> list:
        """The older fragments to read now (called under the view's lock); `join_older` or `give_back` follows."""
        fragments, self.reader.deferred = self.reader.deferred, []
        self._joining = bool(fragments)
        return fragments

    def read_older(self, fragments: list) -> list[dict]:
        """The records of `fragments`, oldest first (in a thread of its own: no state of this object changes)."""
        return [record for batch in self.reader.read_deferred(fragments) for _writer, record in batch]

    def join_older(self, older: list[dict]) -> None:
        """Older records joined (called under the view's lock): a version read since keeps what was read since (a
        resumed run evaluating it again)."""
        self._joining, self._ranked = False, None
        self._add([r for r in older if r["policy_version"] not in self.scores], samples=False)

    def give_back(self, fragments: list) -> None:
        """A background read failed: its fragments wait for the next try."""
        self.reader.deferred = [*fragments, *self.reader.deferred]
        self._joining, self._ranked = False, None

    def _published(self) -> dict[int, float]:
        """While older records are still unread: the best version best.json names and the base model's score it
        quotes, where it was published under the rule in force, as the scores the records would give them."""
        best = self.best_json
        if not self.older_pending or not best or (best.get("best_by") or {}) != self.rule:
            return {}
        out = {best["policy_version"]: best.get("score"), 0: best.get("baseline")}
        return {v: float(score) for v, score in out.items() if finite_number(score)}

    def adapter_name(self, version: int) -> str:
        """Version `version`'s name in this run (`layout.adapter_name` with the run's sweep member tag)."""
        return layout.adapter_name(version, self.member)

    def _sketch_scores(self, new: list[dict]) -> None:
        """Add new records to the chart's sketch: appended in version order as they come, rebuilt from every
        record when one arrives out of order (a resumed run evaluating a version again)."""
        last = self._sketch.last[0] if self._sketch.last else -1
        versions = [r["policy_version"] for r in new]
        if all(b > a for a, b in zip([last, *versions], versions)):
            for record in new:
                self._sketch.append(record["policy_version"], float(record["score"]))
            return
        ordered = sorted(self.records)
        self._sketch = Sketch.build(ordered, [float(self.records[v]["score"]) for v in ordered],
                                    CHART_GROUPS, CHART_NEWEST)

    def chart_records(self) -> dict[int, dict]:
        """The records the held-out chart draws, bounded whatever the run's length: the base model (v0), the best
        version under the rule, the newest versions, and the lowest and highest of each group of the older ones."""
        xs, _ = self._sketch.points()
        shown = {int(x) for x in xs} | {0, self.best_version}
        return {v: self.records[v] for v in sorted(shown - {None}) if v in self.records}

    def set_rule(self, rule: dict[str, float]) -> bool:
        """The rule the run's best version is chosen by now (the launch spec's best_by, or the user's newest change).
        Whether it changed."""
        rule = dict(rule or {})
        if rule == self.rule:
            return False
        self.rule, self._ranked = rule, None
        self._scored = {v: self._score_of(s) for v, s in self.scores.items()}
        self._ranking = Ranking(self._scored)
        return True

    def _score_of(self, score: HeldOutScore) -> float | None:
        return rule_score({"score": score.score, "rewards": score.rewards}, self.rule)

    def _rank(self) -> tuple[int | None, float | None]:
        """`best_rule.best_of` over the scores kept as records arrived and, while older records are unread, the
        ones best.json quotes for versions not read yet: a new record costs no re-scoring and no walk of them all."""
        if self._ranked is None:
            published = {v: s for v, s in self._published().items() if v not in self._scored}
            baseline = self._scored[0] if 0 in self._scored else published.get(0)
            self._ranked = self._ranking.best_of({v: s for v, s in published.items() if v >= 1}, baseline)
        return self._ranked

    def rule_score(self, version: int) -> float | None:
        """A version's held-out score under the rule in force (None: not evaluated, or a named reward missing; while
        older records are unread, best.json's score of the version it names)."""
        score = self._scored.get(version)
        return self._published().get(version) if score is None and version not in self._scored else score

    def score_text(self, version: int | None) -> str:
        """A version's held-out score as every view says it (the header, the adapters table, the picker, the
        version line, the card): its score under the rule in force, with its spread over prompts under the default
        rule (whose score is the record's own); '-' where it has none. One function, so they all say one number."""
        value = self.rule_score(version) if version is not None else None
        if value is None:
            return "-"
        score = self.scores.get(version)
        spread = score.score_std if not self.rule and score is not None else None
        return f"{value:.3f}" + (f" ± {spread:.3f}" if spread is not None else "")

    @property
    def baseline(self) -> float | None:
        """The base model's (version 0's) score under the rule; None when it was not evaluated."""
        return self._rank()[1]

    @property
    def none_beats_base(self) -> bool:
        """Versions were evaluated, and none of them beats the base model under the rule."""
        return self.baseline is not None and self.best_version is None and any(v >= 1 for v in self.scores)

    @property
    def evaluated(self) -> int:
        return sum(1 for v in self.scores if v >= 1)

    def reread_best(self) -> bool:
        """Look at best/ now (the panel has just republished it)."""
        self._best_read_at = time.monotonic()
        return self._read_best()

    def _read_best(self) -> bool:
        files = adapter_folder_files(self.store, f"{self.prefix}/{layout.BEST_DIR}")
        names = {posixpath.basename(f.path) for f in files}
        if not all(n in names for n in layout.ADAPTER_FILES):
            return False
        try:
            best = json.loads(self.store.read_bytes(f"{self.prefix}/{layout.BEST_DIR}/{layout.BEST_FILE}"))
        except (OSError, ValueError, KeyError):
            best = {}
        best = redact_record(best) if isinstance(best, dict) and type(best.get("policy_version")) is int else {}
        changed = best != self.best_json or [f.path for f in files] != [f.path for f in self._best_files]
        if best != self.best_json and self.older_pending:
            self._ranked = None         # the ranking reads best.json until every record is read
        self.best_json, self._best_files = best, files
        return changed

    @property
    def best_version(self) -> int | None:
        """The best version under the rule in force (`best_rule.pick_best`: ties to the earliest, above version 0);
        None before any evaluation, or when no version beats the base model."""
        return self._rank()[0]

    @property
    def best_files(self) -> list[StoredFile]:
        """best/'s files, when best/ holds the best version under the rule in force (else [])."""
        best = self.best_version
        return self._best_files if best is not None and self.best_json.get("policy_version") == best else []

    def why(self, metric: str) -> str:
        """Why the best version is the best: the rule, how many versions it ranked, the tie rule, the baseline."""
        return why_text(self.rule, self.evaluated, self.baseline, metric)



def _chart_record(record: dict) -> dict:
    """An evaluation record as the chart reads it: no samples, its rewards a mapping of mappings, a time."""
    rewards = record.get("rewards") if isinstance(record.get("rewards"), dict) else {}
    when = record.get("time")
    return {**{k: v for k, v in record.items() if k != "samples"},
            "rewards": {k: v for k, v in rewards.items() if isinstance(v, dict)},
            "time": float(when) if finite_number(when) else 0.0}


def _is_sample(sample) -> bool:
    return (isinstance(sample, dict) and type(sample.get("prompt_index")) is int
            and isinstance(sample.get("completion"), str))



def score_text(score: HeldOutScore | None) -> str:
    """A record's own score (the trained rewards' weighted held-out score): where shown apart from the rule's, it is
    named "trained score"; the held-out score a view shows is `HeldOut.score_text`'s."""
    if score is None:
        return "-"
    return f"{score.score:.3f}" + (f" ± {score.score_std:.3f}" if score.score_std is not None else "")

