"""Series that stay cheap at any length: a bounded min/max sketch per metric, kept as points arrive.

A `Sketch` holds a series as at most `budget` buckets of equal width (in points), each remembering its first
and last x, its lowest and highest point and its sum. Appending is O(1); when the buckets outgrow the budget,
neighbours merge and the width doubles (O(budget), once per doubling). Drawing takes each bucket's low and
high point in x order, so spikes survive at any run length, plus the newest points at full resolution.
Bucket boundaries are always multiples of the width, so a sketch equals one built from scratch over the same
points with the same width.
"""

import math
from array import array
from collections import deque
from dataclasses import dataclass

DEFAULT_BUDGET = 200     # buckets per series: at most 2 points each, so <= 400 points a trace, whatever the length
RECENT_POINTS = 100      # the newest points are drawn as they are


@dataclass
class Bucket:
    count: int
    first_x: float
    last_x: float
    lo_x: float
    lo_y: float
    hi_x: float
    hi_y: float
    total: float

    @classmethod
    def of(cls, x: float, y: float) -> "Bucket":
        return cls(1, x, x, x, y, x, y, y)

    def add(self, x: float, y: float) -> None:
        self.count += 1
        self.last_x = x
        self.total += y
        if y < self.lo_y:
            self.lo_x, self.lo_y = x, y
        if y > self.hi_y:
            self.hi_x, self.hi_y = x, y

    def merge(self, other: "Bucket") -> "Bucket":
        lo = (self.lo_x, self.lo_y) if self.lo_y <= other.lo_y else (other.lo_x, other.lo_y)
        hi = (self.hi_x, self.hi_y) if self.hi_y >= other.hi_y else (other.hi_x, other.hi_y)
        return Bucket(self.count + other.count, self.first_x, other.last_x, *lo, *hi, self.total + other.total)

    @property
    def mean(self) -> float:
        return self.total / self.count

    def points(self) -> list[tuple[float, float]]:
        """The bucket's low and high point, in x order (one point when they coincide)."""
        pts = sorted({(self.lo_x, self.lo_y), (self.hi_x, self.hi_y)})
        return pts


class Sketch:
    """One series (x ascending) as at most `budget` min/max buckets plus its newest `recent` points."""

    def __init__(self, budget: int = DEFAULT_BUDGET, recent: int = RECENT_POINTS):
        self.budget = budget
        self.width = 1
        self.buckets: list[Bucket] = []
        self.recent: deque[tuple[float, float]] = deque(maxlen=recent)
        self.count = 0

    def append(self, x: float, y: float) -> None:
        self.count += 1
        self.recent.append((x, y))
        if self.buckets and self.buckets[-1].count < self.width:
            self.buckets[-1].add(x, y)
        else:
            self.buckets.append(Bucket.of(x, y))
        if len(self.buckets) > self.budget:
            self._halve()

    def _halve(self) -> None:
        merged = [a.merge(b) for a, b in zip(self.buckets[0::2], self.buckets[1::2])]
        if len(self.buckets) % 2:
            merged.append(self.buckets[-1])
        self.buckets = merged
        self.width *= 2

    def points(self) -> tuple[list[float], list[float]]:
        """What to draw: the buckets' extremes before the recent window, then the recent points as they are."""
        start = self.recent[0][0] if self.recent else math.inf
        xs, ys = [], []
        for bucket in self.buckets:
            if bucket.first_x >= start:
                break
            for x, y in bucket.points():
                if x < start:
                    xs.append(x)
                    ys.append(y)
        for x, y in self.recent:
            xs.append(x)
            ys.append(y)
        return xs, ys

    def means(self) -> tuple[list[float], list[float]]:
        """Each bucket's mean at its middle x: a down-sampled series for smoothing and bands."""
        return ([(b.first_x + b.last_x) / 2 for b in self.buckets], [b.mean for b in self.buckets])

    @property
    def last(self) -> tuple[float, float] | None:
        return self.recent[-1] if self.recent else None


class SeriesTable:
    """Rows of numbers keyed by step, stored as columns (8 bytes a value), with a sketch per column drawn
    against step and one against wall time. A row whose step is not past the last one (a resumed trainer logs
    the steps after its checkpoint again) replaces the tail from that step on: the latest record wins."""

    def __init__(self, budget: int = DEFAULT_BUDGET, recent: int = RECENT_POINTS):
        self.budget, self.recent_n = budget, recent
        self.steps = array("d")
        self.times = array("d")
        self.columns: dict[str, array] = {}          # key -> values (NaN where a row lacks the key)
        self.by_step: dict[str, Sketch] = {}
        self.by_time: dict[str, Sketch] = {}
        self.last_row: dict = {}
        self.version = 0

    def __len__(self) -> int:
        return len(self.steps)

    def add(self, row: dict) -> None:
        step = row.get("step")
        if not _finite(step):
            return
        if self.steps and step <= self.steps[-1]:
            self._rewind(step)
        t = row.get("time")
        t = float(t) if _finite(t) else (self.times[-1] if self.times else 0.0)
        n = len(self.steps)
        self.steps.append(float(step))
        self.times.append(t)
        for key, value in row.items():
            if key in ("step", "time") or not _finite(value):
                continue
            column = self.columns.get(key)
            if column is None:
                column = self.columns[key] = array("d", [math.nan]) * n
                self.by_step[key] = Sketch(self.budget, self.recent_n)
                self.by_time[key] = Sketch(self.budget, self.recent_n)
            column.append(float(value))
            self.by_step[key].append(float(step), float(value))
            self.by_time[key].append(t, float(value))
        for key, column in self.columns.items():
            if len(column) <= n:
                column.append(math.nan)
        self.last_row = {"step": int(step), "time": t, **{k: v for k, v in row.items() if k not in ("step", "time")}}
        self.version += 1

    def _rewind(self, step: float) -> None:
        """Drop every row from `step` on and rebuild the sketches from what is left (rare: a resume)."""
        keep = next((i for i, s in enumerate(self.steps) if s >= step), len(self.steps))
        rows, version = [self.row(i) for i in range(keep)], self.version
        self.__init__(self.budget, self.recent_n)
        for row in rows:
            self.add(row)
        self.version = version + 1

    def row(self, i: int) -> dict:
        out = {"step": int(self.steps[i]), "time": self.times[i]}
        for key, column in self.columns.items():
            if not math.isnan(column[i]):
                out[key] = column[i]
        return out

    def rows(self, last: int | None = None) -> list[dict]:
        """Rows as dicts, oldest first: all of them (O(length): for scripts and tests), or the `last` few."""
        start = 0 if last is None else max(len(self.steps) - last, 0)
        return [self.row(i) for i in range(start, len(self.steps))]

    def sketch(self, key: str, x: str = "step") -> Sketch | None:
        return (self.by_step if x == "step" else self.by_time).get(key)

    def keys(self) -> list[str]:
        return list(self.columns)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
