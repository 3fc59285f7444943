"""Dashboard figures from a run's bounded series: plain functions, no browser."""

import json

import pytest

from backend.executors.base import ResourceSample
from backend.storage.series import SeriesTable
from backend.view.job_view import ResourceUsage
from panel import chart_parts, charts, resource_charts

pytestmark = pytest.mark.unit

STEP = chart_parts.ChartOptions()


def table_of(rows: list[dict]) -> SeriesTable:
    table = SeriesTable()
    for row in rows:
        if "reward" in row and "reward_std" in row:
            row = {**row, "reward_upper": row["reward"] + row["reward_std"],
                   "reward_lower": row["reward"] - row["reward_std"]}
        table.add(row)
    return table


def names(fig: dict) -> list[str]:
    return [t["name"] for t in fig["data"]]


def test_downsampling_keeps_spikes_and_order():
    xs = list(range(10_000))
    ys = [0.0] * 10_000
    ys[1234], ys[8765] = 9.0, -9.0
    dx, dy = chart_parts.downsample(xs, ys, max_points=100)
    assert len(dx) <= 100 + 2 and dx == sorted(dx)
    assert 9.0 in dy and -9.0 in dy


def test_reward_figure_has_a_band_and_one_line_per_reward_function_only_when_there_are_several():
    rows = [{"step": i, "reward": i / 10, "reward_std": 0.1, "rewards/digits": i / 10, "rewards/format": 0.5}
            for i in range(1, 6)]
    assert names(charts.reward_figure(table_of(rows), STEP)) == ["± std", "mean reward", "digits", "format"]
    # GRPOTrainer's own "rewards/<f>/mean" and "/std" are kept in the records beside "rewards/<f>": not functions.
    one = [{"step": i, "reward": i / 10, "reward_std": 0.1, "rewards/digits": i / 10, "rewards/digits/mean": i / 10,
            "rewards/digits/std": 0.1} for i in range(1, 6)]
    fig = charts.reward_figure(table_of(one), STEP)
    assert names(fig) == ["± std", "mean reward"], "one function: its line would be the mean drawn twice"
    assert fig["layout"]["title"]["text"] == "Reward (digits)"


def test_the_reward_band_stays_within_the_rewards_seen():
    rows = [{"step": i, "reward": 0.05, "reward_std": 0.2, "rewards/digits": 0.05} for i in range(1, 6)]
    band = charts.reward_figure(table_of(rows), STEP)["data"][0]
    assert min(band["y"]) >= 0.05 - 1e-9, "a mean of 0.05 with std 0.2 must not draw the band down to -0.15"


def test_missing_and_non_finite_values_are_left_out():
    table = table_of([{"step": 1, "kl": float("nan")}, {"step": 2, "kl": 0.1}, {"step": 3}])
    assert chart_parts.points(table, "kl", STEP) == ([2], [0.1])


def test_a_short_run_gets_whole_step_ticks_and_a_single_series_keeps_its_legend():
    fig = charts.kl_figure(table_of([{"step": i, "kl": 0.1 * i} for i in range(1, 4)]), STEP)
    assert fig["layout"]["xaxis"]["dtick"] == 1 and fig["layout"]["xaxis"]["tickformat"] == "d"
    assert fig["layout"]["showlegend"] and names(fig) == ["KL"]
    assert fig["layout"]["yaxis"]["type"] == "log", "a positive KL is easier to read on a log axis"


def test_smoothing_draws_the_average_over_a_faint_raw_series():
    rows = [{"step": i, "loss": float(i % 2)} for i in range(1, 21)]
    fig = charts.optimisation_figure(table_of(rows), chart_parts.ChartOptions(smoothing=0.9))
    raw, smooth = fig["data"]
    assert raw["opacity"] < 0.5 and not raw["showlegend"] and smooth["name"] == "loss"
    assert max(smooth["y"]) - min(smooth["y"]) < max(raw["y"]) - min(raw["y"])


def test_the_wall_time_axis_counts_minutes_from_the_runs_start_for_metrics_and_resources_alike():
    options = chart_parts.ChartOptions(x="time", t0=1000.0)
    fig = charts.length_figure(table_of([{"step": 1, "time": 1060.0, "completion_length": 12.0}]), options)
    assert fig["data"][0]["x"] == [1.0] and fig["layout"]["xaxis"]["title"]["text"] == "wall time (min)"
    usage = ResourceUsage()
    usage.add([ResourceSample(time=1120.0, cpu_percent=50.0, ram_bytes=2**30)])
    util = resource_charts.utilisation_figure({"trainer": usage}, chart_parts.ChartOptions(t0=1000.0))
    assert util["data"][0]["x"] == [2.0], "resource charts line up with the metric charts"


def test_utilisation_plots_each_gpu_where_there_are_gpus_and_cpu_otherwise_one_colour_per_job():
    gpu, cpu = ResourceUsage(), ResourceUsage()
    for t in range(3):
        gpu.add([ResourceSample(time=t, cpu_percent=50, gpu_util=(80.0, 20.0), gpu_mem_bytes=(1, 2))])
        cpu.add([ResourceSample(time=t, cpu_percent=100.0)])
    fig = resource_charts.utilisation_figure({"trainer": gpu, "vllm-0": cpu}, STEP)
    assert names(fig) == ["trainer GPU0", "trainer GPU1", "vllm-0 CPU"]
    colours = [t["line"]["color"] for t in fig["data"]]
    assert colours[0] == colours[1] != colours[2]


def test_throughput_and_times_are_charts_of_their_own_units():
    rows = [{"step": i, "completion_length": 16.0, "tokens_per_s": 20_000.0, "weight_sync_s": 0.2, "step_time": 1.0}
            for i in range(1, 4)]
    table = table_of(rows)
    assert names(charts.throughput_figure(table, STEP)) == ["tokens/s"]
    assert names(charts.timing_figure(table, STEP)) == ["step"]
    assert charts.timing_figure(table, STEP)["layout"]["yaxis"]["title"]["text"] == "seconds"
    assert names(charts.sync_figure(table, STEP)) == ["weight sync", "step"]


def test_the_diagnosis_groups_show_their_limits_and_the_sync_share():
    spec = {"mode": "distributed", "queue_maxsize": 4, "max_inflight_tasks": 16, "adapter_every": 2,
            "max_staleness": 3}
    rows = [{"step": i, "step_time": 2.0, "weight_sync_s": 1.0, "fwd_bwd_s": 1.5, "rollout_wait_s": 0.1,
             "perf/mfu_wall_clock": 0.2, "sample/rollout_queue_size": 4.0, "rollout/inflight": 9.0,
             "rollout/backpressure_s": 0.5, "staleness_mean": 1.0, "staleness_max": 2.0, "ratio": 1.001}
            for i in range(1, 6)]
    table = table_of(rows)
    timing = charts.timing_figure(table, STEP)
    assert names(timing) == ["step", "forward + backward", "waiting for rollouts", "MFU (wall clock)"]
    assert timing["data"][-1]["yaxis"] == "y2", "MFU has an axis of its own"
    queue = charts.queue_figure(table, STEP, spec)
    assert names(queue) == ["rollout queue", "in flight", "backpressure"]
    assert [shape["y0"] for shape in queue["layout"]["shapes"]] == [4, 16], "the queue size and the in-flight cap"
    assert "25% of wall time" in charts.sync_figure(table, STEP, spec)["layout"]["title"]["text"], "1 s / (2 x 2 s)"
    assert charts.staleness_figure(table, STEP, spec)["layout"]["shapes"][0]["y0"] == 3, "max staleness drawn"
    low, high = charts.ratio_figure(table, STEP)["layout"]["yaxis"]["range"]
    assert 0.95 < low < 1 < high < 1.05, "the ratio's axis is scaled to its healthy range, not autoscaled"
    colocated = table_of([{"step": 1, "step_time": 1.0, "generation_s": 0.4}])
    note = charts.queue_figure(colocated, STEP, {"mode": "colocated"})["layout"]["annotations"][0]["text"]
    assert "colocated" in note
    assert "none logged" in charts.sync_figure(colocated, STEP)["layout"]["title"]["text"]


def test_an_empty_chart_says_why_and_a_filled_one_does_not():
    empty = charts.ratio_figure(table_of([{"step": 1, "reward": 0.5}]), STEP)
    assert not empty["data"] and "on-policy" in empty["layout"]["annotations"][0]["text"]
    waiting = charts.reward_figure(SeriesTable(), STEP)
    assert waiting["layout"]["annotations"][0]["text"] == chart_parts.EMPTY
    filled = charts.ratio_figure(table_of([{"step": 1, "ratio": 1.0}]), STEP)
    assert names(filled) == ["ratio"] and "annotations" not in filled["layout"]
    assert filled["layout"]["shapes"][0]["y0"] > 0.98, "the healthy band is narrow, not +-0.1"


def test_a_long_run_draws_a_bounded_figure():
    table = SeriesTable()
    for i in range(1, 100_001):
        table.add({"step": i, "reward": (i % 97) / 97})
    text = chart_parts.plot_json(charts.reward_figure(table, STEP))
    assert len(json.loads(text)["data"][0]["x"]) <= 2 * 200 + 100 and len(text) < 20_000


def test_the_sync_chart_draws_each_replicas_load_time_from_the_proxys_records(tmp_path):
    """The proxy records each broadcast load (seconds per replica); the run view reads those fragments beside the
    trainer's; the Sync chart draws one line per replica, at the first step trained with each version."""
    from backend.runtime.layout import FragmentWriter
    from backend.runtime.serving.proxy import Proxy, Reply
    from backend.storage.store import FolderStore
    from backend.view.runview import RunView

    store = FolderStore(tmp_path)
    metrics = store.local_path("runs/r1/metrics")
    proxy = Proxy(["http://a:8000", "http://b:8000", "http://c:8000"], stats_dir=metrics)
    a, b, c = proxy.replicas
    proxy._record_loads("trl-policy-v1", [a, b], [(Reply(200, "ok"), 0.25), (Reply(200, "ok"), 0.5)])
    proxy._record_loads("trl-policy-v2", [a, b], [(Reply(200, "ok"), 0.3), (Reply(200, "ok"), 1.25)])
    # Replica c was down for both; a refused load and a replica that did not answer are recorded, not drawn.
    proxy._record_loads("trl-policy-v3", [a, c], [(Reply(500, "rank"), 0.1), ConnectionError("gone")])
    FragmentWriter(metrics, "trainer").write([
        {"step": 1, "time": 100.0, "weight_sync_s": 0.6, "step_time": 2.0, "policy_version": 1},
        {"step": 2, "time": 102.0, "weight_sync_s": 1.3, "step_time": 2.0, "policy_version": 2},
        {"step": 3, "time": 104.0, "weight_sync_s": 1.3, "step_time": 2.0, "policy_version": 2}])

    view = RunView("r1", store, executor=None, jobs={})
    view.refresh()
    assert [load["version"] for load in view.adapter_loads] == ["trl-policy-v1", "trl-policy-v2", "trl-policy-v3"]
    assert view.adapter_loads[2]["replicas"] == [{"index": 0, "url": "http://a:8000", "seconds": 0.1, "status": 500},
                                                 {"index": 2, "url": "http://c:8000"}]
    assert [r["step"] for r in view.metrics] == [1, 2, 3], "load records are not steps"

    fig = charts.sync_figure(view.table, STEP, {"adapter_every": 1}, view.adapter_loads, view.first_step)
    lines = {t["name"]: (t["x"], t["y"]) for t in fig["data"]}
    assert list(lines) == ["weight sync", "step", "load on vllm-0", "load on vllm-1"]
    assert lines["load on vllm-0"] == ([1, 2], [0.25, 0.3])
    assert lines["load on vllm-1"] == ([1, 2], [0.5, 1.25]), "the slow replica shows: it holds each sync up"
    minutes = chart_parts.ChartOptions(x="time", t0=view.adapter_loads[0]["time"])
    xs, _ = {t["name"]: (t["x"], t["y"]) for t in charts.sync_figure(
        view.table, minutes, {}, view.adapter_loads, view.first_step)["data"]}["load on vllm-1"]
    assert xs[0] == 0 and len(xs) == 2, "on the time axis each load is placed at its own time"

    only_loads = charts.sync_figure(table_of([]), STEP, {}, view.adapter_loads, view.first_step)
    assert "annotations" not in only_loads["layout"], "drawn, not 'waiting for the first metrics'"


def test_held_out_reward_by_version_is_read_from_eval_fragments_and_drawn_beside_the_training_reward(tmp_path):
    from backend.runtime import layout
    from backend.runtime.trainer.evaluate import eval_record
    from backend.storage.store import FolderStore
    from backend.view.runview import RunView

    run = tmp_path / "runs" / "r1"
    writer = layout.FragmentWriter(str(run / layout.EVALS_DIR), layout.TRAINER_WRITER)
    rows = [{"prompt": [{"role": "user", "content": f"q{i}"}]} for i in range(3)]
    for version, score in ((1, 0.2), (2, 0.9), (3, 0.6)):
        scores = {"digits": [[score]] * 3, "accuracy_reward": [[1.0], [0.0], [0.0]]}
        writer.write([eval_record(10 * version, version, rows, [["7"]] * 3, scores,
                                  {"digits": 1.0, "accuracy_reward": 0.0}, greedy=True)])
    (run / layout.EVALS_DIR / "trainer-000009.jsonl").write_text('{"policy_version": "v4", "score": 1}\n')
    view = RunView("r1", FolderStore(str(tmp_path)), executor=None, jobs={})
    view.refresh()
    assert sorted(view.evals) == [1, 2, 3], "a record that is not an evaluation is skipped"
    assert view.evals[2]["rewards"]["accuracy_reward"] == {"mean": 1 / 3, "std": view.evals[2]["rewards"][
        "accuracy_reward"]["std"], "weight": 0.0, "solved": 1 / 3}
    table = table_of([{"step": s, "time": float(s), "reward": s / 40} for s in range(1, 31)])
    assert view.held_out.best_version == 2
    fig = charts.heldout_figure(view.evals, table, STEP, {"eval_source": "split"}, view.held_out.best_version)
    assert names(fig) == ["training reward", "held-out score", "digits", "accuracy_reward (monitor-only)",
                          "best: v2"]
    score = fig["data"][1]
    assert score["x"] == [10, 20, 30] and score["y"] == [0.2, 0.9, 0.6] and score["text"] == ["v1", "v2", "v3"]
    assert fig["data"][3]["line"]["dash"] == "dash" and fig["data"][4]["x"] == [20]
    # The star is the rule's, not the top score's: none where no version beats the base model.
    assert "best: v2" not in names(charts.heldout_figure(view.evals, table, STEP, {"eval_source": "split"}, None))
    assert "best: v3" in names(charts.heldout_figure(view.evals, table, STEP, {"eval_source": "split"}, 3))
    empty = charts.heldout_figure({}, table, STEP, {"eval_source": "none"})
    assert empty["data"] == [] and empty["layout"]["annotations"][0]["text"] == "no held-out set in this run"


def _evaluated_view(root, versions: int, best_at: int | None = None, monitor_at: int | None = None):
    """A run whose held-out set was evaluated at `versions` versions (v0 the base model), in fragments of 50
    records; its scores wander, one version (`best_at`) stands out, and one (`monitor_at`) has the best monitor."""
    from backend.runtime import layout
    from backend.runtime.trainer.evaluate import eval_record
    from backend.storage.store import FolderStore
    from backend.view.runview import RunView

    run = root / "runs" / "r1"
    writer = layout.FragmentWriter(str(run / layout.EVALS_DIR), layout.TRAINER_WRITER)
    rows = [{"prompt": "q"}]
    weights = {"digits": 1.0, "distinct_chars": 0.0}
    for start in range(0, versions, 50):
        writer.write([eval_record(10 * v, v, rows, [["7"]], {
            "digits": [[0.95 if v == best_at else 0.3 + 0.2 * ((v * 7919) % 101) / 101]],
            "distinct_chars": [[0.9 if v == monitor_at else 0.5]]}, weights, greedy=True)
            for v in range(start, min(start + 50, versions))])
    view = RunView("r1", FolderStore(str(root)), executor=None, jobs={})
    view.refresh()
    return view


def test_the_held_out_chart_draws_a_bounded_sketch_keeping_the_base_model_the_best_and_the_newest(tmp_path):
    from backend.outcome.held_out import CHART_GROUPS, CHART_NEWEST

    table = table_of([{"step": s, "time": float(s), "reward": 0.5} for s in range(1, 31)])
    sizes = {}
    for versions in (1000, 5000):
        view = _evaluated_view(tmp_path / str(versions), versions, best_at=777)
        shown = view.held_out.chart_records()
        assert len(view.evals) == versions and len(shown) <= 2 * CHART_GROUPS + CHART_NEWEST + 2, len(shown)
        assert {0, 777} <= set(shown) and set(range(versions - CHART_NEWEST, versions)) <= set(shown)
        fig = charts.heldout_figure(shown, table, STEP, {"eval_source": "split"}, view.held_out.best_version)
        assert "best: v777" in names(fig) and fig["data"][1]["text"][0] == "v0"
        sizes[versions] = len(json.dumps(fig))
    assert sizes[5000] <= 1.3 * sizes[1000] and sizes[5000] < 60_000, sizes

    small = _evaluated_view(tmp_path / "small", 30)
    assert sorted(small.held_out.chart_records()) == list(range(30)), "a short run's chart draws every version"


def test_the_held_out_chart_draws_the_base_model_the_best_under_the_rule_and_the_newest_exactly_at_any_length(
        tmp_path):
    """The best under a rule other than the trained score (here a monitor's peak, no extreme of the scores the
    sketch keeps), the base model and the newest version are drawn as they are, whatever the run's length; the
    rest costs about what a 1,000-step run's 50 versions do."""
    from backend.outcome.held_out import CHART_GROUPS, CHART_NEWEST

    table = table_of([{"step": s, "time": float(s), "reward": 0.5} for s in range(1, 31)])
    for versions in (60, 700, 5000):
        view = _evaluated_view(tmp_path / str(versions), versions, monitor_at=versions // 3)
        held = view.held_out
        assert held.set_rule({"distinct_chars": 1.0}) and held.best_version == versions // 3
        shown = held.chart_records()
        assert len(shown) <= 2 * CHART_GROUPS + CHART_NEWEST + 2 <= 52, len(shown)
        assert {0, versions // 3, versions - 1} <= set(shown), sorted(shown)
        assert all(shown[v] == held.records[v] for v in shown), "a drawn version is its record, not a group's mean"
        fig = charts.heldout_figure(shown, table, STEP, {"eval_source": "split"}, held.best_version)
        [star] = [t for t in fig["data"] if t["name"] == f"best: v{versions // 3}"]
        assert star["y"] == [chart_parts.rounded(held.records[versions // 3]["score"])]
        line = next(t for t in fig["data"] if t["name"] == "held-out score")
        assert line["text"][0] == "v0" and line["text"][-1] == f"v{versions - 1}"


def test_a_one_point_chart_spans_its_value_not_a_hair_around_it():
    one = table_of([{"step": 1, "reward": 0.25, "completion_length": 0.0, "staleness_mean": 1.0}])
    reward = charts.reward_figure(one, STEP)
    assert reward["layout"]["yaxis"]["range"] == [0.125, 0.375] and reward["layout"]["yaxis"]["automargin"]
    assert charts.length_figure(one, STEP)["layout"]["yaxis"]["range"] == [-1.0, 1.0], "zero: ± 1"
    capped = charts.staleness_figure(one, STEP, {"mode": "distributed", "max_staleness": 4})
    assert capped["layout"]["yaxis"]["range"] == [0.5, 4], "the cap line stays on the chart"
    two = table_of([{"step": 1, "reward": 0.25}, {"step": 2, "reward": 0.5}])
    assert "range" not in charts.reward_figure(two, STEP)["layout"]["yaxis"]
    assert reward["layout"]["modebar"] == {"orientation": "v"}, "the toolbar down the right edge, off the title"


def test_a_runs_charts_name_their_x_axis_kind_and_keep_a_zoom_across_redraws_of_that_run_only():
    table = table_of([{"step": 1, "time": 1060.0, "reward": 0.5, "kl": 0.1}])
    usage = ResourceUsage()
    usage.add([ResourceSample(time=1120.0, cpu_percent=50.0, ram_bytes=2**30)])
    run = chart_parts.ChartOptions(t0=1000.0)
    reward, kl = charts.reward_figure(table, run)["layout"], charts.kl_figure(table, run)["layout"]
    util = resource_charts.utilisation_figure({"trainer": usage}, run)["layout"]
    assert reward["meta"] == kl["meta"] == {"x_axis": "step"} and util["meta"] == {"x_axis": "time"}
    again = charts.reward_figure(table_of([{"step": 2, "time": 1070.0, "reward": 0.7}]), run)["layout"]
    assert again["uirevision"] == reward["uirevision"], "new points keep the chart's zoom (plotly's uirevision)"
    other_run = charts.reward_figure(table, chart_parts.ChartOptions(t0=2000.0))["layout"]
    other_axis = charts.reward_figure(table, chart_parts.ChartOptions(x="time", t0=1000.0))["layout"]
    assert reward["uirevision"] not in (other_run["uirevision"], other_axis["uirevision"])
