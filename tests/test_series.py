"""Bounded series: the sketch keeps a series' shape in a fixed number of points, whatever its length."""

import itertools
import random

import pytest

from backend.storage.series import SeriesTable, Sketch

pytestmark = pytest.mark.unit


def _from_scratch(points, width):
    """Buckets of `width` consecutive points, computed over the whole series at once."""
    out = []
    for start in range(0, len(points), width):
        chunk = points[start:start + width]
        lo = min(chunk, key=lambda p: p[1])
        hi = max(chunk, key=lambda p: p[1])
        out.append((len(chunk), chunk[0][0], chunk[-1][0], lo, hi, sum(p[1] for p in chunk)))
    return out


def test_the_incremental_sketch_equals_a_full_recomputation_on_random_data():
    rng = random.Random(7)
    for n in (1, 199, 200, 201, 1000, 12_345):
        points = [(float(i), rng.gauss(0, 1)) for i in range(n)]
        sketch = Sketch(budget=200, recent=10)
        for x, y in points:
            sketch.append(x, y)
        got = [(b.count, b.first_x, b.last_x, (b.lo_x, b.lo_y), (b.hi_x, b.hi_y), b.total) for b in sketch.buckets]
        want = _from_scratch(points, sketch.width)
        assert len(got) == len(want) <= 2 * 200
        for g, w in zip(got, want):
            assert g[:5] == w[:5] and abs(g[5] - w[5]) < 1e-6


def test_a_drawn_series_keeps_its_extremes_its_last_point_and_a_fixed_size():
    sketch = Sketch(budget=100, recent=20)
    ys = [0.0] * 100_000
    ys[1234], ys[87_650] = 9.0, -9.0
    for x, y in enumerate(ys):
        sketch.append(float(x), y)
    xs, drawn = sketch.points()
    assert len(xs) <= 2 * 100 + 20 and xs == sorted(xs)
    assert 9.0 in drawn and -9.0 in drawn
    assert xs[-20:] == [float(x) for x in range(99_980, 100_000)], "the newest points at full resolution"


def test_a_drawn_series_uses_its_whole_budget_at_any_length():
    """Exactly `budget` groups, whatever the length (a tick costs the same at step 1,000 as at 100,000), each the
    true extremes of the consecutive points it spans, checked as the series grows (merged pairs are kept)."""
    rng = random.Random(11)
    ys = [rng.gauss(0, 1) for _ in range(60_000)]
    sketch = Sketch(budget=100, recent=10)
    checkpoints = {150, 201, 450, 1000, 1001, 4097, 33_333, 60_000}
    for x, y in enumerate(ys, start=1):
        sketch.append(float(x), y)
        if x not in checkpoints:
            continue
        groups = sketch.groups()
        assert len(groups) == min(100, len(sketch.buckets)) and (x < 200 or len(groups) == 100)
        assert sum(g.count for g in groups) == x and groups[0].first_x == 1.0 and groups[-1].last_x == x
        for g, nxt in itertools.pairwise(groups):
            assert nxt.first_x == g.last_x + 1
        for g in groups:
            span = ys[int(g.first_x) - 1:int(g.last_x)]
            assert (g.lo_y, g.hi_y) == (min(span), max(span)) and abs(g.mean - sum(span) / len(span)) < 1e-9
        assert [(g.first_x, g.lo_y, g.hi_y) for g in groups] == \
               [(g.first_x, g.lo_y, g.hi_y) for g in Sketch.build([float(i) for i in range(1, x + 1)], ys[:x],
                                                                   budget=100, recent=10).groups()]
    drawn = {n: len(Sketch.build([float(i) for i in range(n)], ys[:n], budget=100, recent=10).points()[0])
             for n in (1000, 10_000, 60_000)}
    # 100 groups of two extremes, then the 10 newest (a group straddling them keeps only its points before them).
    assert all(2 * 100 + 10 - 2 <= d <= 2 * 100 + 10 for d in drawn.values()), drawn


def test_a_table_keeps_columns_and_a_resumed_trainers_repeated_steps_replace_the_old_ones():
    table = SeriesTable(budget=50, recent=5)
    for step in range(1, 31):
        table.add({"step": step, "time": 100.0 + step, "reward": step / 10, **({"kl": 0.1} if step % 2 else {})})
    for step in range(21, 26):                       # resumed from checkpoint-20: 21.. logged again
        table.add({"step": step, "time": 200.0 + step, "reward": -1.0})
    assert [r["step"] for r in table.rows()] == list(range(1, 26))
    assert [r["reward"] for r in table.rows(last=5)] == [-1.0] * 5
    assert "kl" in table.rows()[0] and "kl" not in table.rows()[1]
    xs, ys = table.sketch("reward").points()
    assert xs[-1] == 25.0 and ys[-1] == -1.0 and 3.0 not in ys
    assert table.sketch("reward", x="time").last == (225.0, -1.0)


def test_a_sketch_built_in_one_pass_equals_one_appended_point_by_point():
    rng = random.Random(3)
    for n in (0, 1, 150, 200, 201, 999, 12_345):
        xs = [float(i) for i in range(n)]
        ys = [rng.choice([0.0, 1.0, rng.gauss(0, 1)]) for _ in range(n)]    # ties: the first extreme wins
        appended = Sketch(budget=200, recent=10)
        for x, y in zip(xs, ys):
            appended.append(x, y)
        built = Sketch.build(xs, ys, budget=200, recent=10)
        assert built.width == appended.width and list(built.recent) == list(appended.recent)
        for a, b in zip(built.buckets, appended.buckets, strict=True):
            assert (a.count, a.first_x, a.last_x, a.lo_x, a.lo_y, a.hi_x, a.hi_y) == \
                   (b.count, b.first_x, b.last_x, b.lo_x, b.lo_y, b.hi_x, b.hi_y) and abs(a.total - b.total) < 1e-6


def test_a_sketch_drawn_once_keeps_up_with_new_rows():
    table = SeriesTable(budget=20, recent=5)
    for step in range(1, 101):
        table.add({"step": step, "time": float(step), "loss": float(step)})
    assert table.sketch("loss").count == 100
    for step in range(101, 121):
        table.add({"step": step, "time": float(step), "loss": float(step)})
    assert table.sketch("loss").last == (120.0, 120.0) and table.sketch("loss").count == 120
    assert table.sketch("loss", "time").count == 120 and table.sketch("missing") is None


def test_rows_added_at_once_equal_rows_added_one_by_one():
    rng = random.Random(5)
    rows = [{"step": i, "time": 10.0 + i, "loss": rng.random(), **({"kl": rng.random()} if i % 3 else {}),
             "flag": True} for i in range(1, 3001)]
    one, bulk = SeriesTable(), SeriesTable()
    for row in rows[:500]:
        one.add(row)
    bulk.extend(rows[:500])
    one.sketch("loss"), bulk.sketch("loss")            # drawn: the sketch follows new rows from here
    for row in rows[500:]:
        one.add(row)
    bulk.extend(rows[500:])
    assert one.rows() == bulk.rows() and "flag" not in one.rows()[0], "a bool is not a metric"
    assert one.sketch("loss").points() == bulk.sketch("loss").points()
    assert one.sketch("kl", "time").points() == bulk.sketch("kl", "time").points()
    resumed = rows[:100] + [{**r, "loss": -1.0} for r in rows[80:120]]
    table = SeriesTable()
    table.extend(resumed)
    assert [r["step"] for r in table.rows()] == list(range(1, 121)) and table.rows()[90]["loss"] == -1.0
