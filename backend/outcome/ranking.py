"""Versions ranked by their held-out score under a run's rule, kept as records arrive."""

import bisect
import itertools
import math

from backend.runtime.best_rule import EPSILON


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

