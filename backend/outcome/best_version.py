"""The held-out evaluation as the panel reads it, and which adapter version a download, a push or "try it" means.

The trainer evaluates each published version on the run's held-out prompts and writes one record per version into
`evals/` (write-once fragments, `layout.EVALS_DIR`); the best-scoring version so far is republished whole as `best/`
with `best/best.json` saying why, so it survives TRL deleting old serving copies. `HeldOut` reads both with a
cursor, like the metrics. `choose` turns what a visitor picked ("best", "final", "trl-policy-v7") into the files of
that adapter and a sentence saying which version it is and why; a name the run never published is refused.
"""

import bisect
import itertools
import json
import math
import os
import posixpath
import secrets
import tempfile
import time
from collections import OrderedDict
from dataclasses import dataclass

from backend.runtime import layout, records
from backend.runtime.best_rule import (
    BEST_BY_WRITER,
    EPSILON,
    TIE_RULE,
    best_by_problem,
    best_json,
    parse_best_by,
    pick_best,
    rule_score,
    rule_text,
    why_text,
)
from backend.runtime.redact import redact_record
from backend.runtime.user_code import reward_function_names
from backend.storage.adapters import adapter_folder_files
from backend.storage.observers import FragmentReader
from backend.storage.series import Sketch
from backend.storage.store import BucketStore, StoredFile

FINAL, BEST = "final", "best"
SAMPLE_VERSIONS_KEPT = 100      # versions whose held-out samples a view keeps (the newest)
# The held-out chart draws at most 2 * CHART_GROUPS + CHART_NEWEST versions besides the base model and the best: the
# newest as they are, the rest as the lowest and highest of groups of versions (a `Sketch` of their scores). About
# what a 1,000-step run's 50 versions draw whole, so its tick (this chart is redrawn with the training reward behind
# it) costs the same at any length.
CHART_GROUPS, CHART_NEWEST = 20, 10
RANK_ONE_BY_ONE = 64            # more new records than this at once are ranked anew, not inserted one by one
CHOICES_SHOWN = 50              # versions offered in a picker besides best and final (the newest)
BEST_RECHECK_S = 10.0           # how often best/ is looked at again while it lags behind the scores read
OLDER_WAIT_S = 30.0             # how long a change of rule waits for a long run's older records (being read)


class ChoiceError(ValueError):
    """The picked version cannot be used; the message says why and what can be."""


@dataclass(frozen=True)
class HeldOutScore:
    version: int
    step: int
    score: float
    score_std: float | None
    n_prompts: int | None
    rewards: dict             # reward name -> {"mean", "std", "weight", "solved"}


def _number(value) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def is_eval_record(record: dict) -> bool:
    """One evaluated version: an integer version and step and a finite score (anything else is skipped, counted)."""
    return (type(record.get("policy_version")) is int and record["policy_version"] >= 0
            and type(record.get("step")) is int and _number(record.get("score")))


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
                                                float(std) if _number(std) else None,
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

    # ---- the older records of a long run, read in the background (`RunView._start_history`)
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
        return {v: float(score) for v, score in out.items() if _number(score)}

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


class Ranking:
    """The scores of versions >= 1 under a rule, highest first (equal ones earliest first), kept as they arrive: the
    best version is read off the top whatever the run's length. `best_of` gives what `best_rule.best_of` gives over
    the same scores."""

    def __init__(self, scored: dict[int, float | None] | None = None):
        self._score = {v: s for v, s in (scored or {}).items() if v >= 1 and s is not None}
        self._order = sorted((-s, v) for v, s in self._score.items())     # (-score, version), ascending

    def put(self, version: int, score: float | None) -> None:
        """A version's score (None: not scored under the rule), in place of any it had."""
        old = self._score.pop(version, None)
        if old is not None:
            del self._order[bisect.bisect_left(self._order, (-old, version))]
        if version >= 1 and score is not None:
            self._score[version] = score
            bisect.insort(self._order, (-score, version))

    def best_of(self, extra: dict[int, float | None], baseline: float | None) -> tuple[int | None, float | None]:
        """(the best version, `baseline`) over these scores and `extra` (versions >= 1 not among them): the earliest
        version within EPSILON of the top score, none unless that top beats the baseline by more than EPSILON."""
        extra = {v: s for v, s in extra.items() if s is not None}
        tops = [*extra.values(), *([-self._order[0][0]] if self._order else [])]
        if not tops:
            return None, baseline
        top = max(tops)
        if baseline is not None and top <= baseline + EPSILON:
            return None, baseline
        near = top - EPSILON        # the scores at least this high tie the top: the head of the order, mostly short
        head = itertools.islice(self._order, bisect.bisect_right(self._order, (-near, math.inf)))
        return min([v for _, v in head] + [v for v, s in extra.items() if s >= near]), baseline


@dataclass(frozen=True)
class PublishedBest:
    """A run's outcome as the runs list shows it: its best version and that version's held-out score under the run's
    rule, or that no version beats the base model (or neither: nothing evaluated yet)."""

    version: int | None = None
    score: float | None = None
    none_beats_base: bool = False

    @property
    def text(self) -> str:
        """'0.812 · v7', 'none beats base', or '' (no version evaluated yet)."""
        if self.version is not None:
            return (f"{self.score:.3f} · " if self.score is not None else "") + f"v{self.version}"
        return "none beats base" if self.none_beats_base else ""


def held_out_best(held: "HeldOut") -> PublishedBest | None:
    """What a view's held-out scores say (None when it has read none): the ranking under the rule in force."""
    if not held.scores:
        return None
    best = held.best_version
    return PublishedBest(best, held.rule_score(best) if best is not None else None, held.none_beats_base)


def published_best(store: BucketStore, run_id: str) -> PublishedBest:
    """A run's best version as the trainer (or the panel, on a change of rule) published it, read cheaply: best.json
    (a few hundred bytes), whatever the number of versions evaluated. Without best/, either nothing beyond the base
    model was evaluated yet, or no version beats it (the trainer then publishes none and the panel removes it): told
    apart by whether the run's first evaluation fragment holds the base model (v0) and a later version was evaluated
    (in it, or a second fragment exists). Just after the first version that beats the base model is evaluated, until
    the trainer has republished best/ (a moment; a sync on HF Jobs), this says none does."""
    prefix = layout.run_prefix(run_id)
    try:
        best = json.loads(store.read_bytes(f"{prefix}/{layout.BEST_DIR}/{layout.BEST_FILE}"))
    except (OSError, ValueError, KeyError):
        best = None
    if isinstance(best, dict) and type(best.get("policy_version")) is int and best["policy_version"] >= 1:
        score = best.get("score")
        return PublishedBest(best["policy_version"], float(score) if _number(score) else None)
    first, second = (f"{prefix}/{layout.EVALS_DIR}/{layout.fragment_name(layout.TRAINER_WRITER, seq)}"
                     for seq in (0, 1))
    found = store.sizes([first, second])
    if first not in found:
        return PublishedBest()
    try:
        versions = [r["policy_version"] for r in layout.fragment_records(store.read_bytes(first))[0]
                    if r is not None and is_eval_record(r)]
    except (OSError, KeyError):
        return PublishedBest()
    later = second in found or any(v >= 1 for v in versions)
    return PublishedBest(none_beats_base=0 in versions and later)


def _chart_record(record: dict) -> dict:
    """An evaluation record as the chart reads it: no samples, its rewards a mapping of mappings, a time."""
    rewards = record.get("rewards") if isinstance(record.get("rewards"), dict) else {}
    when = record.get("time")
    return {**{k: v for k, v in record.items() if k != "samples"},
            "rewards": {k: v for k, v in rewards.items() if isinstance(v, dict)},
            "time": float(when) if _number(when) else 0.0}


def _is_sample(sample) -> bool:
    return (isinstance(sample, dict) and type(sample.get("prompt_index")) is int
            and isinstance(sample.get("completion"), str))


def metric_name(spec: dict) -> str:
    """What the held-out score is: the weighted sum of the run's rewards (weight 0: watched, not scored)."""
    weights = spec.get("reward_weights") or {}
    names = [*(spec.get("rewards") or [])]
    parts = [f"{n} x{float(weights.get(n, 1.0)):g}" for n in names if float(weights.get(n, 1.0)) != 0]
    return "weighted held-out reward" + (f": {' + '.join(parts)}" if parts else "")


def score_text(score: HeldOutScore | None) -> str:
    """A record's own score (the trained rewards' weighted held-out score): where shown apart from the rule's, it is
    named "trained score"; the held-out score a view shows is `HeldOut.score_text`'s."""
    if score is None:
        return "-"
    return f"{score.score:.3f}" + (f" ± {score.score_std:.3f}" if score.score_std is not None else "")


@dataclass(frozen=True)
class ChosenAdapter:
    """One adapter of a run, as a visitor picked it: its files and what the card says about it."""

    choice: str                    # "best", "final" or "trl-policy-v<N>"
    name: str                      # the version's own name where known ("trl-policy-v7"), else "final"
    version: int | None
    step: int | None
    files: list[StoredFile]
    why: str                       # which version it is and why it was chosen, its standing, the alert, if any
    score: HeldOutScore | None = None
    metric: str = ""
    rule: str = ""                 # the run's best-by rule in words
    rule_score: str = "-"          # the version's held-out score under it (`HeldOut.score_text`)
    baseline: float | None = None  # the base model's score under it (None: not evaluated)
    alert: str = ""                # the reward-hacking alert of the run, where one fired


def published(view, version: int):
    """The run's adapter version `version` (an AdapterVersion), None if it published none."""
    find = getattr(view, "find_adapter", None)      # a RunView's: it also looks while older events are read
    return find(version) if find is not None else view.adapters.get(version)


def _version_step(view, version: int | None) -> int | None:
    if version is None:
        return None
    known = published(view, version)
    if known is not None and known.step is not None:
        return known.step
    score = view.held_out.scores.get(version)
    return score.step if score is not None else view.first_step.get(version)


def _complete(files: list[StoredFile]) -> list[StoredFile]:
    names = {posixpath.basename(f.path) for f in files}
    return files if all(n in names for n in layout.ADAPTER_FILES) else []


def _final_version(view) -> int | None:
    end = view.trainer_end
    return end.get("version") if end.get("event") == records.FINISHED and type(end.get("version")) is int else None


def default_choice(view) -> str | None:
    """The best version when an evaluation exists and its adapter is there, else final/, else None; None also when
    versions were evaluated and none beats the base model: nothing is picked for a download or a push then (final/
    would be the most trained, perhaps the most gamed, version)."""
    held = view.held_out
    if held.best_version is not None and (held.best_files or held.best_version in view.adapters):
        return BEST
    if held.none_beats_base:
        return None
    return FINAL if view.final_files else None


def version_choices(view, shown: int = CHOICES_SHOWN) -> list[tuple[str, str]]:
    """(label, value) for a picker: the best version, final/, then the newest versions with their held-out scores
    under the run's rule (`HeldOut.score_text`: the number the header and the adapters table show)."""
    held, out = view.held_out, []
    best = held.best_version
    if best is not None and (held.best_files or best in view.adapters):
        out.append((f"best: {_name(view, best)} (held-out {held.score_text(best)})", BEST))
    if view.final_files:
        version = _final_version(view)
        label = f"final/ ({_name(view, version)})" if version is not None else "final/"
        if version is not None and version in held.scores:
            label += f" · held-out {held.score_text(version)}"
        out.append((label, FINAL))
    for v in view.newest_adapters(shown):
        label = v.name + (f" · step {v.step}" if v.step is not None else "")
        out.append((label + (f" · held-out {held.score_text(v.version)}" if v.version in held.scores else ""), v.name))
    return out


NOTHING_PICKED = ("no version beats the base model by {rule}, so none is picked for you: pick final/ or a version "
                  "by hand, knowing that")


def choose(view, choice: str | None) -> ChosenAdapter:
    """The adapter `choice` names (None or "": the default), with its files; ChoiceError when there is none (also
    for the default where no version beats the base model: `default_choice`)."""
    held, metric = view.held_out, metric_name(view.spec)
    choice = (choice or "").strip() or default_choice(view)
    if not choice:
        if held.none_beats_base:
            raise ChoiceError(NOTHING_PICKED.format(rule=rule_text(held.rule)))
        choice = FINAL
    best = held.best_version
    if choice == FINAL:
        if not view.final_files:
            raise ChoiceError(f"run {view.run_id} has no final adapter yet: final/ is written when training ends")
        version = _final_version(view)
        step = view.trainer_end.get("step") if type(view.trainer_end.get("step")) is int else None
        why = "final/: the last adapter, written when training ended" + (f" at step {step}" if step else "")
        name = _name(view, version) if version is not None else FINAL
        return _chosen(view, FINAL, name, version, step, view.final_files, why)
    if choice == BEST:
        if best is None:
            what = ("no version beats the base model by " + rule_text(held.rule) if held.none_beats_base
                    else "no held-out evaluation yet")
            raise ChoiceError(f"run {view.run_id} has {what}, so no best version: pick final/ or a version")
        why = f"the best version, {_name(view, best)} at step {_version_step(view, best)}: {held.why(metric)}"
        return _chosen(view, BEST, _name(view, best), best, _version_step(view, best), _version_files(view, best), why)
    version = layout.adapter_version(choice, layout.spec_member(view.spec))
    if version is None or published(view, version) is None:
        raise ChoiceError(f"version: run {view.run_id} published no adapter {choice[:80]!r}; pick best, final/ or one "
                          "of the versions listed in the adapters table")
    why = f"{choice} at step {_version_step(view, version)}, picked by hand"
    after = ""
    if best is not None and best != version and version in held.scores:
        after = f"; the best is {_name(view, best)} ({held.score_text(best)})"
    elif best == version:
        after = f"; it is the best version ({held.why(metric)})"
    return _chosen(view, choice, choice, version, _version_step(view, version), _version_files(view, version), why,
                   after, ": ")


def _chosen(view, choice: str, name: str, version: int | None, step: int | None, files: list[StoredFile],
            why: str, after: str = "", sep: str = "; ") -> ChosenAdapter:
    """The chosen adapter with its standing: its held-out score under the run's rule beside the base model's, and
    the reward-hacking alert where one fired (the version line, the zip's and the push's card say them all)."""
    from backend.view.hacking import hacking_sign  # noqa: PLC0415 the view layer reads the outcome's records

    held, metric = view.held_out, metric_name(view.spec)
    rule = rule_text(held.rule)
    score = held.scores.get(version) if version is not None else None
    shown = held.score_text(version) if score is not None else "-"
    if score is not None:
        why += f"{sep}held-out score {shown} (best by {rule})"
        if held.baseline is not None:
            verdict = ("above" if (held.rule_score(version) or 0) > held.baseline + EPSILON else "not above")
            why += f", {verdict} the base model's {held.baseline:.3f}"
    elif held.baseline is not None:
        why += f"{sep}not evaluated (the base model's held-out score, best by {rule}: {held.baseline:.3f})"
    why += after
    if held.none_beats_base:
        why += f". No version beats the base model by {rule}"
    sign = hacking_sign(held) if held.scores else None
    alert = sign.message if sign is not None else ""
    if alert:
        why += f". ▲ {alert[0].upper()}{alert[1:]}"
    return ChosenAdapter(choice, name, version, step, files, why.rstrip(".") + ".", score, metric, rule, shown,
                         held.baseline, alert)


def _name(view, version: int) -> str:
    """Version `version`'s name in the view's run (a sweep member's carries its tag)."""
    return layout.run_adapter_name(view.spec, version)

def _version_files(view, version: int) -> list[StoredFile]:
    """A version's own folder, or best/ when that is this version and its serving copy was pruned."""
    known = published(view, version)
    files = _complete(adapter_folder_files(view.store, known.path)) if known is not None else []
    if files:
        return files
    held = view.held_out
    if held.best_version == version and held.best_files:
        return held.best_files
    raise ChoiceError(f"{_name(view, version)}'s files are gone from the bucket (TRL keeps only the newest "
                      "serving copies): pick best or final/, which are kept")


class BestByRefused(ValueError):
    """A "best by" the run cannot rank by; the message names the field and says what it can be."""


def held_out_reward_names(view) -> list[str]:
    """Every reward the run scores on its held-out set: its records' (the newest), else its spec's."""
    held = view.held_out
    if held.scores:
        return list(held.scores[held.span[1]].rewards)
    spec = view.spec
    return [*(spec.get("rewards") or []), *reward_function_names(spec.get("reward_code") or ""),
            *(spec.get("monitor_rewards") or [])]


def change_best_by(view, text: str) -> str:
    """Change which held-out score decides the run's best version, on a running or finished run: ranked again
    from the evaluation records (no re-run), best/ republished with the new best version's adapter (removed when
    none beats the base model), the change recorded as a best_by_changed event (which a running trainer reads back
    before its next evaluation). Returns what it did, in words; BestByRefused or ChoiceError when it cannot."""
    view.refresh()
    if view.held_out.older_pending and hasattr(view, "wait_for_history"):
        view.wait_for_history(OLDER_WAIT_S)     # ranked over every record, not a first look's newest
    if view.held_out.older_pending:
        raise BestByRefused("best_by: this long run's older held-out records are still being read; change it again "
                            "in a moment (nothing was changed)")
    if view.spec.get("eval_source", "none") == "none" and not view.held_out.scores:
        raise BestByRefused("best_by: this run has no held-out set, so no best version to choose")
    try:
        rule = parse_best_by(text)
    except ValueError as error:
        raise BestByRefused(f"best_by: {error}") from None
    problem = best_by_problem(rule, held_out_reward_names(view))
    if problem:
        raise BestByRefused(f"best_by: {problem}")
    held, previous = view.held_out, dict(view.held_out.rule)
    ranked = {v: {"score": s.score, "rewards": s.rewards} for v, s in held.scores.items()}
    best, baseline = pick_best(ranked, rule)
    prefix = f"{held.prefix}/{layout.BEST_DIR}"
    if best is not None:
        files = _version_files(view, best)      # ChoiceError when its files are gone: nothing written
        _republish(view.store, prefix, files, best_json(
            {"policy_version": best, "step": held.scores[best].step, **ranked[best]}, rule, baseline,
            held.evaluated, metric_name(view.spec)))
    elif held.best_json or held._best_files:
        view.store.delete_folder(prefix)        # none beats the base model: no best/ to download or push
    writer = f"{BEST_BY_WRITER}.{secrets.token_hex(4)}"
    event = records.event_record(records.BEST_BY_CHANGED, best_by=rule, previous=previous, version=best,
                                 rule=rule_text(rule))
    view.store.write_bytes(f"{held.prefix}/{layout.EVENTS_DIR}/{layout.fragment_name(writer, 0)}",
                           (json.dumps(event) + "\n").encode())
    if hasattr(view, "expect_event_writer"):
        view.expect_event_writer(writer)
    view.refresh()          # the event: the view's rule is the new one
    held.reread_best()      # and best/ as republished
    if best is None:
        what = ("no version beats the base model" if baseline is not None and held.evaluated
                else "no version is evaluated yet")
        return f"Best version now by {rule_text(rule)} ({TIE_RULE}): {what}; best/ holds none."
    return (f"Best version now by {rule_text(rule)} ({TIE_RULE}): **{_name(view, best)}** "
            f"({rule_score(ranked[best], rule):.3f}"
            + (f", base model {baseline:.3f}" if baseline is not None else "") + "); best/ republished.")


def _republish(store, prefix: str, files: list[StoredFile], best: dict) -> None:
    """best/ replaced by `files` (a version's adapter), best.json written last: a reader that finds best.json naming
    the version finds its files."""
    with tempfile.TemporaryDirectory() as tmp:
        for f in files:
            name = posixpath.basename(f.path)
            if name in (*layout.ADAPTER_FILES, layout.ADAPTER_META_FILE):
                with open(os.path.join(tmp, name), "wb") as out:
                    out.write(store.read_bytes(f.path))
        store.upload_folder(tmp, prefix)
    store.write_bytes(f"{prefix}/{layout.BEST_FILE}", json.dumps(best).encode())
