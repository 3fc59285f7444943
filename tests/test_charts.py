"""Dashboard figures from run data: plain functions, no browser."""

from backend.executors.base import ResourceSample
from panel import charts


def test_downsampling_keeps_spikes_and_order():
    xs = list(range(10_000))
    ys = [0.0] * 10_000
    ys[1234], ys[8765] = 9.0, -9.0
    dx, dy = charts.downsample(xs, ys, max_points=100)
    assert len(dx) <= 100 + 2 and dx == sorted(dx)
    assert 9.0 in dy and -9.0 in dy


def test_ratio_warning_only_when_the_recent_ratio_drifts_from_one():
    steady = [{"step": i, "ratio": 1.0 + (0.01 if i % 2 else -0.01)} for i in range(20)]
    assert charts.ratio_warning(steady) is None
    drifting = steady + [{"step": 20 + i, "ratio": 1.4} for i in range(5)]
    assert "drifted" in charts.ratio_warning(drifting)
    assert charts.ratio_warning([{"step": 1, "reward": 0.5}]) is None


def test_reward_figure_has_a_std_band_and_one_line_per_reward_function():
    records = [{"step": i, "reward": i / 10, "reward_std": 0.1, "rewards/digits": i / 10, "rewards/format": 0.5}
               for i in range(1, 6)]
    names = [t.name for t in charts.reward_figure(records).data]
    assert names == ["± std", "mean reward", "digits", "format"]


def test_missing_and_non_finite_values_are_left_out():
    xs, ys = charts.series([{"step": 1, "kl": float("nan")}, {"step": 2, "kl": 0.1}, {"step": 3}], "kl")
    assert (xs, ys) == ([2], [0.1])


def test_utilisation_plots_each_gpu_where_there_are_gpus_and_cpu_otherwise():
    gpu = [ResourceSample(time=t, cpu_percent=50, gpu_util=(80.0, 20.0), gpu_mem_bytes=(1, 2)) for t in range(3)]
    cpu = [ResourceSample(time=t, cpu_percent=100.0) for t in range(3)]
    names = [t.name for t in charts.utilisation_figure({"trainer": gpu, "vllm-0": cpu}).data]
    assert names == ["trainer GPU0 util", "trainer GPU1 util", "vllm-0 CPU"]


def test_throughput_puts_tokens_per_second_on_its_own_axis():
    records = [{"step": i, "completion_length": 16.0, "tokens_per_s": 20_000.0, "weight_sync_s": 0.2}
               for i in range(1, 4)]
    axes = {t.name: t.yaxis for t in charts.throughput_figure(records).data}
    assert axes == {"completion length (tokens)": "y", "weight sync (s)": "y", "tokens/s": "y2"}


def test_an_empty_ratio_chart_says_why_and_a_filled_one_does_not():
    empty = charts.ratio_figure([{"step": 1, "reward": 0.5}])
    assert not empty.data and not empty.layout.shapes and "on-policy" in empty.layout.annotations[0].text
    filled = charts.ratio_figure([{"step": 1, "ratio": 1.0}])
    assert [t.name for t in filled.data] == ["ratio"] and not filled.layout.annotations
