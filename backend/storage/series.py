"""Series that stay cheap at any length: a bounded min/max sketch per metric, kept as points arrive.

A `Sketch` holds a series as at most `2 * budget` buckets of equal width (in points), each remembering its
first and last x, its lowest and highest point and its sum. Appending is O(1); when the buckets outgrow that,
neighbours merge and the width doubles (O(budget), once per doubling). Bucket boundaries are always multiples
of the width, so a sketch equals one built from scratch over the same points with the same width.

Drawing uses exactly `budget` groups once the series is longer than that, whatever its length: a sketch holds
between `budget` and `2 * budget` buckets, so its oldest buckets are drawn merged in pairs and its newest ones
as they are (older history coarser). A fixed number of points per trace means a tick costs the same at step
1,000 as at step 100,000. Each group gives its low and high point in x order, so spikes survive, and the
newest points are drawn at full resolution.
"""

import bisect
import itertools
import math
from array import array
from collections import deque
from dataclasses import dataclass

BULK_ROWS = 64           # from this many rows at once, `SeriesTable.extend` goes column by column
DEFAULT_BUDGET = 200     # groups drawn per series: at most 2 points each, so <= 400 points a trace, whatever the length
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
    """One series (x ascending) as at most `2 * budget` min/max buckets, drawn as `budget` groups, plus its
    newest `recent` points."""

    def __init__(self, budget: int = DEFAULT_BUDGET, recent: int = RECENT_POINTS):
        self.budget = budget
        self.width = 1
        self.buckets: list[Bucket] = []
        self._pairs: list[Bucket] = []      # buckets 2i and 2i+1 merged, for every full pair so far (drawing)
        self.recent: deque[tuple[float, float]] = deque(maxlen=recent)
        self.count = 0

    @property
    def capacity(self) -> int:
        return 2 * self.budget

    def append(self, x: float, y: float) -> None:
        self.count += 1
        self.recent.append((x, y))
        if self.buckets and self.buckets[-1].count < self.width:
            self.buckets[-1].add(x, y)
        else:
            self.buckets.append(Bucket.of(x, y))
        if len(self.buckets) > self.capacity:
            self._halve()

    def _halve(self) -> None:
        merged = self._merged_pairs(len(self.buckets) // 2)
        if len(self.buckets) % 2:
            merged.append(self.buckets[-1])
        self.buckets, self._pairs = merged, []
        self.width *= 2

    def _merged_pairs(self, count: int) -> list[Bucket]:
        """The first `count` pairs of buckets, each merged; full pairs are merged once and kept."""
        while len(self._pairs) < count and self.buckets[2 * len(self._pairs) + 1].count == self.width:
            i = len(self._pairs)
            self._pairs.append(self.buckets[2 * i].merge(self.buckets[2 * i + 1]))
        pairs = self._pairs[:count]
        if len(pairs) < count:      # the last pair holds the bucket still filling
            i = count - 1
            pairs.append(self.buckets[2 * i].merge(self.buckets[2 * i + 1]))
        return pairs

    def groups(self, count: int | None = None) -> list[Bucket]:
        """The first `count` buckets (all by default) to draw: as they are up to `budget` of them, else exactly
        `budget` groups, the oldest buckets merged in pairs."""
        count = len(self.buckets) if count is None else count
        extra = count - self.budget
        if extra <= 0:
            return self.buckets[:count]
        return self._merged_pairs(extra) + self.buckets[2 * extra:count]

    def points(self) -> tuple[list[float], list[float]]:
        """What to draw: the extremes of `budget` groups of what comes before the recent window, then the recent
        points as they are (the same number of points at any length)."""
        start = self.recent[0][0] if self.recent else math.inf
        before = bisect.bisect_left(self.buckets, start, key=_first_x)
        xs, ys = [], []
        for bucket in self.groups(before):
            for x, y in bucket.points():
                if x < start:
                    xs.append(x)
                    ys.append(y)
        for x, y in self.recent:
            xs.append(x)
            ys.append(y)
        return xs, ys

    def means(self) -> tuple[list[float], list[float]]:
        """Each group's mean at its middle x: a down-sampled series for smoothing and bands."""
        groups = self.groups()
        return ([(b.first_x + b.last_x) / 2 for b in groups], [b.mean for b in groups])

    @property
    def last(self) -> tuple[float, float] | None:
        return self.recent[-1] if self.recent else None

    @classmethod
    def build(cls, xs: list[float], ys: list[float], budget: int = DEFAULT_BUDGET,
              recent: int = RECENT_POINTS) -> "Sketch":
        """The sketch `append` would have made of these points, in one pass: the width is the smallest power of
        two that fits them in `2 * budget` buckets, and each bucket's extremes come from C-level min/max."""
        sketch = cls(budget, recent)
        n = len(xs)
        while n > sketch.width * sketch.capacity:
            sketch.width *= 2
        w = sketch.width
        for start in range(0, n, w):
            chunk = ys[start:start + w]
            lo, hi = min(chunk), max(chunk)
            ilo, ihi = start + chunk.index(lo), start + chunk.index(hi)
            last = min(start + w, n) - 1
            sketch.buckets.append(Bucket(len(chunk), xs[start], xs[last], xs[ilo], lo, xs[ihi], hi, sum(chunk)))
        sketch.recent.extend(zip(xs[-recent:], ys[-recent:]))
        sketch.count = n
        return sketch


class SeriesTable:
    """Rows of numbers stored as columns (8 bytes a value), with a sketch per (column, x axis) kept up to date once
    something has drawn it. `axes` are the x columns: ("step", "time") for a trainer's metrics, whose rows are
    keyed by step (a row whose step is not past the last one, a resumed trainer logging the steps after its
    checkpoint again, replaces the tail from that step on), or ("time",) for resource samples.

    A sketch is built from its column the first time it is asked for, in one pass (C-level min/max per bucket),
    then appended to with each row: opening a long run costs the columns that are drawn, not every column."""

    def __init__(self, axes: tuple[str, ...] = ("step", "time"), budget: int = DEFAULT_BUDGET,
                 recent: int = RECENT_POINTS):
        self.axes, self.budget, self.recent_n = axes, budget, recent
        self.x: dict[str, array] = {axis: array("d") for axis in axes}
        self.columns: dict[str, array] = {}          # key -> values (NaN where a row lacks the key)
        self._sketches: dict[tuple[str, str], Sketch] = {}
        self.last_row: dict = {}
        self.version = 0

    @property
    def steps(self) -> array:
        return self.x["step"]

    @property
    def times(self) -> array:
        return self.x["time"]

    def __len__(self) -> int:
        return len(self.x[self.axes[0]])

    def add(self, row: dict) -> None:
        key_axis = self.axes[0]
        first = row.get(key_axis)
        if not _finite(first):
            return
        if key_axis == "step" and len(self) and first <= self.x["step"][-1]:
            self._rewind(first)
        n = len(self)
        xs = {}
        for axis in self.axes:
            value = row.get(axis)
            xs[axis] = float(value) if _finite(value) else (self.x[axis][-1] if n else 0.0)
            self.x[axis].append(xs[axis])
        for key, value in row.items():
            if key in xs or not _finite(value):
                continue
            column = self.columns.get(key)
            if column is None:
                column = self.columns[key] = array("d", [math.nan]) * n
            column.append(float(value))
        for key, column in self.columns.items():
            if len(column) <= n:
                column.append(math.nan)
        for (key, axis), sketch in self._sketches.items():
            value = self.columns[key][n]
            if not math.isnan(value):
                sketch.append(xs[axis], value)
        self.last_row = self.row(n)
        self.version += 1

    def extend(self, rows: list[dict]) -> None:
        """Many rows at once (a first look at a long run): one pass per column instead of one per row. Rows that
        are not strictly after the last one on the key axis take the row-by-row path (which rewinds)."""
        if len(rows) < BULK_ROWS or not self._in_order([r.get(self.axes[0]) for r in rows]):
            for row in rows:
                self.add(row)
            return
        xs = {}
        for axis in self.axes:
            last = self.x[axis][-1] if len(self) else 0.0
            values = []
            for row in rows:     # a row without a time takes the previous row's
                v = row.get(axis)
                last = float(v) if type(v) in _NUMBERS and v - v == 0 else last
                values.append(last)
            xs[axis] = values
        keys = set().union(*rows).difference(self.axes)
        self._append(xs, {key: [row.get(key) for row in rows] for key in keys}, len(rows))

    def extend_columns(self, columns: dict[str, list]) -> None:
        """Rows given as columns of equal length, the axes among them (no dict per row)."""
        m = len(columns[self.axes[0]])
        if m < BULK_ROWS or not self._in_order(columns[self.axes[0]]) or any(a not in columns for a in self.axes):
            self.extend([{k: col[i] for k, col in columns.items()} for i in range(m)])
            return
        xs = {axis: [float(v) for v in columns[axis]] for axis in self.axes}
        self._append(xs, {k: v for k, v in columns.items() if k not in xs}, m)

    def _in_order(self, firsts: list) -> bool:
        """Whether rows with these key-axis values can be appended as they are (strictly after the last row)."""
        ordered = all(_finite(v) for v in firsts) and all(b > a for a, b in itertools.pairwise(firsts))
        return ordered and not (len(self) and firsts and firsts[0] <= self.x[self.axes[0]][-1])

    def _append(self, xs: dict[str, list[float]], values: dict[str, list], m: int) -> None:
        n0 = len(self)
        for axis in self.axes:
            self.x[axis].extend(xs[axis])
        for key, column_values in values.items():
            column = self.columns.get(key)
            if column is None:
                column = self.columns[key] = array("d", [math.nan]) * n0
            column.extend([float(v) if type(v) in _NUMBERS and v - v == 0 else math.nan for v in column_values])
        for key, column in self.columns.items():
            if key not in values:
                column.extend(array("d", [math.nan]) * m)
        for (key, axis), sketch in self._sketches.items():
            column = self.columns[key]
            for i in range(m):
                if not math.isnan(column[n0 + i]):
                    sketch.append(xs[axis][i], column[n0 + i])
        if m:
            self.last_row = self.row(len(self) - 1)
            self.version += 1

    def drawn(self) -> list[tuple[str, str]]:
        """The (column, axis) pairs something has drawn, whose sketches this table keeps up to date."""
        return list(self._sketches)

    def after(self, earlier: "SeriesTable") -> "SeriesTable":
        """`earlier`'s rows from before this table's first row, then this table's rows, drawn as this table is:
        a long run's history, read in the background, joined in front of what was read since. Costs this
        table's rows (and the sketches `earlier` was not asked for), not the history's."""
        if len(self):
            earlier._rewind(self.x[self.axes[0]][0])
            earlier.extend(self.rows())
        for key in self._sketches:
            earlier.sketch(*key)
        earlier.version = self.version + 1
        return earlier

    def _rewind(self, first: float) -> None:
        """Drop every row from `first` on (on the key axis) and rebuild what was drawn from what is left (rare: a
        resume)."""
        key_axis = self.x[self.axes[0]]
        if not len(key_axis) or key_axis[-1] < first:
            return
        keep = next((i for i, s in enumerate(key_axis) if s >= first), len(self))
        for column in (*self.x.values(), *self.columns.values()):
            del column[keep:]
        self._sketches = {key: self._build(*key) for key in self._sketches}
        self.last_row = self.row(keep - 1) if keep else {}

    def row(self, i: int) -> dict:
        out = {a: (int(self.x[a][i]) if a == "step" else self.x[a][i]) for a in self.axes}
        for key, column in self.columns.items():
            if not math.isnan(column[i]):
                out[key] = column[i]
        return out

    def rows(self, last: int | None = None) -> list[dict]:
        """Rows as dicts, oldest first: all of them (O(length): for scripts and tests), or the `last` few."""
        start = 0 if last is None else max(len(self) - last, 0)
        return [self.row(i) for i in range(start, len(self))]

    def sketch(self, key: str, x: str | None = None) -> Sketch | None:
        """The drawable series of column `key` against axis `x` (the first axis by default), or None."""
        x = x or self.axes[0]
        if key not in self.columns or x not in self.x:
            return None
        if (key, x) not in self._sketches:
            self._sketches[(key, x)] = self._build(key, x)
        return self._sketches[(key, x)]

    def _build(self, key: str, axis: str) -> Sketch:
        values, xs = self.columns[key], self.x[axis]
        keep = [i for i, v in enumerate(values) if not math.isnan(v)]
        return Sketch.build([xs[i] for i in keep], [values[i] for i in keep], self.budget, self.recent_n)


def _first_x(bucket: Bucket) -> float:
    return bucket.first_x


_NUMBERS = (int, float)     # exactly: a bool is not a metric


def _finite(value) -> bool:
    return type(value) in _NUMBERS and value - value == 0
