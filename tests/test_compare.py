"""Compare runs and the charts' x-axis: settings that differ, overlaid down-sampled series, step/time/dollars."""

from types import SimpleNamespace

import pytest

from backend.executors.base import ResourceSample
from backend.plan.cost import spend_knots
from backend.plan.engines import engine
from backend.plan.jobspec import JobRecord
from backend.plan.spec import RunSpec
from backend.storage.series import SeriesTable
from backend.view.compare import config_diff, metric_points, on_axis
from backend.view.job_view import ResourceUsage
from panel import chart_parts, charts, compare_view, resource_charts

pytestmark = pytest.mark.unit

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
    figures, table, note, best = compare_view.compare(panel, ["long", "short"], "step", None)
    assert [len(t.x) for t in figures["reward"].data] == [len(xs), 50]
    assert all(len(t.x) <= 500 for f in figures.values() for t in f.data)
    assert [t.name.split(" · ")[1] for t in figures["throughput"].data] == ["long", "short"]
    assert table.empty and list(table.columns) == ["setting", "long", "short"] and "0 setting(s) differ" in note
    assert best.empty and not figures["heldout"].data, "runs without a held-out evaluation list no outcome"


def test_wall_time_and_dollars_axes():
    assert on_axis([T0 + 60, T0 + 180], "wall time", T0 + 60, None) == [0, 2]
    assert on_axis([T0 + 2], "dollars", T0, None) is None
    assert on_axis([T0 + 10], "dollars", T0, lambda t: (t - T0) / 100) == [0.1]
    panel, _ = _panel({"a": _view("a", 5), "b": _view("b", 5)})
    figures, _, note, _ = compare_view.compare(panel, ["a", "b"], "dollars", None)
    assert not figures["reward"].data and "a is a local run: it costs nothing" in note
    figures, _, _, _ = compare_view.compare(panel, ["a", "b"], "wall time", None)
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
    dollars = chart_parts.ChartOptions(x="dollars", t0=T0, dollars=corners)
    fig = charts.reward_figure(table, dollars)
    [mean] = [t for t in fig["data"] if t["name"] == "mean reward"]
    assert mean["x"] == [0.0, 0.02, 0.04, 0.06] and fig["layout"]["xaxis"]["title"]["text"] == "dollars spent (USD)"
    assert resource_charts.utilisation_figure({"trainer": usage}, dollars)["data"][0]["x"] == [0.02]
    assert chart_parts.spent_at(corners, T0 + 10_000) == 0.08, "flat after the last corner (the clock's now)"
    minutes = chart_parts.ChartOptions(x="time", t0=T0, x_note="local runs cost nothing")
    fig = charts.reward_figure(table, minutes)
    assert next(t for t in fig["data"] if t["name"] == "mean reward")["x"] == [1.0, 2.0, 3.0, 4.0]
    assert fig["layout"]["xaxis"]["title"]["text"] == "wall time (min) (local runs cost nothing)"
    fig = charts.reward_figure(table, chart_parts.ChartOptions())
    assert next(t for t in fig["data"] if t["name"] == "mean reward")["x"] == [1, 2, 3, 4]




def _evaluated_run(root, run_id: str, best_by: dict, scores: dict[int, tuple[float, float]], steps: int = 40):
    """A run's folder with its spec (its best_by rule), metrics and held-out records: version -> (the gameable
    `digits`, trained, weight 1; the monitor-only `right_answer`); version 0 is the base model."""
    import json

    from backend.runtime import layout
    from backend.runtime.trainer.evaluate import eval_record
    from backend.storage.store import FolderStore
    from backend.view.runview import RunView

    run = root / "runs" / run_id
    run.mkdir(parents=True)
    spec = RunSpec(run_id=run_id, created_at=T0, best_by=best_by).to_dict()
    (run / "spec.json").write_text(json.dumps(spec))
    layout.FragmentWriter(str(run / "metrics"), layout.TRAINER_WRITER).write(
        [{"step": s, "time": T0 + s, "reward": s / steps} for s in range(1, steps + 1)])
    rows = [{"prompt": "q"}]
    layout.FragmentWriter(str(run / layout.EVALS_DIR), layout.TRAINER_WRITER).write(
        [{**eval_record(10 * v, v, rows, [["7"]], {"digits": [[d]], "right_answer": [[r]]},
                        {"digits": 1.0, "right_answer": 0.0}, greedy=True), "time": T0 + 10 * v}
         for v, (d, r) in scores.items()])
    return RunView(run_id, FolderStore(str(root)), executor=None, jobs={})


def test_runs_are_compared_by_held_out_score_per_version_each_under_its_own_rule_from_the_base_model(tmp_path):
    hacked = {0: (0.2, 0.3), 1: (0.6, 0.5), 2: (1.0, 0.0), 3: (1.0, 0.0)}       # the gamed reward climbs
    views = {"by-default": _evaluated_run(tmp_path / "a", "by-default", {}, hacked),
             "by-answer": _evaluated_run(tmp_path / "b", "by-answer", {"right_answer": 1.0}, hacked),
             "no-better": _evaluated_run(tmp_path / "c", "no-better", {"right_answer": 1.0},
                                         {0: (0.2, 0.9), 1: (0.5, 0.4), 2: (0.9, 0.1)})}
    panel, _ = _panel(views)
    figures, _, _, best = compare_view.compare(panel, list(views), "step", None)
    lines = [t for t in figures["heldout"].data if t.mode == "lines+markers"]
    assert [t.name.split(" · ")[1] for t in lines] == list(views)
    assert [list(t.x) for t in lines] == [[0, 10, 20, 30]] * 2 + [[0, 10, 20]], "each line starts at v0, the base"
    assert [list(t.y) for t in lines] == [[0.2, 0.6, 1.0, 1.0], [0.3, 0.5, 0.0, 0.0], [0.9, 0.4, 0.1]]
    stars = [t for t in figures["heldout"].data if t.mode == "markers+text"]
    assert [(list(t.x), list(t.text)) for t in stars] == [([20], ["v2"]), ([10], ["v1"])], "ties: the earliest"
    assert best.values.tolist() == [
        ["by-default", "the trained rewards' weighted score", "0.200", "v2", "1.000", "3"],
        ["by-answer", "held-out right_answer", "0.300", "v1", "0.500", "3"],
        ["no-better", "held-out right_answer", "0.900", "none beats the base model", "-", "2"]]
    figures, _, _, _ = compare_view.compare(panel, list(views), "wall time", None)
    assert list(figures["heldout"].data[0].x) == [0.0, 0.167, 0.333, 0.5], "minutes, as its records say"
