"""Compare runs and the charts' x-axis: settings that differ, overlaid down-sampled series, step/time/dollars."""

from types import SimpleNamespace

from backend.executors.base import ResourceSample
from backend.plan.cost import spend_knots
from backend.plan.engines import engine
from backend.plan.jobspec import JobRecord
from backend.plan.spec import RunSpec
from backend.view.compare import config_diff, metric_points, on_axis
from backend.view.runview import ResourceUsage
from backend.view.series import SeriesTable
from panel import charts, compare_view

T0 = 1_800_000_000.0


def _view(run_id: str, steps: int, spec: dict | None = None, every_s: float = 2.0):
    metrics = [{"step": s, "time": T0 + every_s * s, "reward": (s % 100) / 100, "step_time": every_s,
                "tokens_per_s": 1000.0 + s % 7} for s in range(1, steps + 1)]
    return SimpleNamespace(run_id=run_id, metrics=metrics, spec=spec or RunSpec(run_id=run_id, created_at=T0).to_dict(),
                           refresh=lambda: False, wait_for_history=lambda timeout=None: True, jobs={}, events=[],
                           adapters={}, replica_stats=[], final_files=[],
                           stage="COMPLETED", engine=None)


def _panel(views: dict, executor: str = "local", cost_at=None):
    registry = SimpleNamespace(view=lambda run_id: views[run_id], executor=SimpleNamespace(name=executor),
                               engine=engine(executor), namespace=None, job_records=lambda run_id: [])

    def find(run_id, visitor):
        if run_id not in views:
            raise KeyError(run_id)
        return registry

    return SimpleNamespace(runs=SimpleNamespace(find=find), spend=SimpleNamespace(
        prices=lambda registry: {}, clock=lambda: T0)), registry


def test_the_diff_lists_exactly_the_settings_that_differ():
    a = RunSpec(run_id="a", learning_rate=5e-3).to_dict()
    b = RunSpec(run_id="b", learning_rate=1e-3).to_dict()
    assert config_diff({"a": a, "b": b}) == [["learning_rate", "0.005", "0.001"]]
    older = {k: v for k, v in b.items() if k != "budget_usd"}     # spec.json of a panel before budgets
    assert config_diff({"a": a, "b": older}) == [["learning_rate", "0.005", "0.001"]]
    c = RunSpec(run_id="c", lora_target_modules=["q_proj"], reward_code="def f(completions, **kw):\n    return []\n",
                reward_weights={"digits": 2.0}).to_dict()
    rows = {r[0]: r[1:] for r in config_diff({"a": a, "c": c})}
    assert set(rows) == {"lora_target_modules", "reward_code", "reward_weights"}
    assert rows["lora_target_modules"] == ["q_proj, k_proj, v_proj, o_proj", "q_proj"]
    assert rows["reward_code"][0] == "" and rows["reward_code"][1].startswith("2 lines (sha256 ")
    assert rows["reward_weights"] == ["", "digits=2.0"]


def test_long_runs_are_compared_from_bounded_series():
    views = {"long": _view("long", 100_000), "short": _view("short", 50)}
    xs, ys = metric_points(views["long"], "reward")
    assert 100 < len(xs) <= 2 * 200 + 100 and xs[-1] == 100_000 and max(ys) == 0.99, "spikes survive"
    panel, _ = _panel(views)
    figures, table, note = compare_view.compare(panel, ["long", "short"], "step", None)
    assert [len(t.x) for t in figures["reward"].data] == [len(xs), 50]
    assert all(len(t.x) <= 500 for f in figures.values() for t in f.data)
    assert [t.name.split(" · ")[1] for t in figures["throughput"].data] == ["long", "short"]
    assert table.empty and list(table.columns) == ["setting", "long", "short"] and "0 setting(s) differ" in note


def test_wall_time_and_dollars_axes():
    assert on_axis([T0 + 60, T0 + 180], "wall time", T0 + 60, None) == [0, 2]
    assert on_axis([T0 + 2], "dollars", T0, None) is None
    assert on_axis([T0 + 10], "dollars", T0, lambda t: (t - T0) / 100) == [0.1]
    panel, _ = _panel({"a": _view("a", 5), "b": _view("b", 5)})
    figures, _, note = compare_view.compare(panel, ["a", "b"], "dollars", None)
    assert not figures["reward"].data and "a is a local run: it costs nothing" in note
    figures, _, _ = compare_view.compare(panel, ["a", "b"], "wall time", None)
    assert list(figures["reward"].data[0].x) == [0.033, 0.067, 0.1, 0.133, 0.167], "minutes since the spec's creation"
    assert figures["reward"].layout.xaxis.title.text == "wall time (min)"


def test_the_dashboard_charts_follow_the_chosen_x_axis():
    table = SeriesTable()
    for s in range(1, 5):
        table.add({"step": s, "time": T0 + 60.0 * s, "reward": s / 10})
    usage = ResourceUsage()
    usage.add([ResourceSample(time=T0 + 120.0, cpu_percent=50.0, ram_bytes=2**30)])
    # One job billing $1.20/h from T0 + 60 s: $0.02 a minute; nothing spent before it started.
    corners = spend_knots([JobRecord("j", "r", "trainer", "RUNNING", T0, flavor="a10g-small", started_at=T0 + 60.0)],
                          {"a10g-small": 1.2}, T0 + 300.0)
    dollars = charts.ChartOptions(x="dollars", t0=T0, dollars=corners)
    fig = charts.reward_figure(table, dollars)
    [mean] = [t for t in fig["data"] if t["name"] == "mean reward"]
    assert mean["x"] == [0.0, 0.02, 0.04, 0.06] and fig["layout"]["xaxis"]["title"]["text"] == "dollars spent (USD)"
    assert charts.utilisation_figure({"trainer": usage}, dollars)["data"][0]["x"] == [0.02]
    assert charts.spent_at(corners, T0 + 10_000) == 0.08, "flat after the last corner (the clock's now)"
    minutes = charts.ChartOptions(x="time", t0=T0, x_note="local runs cost nothing")
    fig = charts.reward_figure(table, minutes)
    assert next(t for t in fig["data"] if t["name"] == "mean reward")["x"] == [1.0, 2.0, 3.0, 4.0]
    assert fig["layout"]["xaxis"]["title"]["text"] == "wall time (min) (local runs cost nothing)"
    fig = charts.reward_figure(table, charts.ChartOptions())
    assert next(t for t in fig["data"] if t["name"] == "mean reward")["x"] == [1, 2, 3, 4]


