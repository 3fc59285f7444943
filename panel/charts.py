"""Dashboard figures from a run's bounded series. Plain functions returning plotly's JSON as dicts: no plotly
objects (their validation cost more than the data) and unit-testable without a browser.

Every trace is drawn from a `Sketch` (backend/storage/series.py): at most a few hundred points whatever the run's
length, extremes kept, the newest points as they are. Charts share one x axis choice (steps, or wall time in
minutes since the run started, resource charts included), one colour per metric and per job, an optional
exponential moving average with the raw series kept faint behind it (as TensorBoard and W&B draw it), units on
every axis, and a line saying why a chart is empty.
"""

import bisect
import json
import math
from dataclasses import dataclass

from backend.runtime.best_rule import rule_score, rule_text
from backend.runtime.layout import adapter_version, reward_function_keys
from backend.view.axes import wall_minutes
from backend.view.diagnose import RATIO_BAND

MAX_POINTS = 600
EMPTY = "waiting for the first metrics"
METRIC_COLORS = {
    "reward": "#1f77b4", "kl": "#d62728", "entropy": "#9467bd", "staleness_mean": "#1f77b4",
    "staleness_max": "#ff7f0e", "dropped_stale_total": "#7f7f7f", "ratio": "#2ca02c", "completion_length": "#8c564b",
    "tokens_per_s": "#1f77b4", "gen_tokens_per_s": "#ff7f0e", "train_tokens_per_s": "#2ca02c",
    "step_time": "#1f77b4", "weight_sync_s": "#d62728", "generation_s": "#ff7f0e",
    "loss": "#1f77b4", "grad_norm": "#ff7f0e", "learning_rate": "#2ca02c", "fwd_bwd_s": "#2ca02c",
    "rollout_wait_s": "#9467bd", "perf/mfu_wall_clock": "#7f7f7f", "sample/rollout_queue_size": "#1f77b4",
    "rollout/inflight": "#ff7f0e", "rollout/backpressure_s": "#d62728", "rollout/score_block_s": "#9467bd",
}
HELD_OUT_COLOR = "#2ca02c"
PALETTE = ["#17becf", "#bcbd22", "#e377c2", "#8c564b", "#7f7f7f", "#9467bd", "#ff7f0e", "#2ca02c"]
ROLE_COLORS = {"trainer": "#1f77b4", "vllm-0": "#ff7f0e", "vllm-1": "#2ca02c", "vllm-2": "#d62728",
               "vllm-3": "#9467bd"}
GPU_DASHES = ["solid", "dot", "dash", "dashdot", "longdash", "longdashdot", "solid", "dot"]


@dataclass(frozen=True)
class ChartOptions:
    x: str = "step"            # "step"; "time": minutes of wall time since the run started; "dollars": spent by then
    smoothing: float = 0.0     # exponential moving average weight in [0, 0.99]; 0 draws the raw series only
    t0: float = 0.0            # the run's start, epoch seconds, for the time axis (backend.view.axes.run_start)
    dollars: tuple = ()        # ((epoch s, USD spent), ...) corners of the run's spend (backend.plan.cost.spend_knots)
    x_note: str = ""           # said after the axis title (why a dollars axis shows wall time)

    @property
    def x_title(self) -> str:
        title = {"step": "step", "dollars": "dollars spent (USD)"}.get(self.x, "wall time (min)")
        return f"{title} ({self.x_note})" if self.x_note else title

    def at(self, t: float) -> float:
        """An epoch time on this (non-step) axis."""
        if self.x != "dollars":
            return wall_minutes(t, self.t0)
        return _round(spent_at(self.dollars, t))


def spent_at(corners: tuple, t: float) -> float:
    """Dollars spent by epoch time `t`, linear between the corners of the spend curve."""
    if not corners or t <= corners[0][0]:
        return 0.0
    i = bisect.bisect_right(corners, (t, math.inf))
    if i >= len(corners):
        return corners[-1][1]
    (t0, c0), (t1, c1) = corners[i - 1], corners[i]
    return c0 + (c1 - c0) * (t - t0) / (t1 - t0) if t1 > t0 else c1


def downsample(xs: list, ys: list, max_points: int = MAX_POINTS) -> tuple[list, list]:
    """Keep the min and max of each bin, in order, so spikes survive down-sampling (for series held whole)."""
    if len(xs) <= max_points:
        return list(xs), list(ys)
    bins = max_points // 2
    size = math.ceil(len(xs) / bins)
    out_x, out_y = [], []
    for start in range(0, len(xs), size):
        idx = range(start, min(start + size, len(xs)))
        lo = min(idx, key=lambda i: ys[i])
        hi = max(idx, key=lambda i: ys[i])
        for i in sorted({lo, hi}):
            out_x.append(xs[i])
            out_y.append(ys[i])
    return out_x, out_y


def series(records: list[dict], key: str, x_key: str = "step") -> tuple[list, list]:
    pts = [(r[x_key], r[key]) for r in records if _num(r.get(key)) and r.get(x_key) is not None]
    return [p[0] for p in pts], [float(p[1]) for p in pts]


def _num(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _round(value: float) -> float:
    return float(f"{value:.5g}")


def points(table, key: str, options: ChartOptions, summary: str = "points") -> tuple[list, list]:
    """A metric's drawable points on the chosen x axis (steps, or minutes since the start); `summary` "means" gives
    each bucket's mean instead of its extremes."""
    sketch = table.sketch(key, "step" if options.x == "step" else "time")
    if sketch is None:
        return [], []
    xs, ys = getattr(sketch, summary)()
    xs = [int(x) for x in xs] if options.x == "step" else [options.at(x) for x in xs]
    return xs, [_round(y) for y in ys]


def ema(ys: list[float], weight: float) -> list[float]:
    """TensorBoard's smoothing: an exponential moving average, debiased so the start is not pulled to 0."""
    out, last = [], 0.0
    for i, y in enumerate(ys, start=1):
        last = weight * last + (1 - weight) * y
        out.append(_round(last / (1 - weight**i)))
    return out


def figure(title: str, y_title: str, options: ChartOptions, **layout) -> dict:
    """An empty figure: title, axis titles with units, legend below the plot, hover values for every series.

    Its x axis kind goes into `meta` (the page's script zooms a run's charts of one kind together: `panel.ui`), and
    `uirevision` names the run's start and that kind: a redraw with new points keeps a zoom, while another run or
    another axis draws afresh."""
    xaxis = {"title": {"text": options.x_title}}
    return {"data": [], "layout": {
        "meta": {"x_axis": options.x}, "uirevision": f"{options.x}@{options.t0}",
        "title": {"text": title}, "height": 300, "margin": {"l": 50, "r": 50, "t": 40, "b": 70},
        "xaxis": xaxis, "yaxis": {"title": {"text": y_title}}, "template": "plotly_white",
        "legend": {"orientation": "h", "y": -0.3, "yanchor": "top"}, "showlegend": True,
        # The toolbar stands on the right edge, not across the title; tick labels widen the margin they need.
        "modebar": {"orientation": "v"}, "hovermode": "x unified", **layout}}


def add_line(fig: dict, xs: list, ys: list, name: str, color: str | None, options: ChartOptions,
             yaxis: str = "y", dash: str = "solid") -> None:
    """A series, smoothed when asked: the smoothed line carries the name, the raw one stays faint behind it."""
    if not xs:
        return
    line = {"color": color, "dash": dash, "width": 2}
    base = {"type": "scatter", "mode": "lines", "x": xs, "yaxis": yaxis, "legendgroup": name}
    if options.smoothing > 0 and len(ys) > 2:
        fig["data"].append({**base, "y": ys, "name": f"{name} (raw)", "showlegend": False, "opacity": 0.25,
                            "line": {**line, "width": 1}, "hoverinfo": "skip"})
        fig["data"].append({**base, "y": ema(ys, options.smoothing), "name": name, "line": line})
    else:
        fig["data"].append({**base, "y": ys, "name": name, "line": line,
                            "mode": "lines+markers" if len(xs) <= 50 else "lines", "marker": {"size": 4}})


def finish(fig: dict, options: ChartOptions, note: str = EMPTY) -> dict:
    """Integer ticks on a short step axis; an empty chart says why instead of drawing bare axes."""
    if not fig["data"]:
        fig["layout"]["annotations"] = [{"text": note, "showarrow": False, "xref": "paper", "yref": "paper",
                                         "x": 0.5, "y": 0.5, "font": {"color": "#888"}}]
        fig["layout"]["xaxis"]["visible"] = False
        fig["layout"]["yaxis"]["visible"] = False
        fig["layout"]["showlegend"] = False
        return fig
    if options.x == "step":
        top = max((max(t["x"]) for t in fig["data"] if t.get("x")), default=0)
        fig["layout"]["xaxis"].update({"tickformat": "d"}, **({"dtick": 1} if top <= 10 else {}))
    for axis, ref in (("yaxis", "y"), ("yaxis2", "y2")):
        if axis in fig["layout"]:
            fig["layout"][axis].setdefault("automargin", True)
            flat_axis_range(fig, axis, ref)
    return fig


def flat_axis_range(fig: dict, axis: str, ref: str) -> None:
    """A y axis whose series (and cap lines) are one value (one point, or a constant) spans that value ± half of it
    (± 1 around 0) instead of plotly's own ± 1e-8 around it, whose labels run to many digits and are clipped."""
    layout = fig["layout"][axis]
    if "range" in layout or layout.get("type") == "log":
        return
    ys = [y for t in fig["data"] if t.get("yaxis", "y") == ref for y in t.get("y") or () if _num(y)]
    ys += [s["y0"] for s in fig["layout"].get("shapes", ()) if s.get("yref") == ref and _num(s.get("y0"))]
    if ys and min(ys) == max(ys):
        pad = abs(ys[0]) / 2 or 1.0
        layout["range"] = [ys[0] - pad, ys[0] + pad]


def lines_figure(table, keys: dict[str, str], title: str, y_title: str, options: ChartOptions,
                 right: dict[str, str] | None = None, right_title: str = "", log_y: bool = False) -> dict:
    """One line per metric key that has data; `keys` (and `right`, on a second axis) map key -> legend name."""
    fig = figure(title, y_title, options)
    for axis, group in (("y", keys), ("y2", right or {})):
        for key, name in group.items():
            add_line(fig, *points(table, key, options), name, METRIC_COLORS.get(key), options, yaxis=axis)
    if right and any(t["yaxis"] == "y2" for t in fig["data"]):
        fig["layout"]["yaxis2"] = {"title": {"text": right_title}, "overlaying": "y", "side": "right",
                                   "showgrid": False}
    if log_y:
        fig["layout"]["yaxis"]["type"] = "log"
    return finish(fig, options)


def reward_figure(table, options: ChartOptions) -> dict:
    """Mean reward with its +-std band, and one line per reward function when there are several."""
    fig = figure("Reward", "reward", options)
    functions = reward_function_keys(table.columns)
    xs_up, up = points(table, "reward_upper", options, "means")
    xs_low, low = points(table, "reward_lower", options, "means")
    if xs_up and xs_low:
        # The band stays within the rewards seen: +-std must not suggest scores no completion got.
        floor = min(_extreme(table, f, min) for f in functions) if functions else min(low)
        ceiling = max(_extreme(table, f, max) for f in functions) if functions else max(up)
        fig["data"].append({"type": "scatter", "x": xs_up + xs_low[::-1],
                            "y": [min(v, ceiling) for v in up] + [max(v, floor) for v in low[::-1]],
                            "fill": "toself", "name": "± std", "line": {"width": 0},
                            "fillcolor": "rgba(31,119,180,0.15)", "hoverinfo": "skip"})
    mean = points(table, "reward", options)
    add_line(fig, *mean, "mean reward", METRIC_COLORS["reward"], options)
    lines = {key: points(table, key, options) for key in functions}
    if len(functions) == 1 and lines[functions[0]] == mean:
        # One reward function weighing 1 is the mean: the same line drawn twice would only confuse.
        fig["layout"]["title"]["text"] = f"Reward ({functions[0].split('/', 1)[1]})"
        lines = {}
    for i, (key, (xs, ys)) in enumerate(lines.items()):
        add_line(fig, xs, ys, key.split("/", 1)[1], PALETTE[i % len(PALETTE)], options, dash="dot")
    return finish(fig, options)


def heldout_figure(evals: dict, table, options: ChartOptions, spec: dict | None = None,
                   best: int | None = None, rule: dict | None = None) -> dict:
    """The held-out score of each evaluated version from the base model (v0) on, under the run's best-by `rule`
    (the score that decides; ± its spread over prompts under the default rule, the trained score), the best version
    under the rule starred (`best`: none where no version beats the base model), the trained score beside it where
    the rule is another, each reward's held-out mean (monitor-only ones dashed), and the training reward faint
    behind them."""
    fig = figure("Held-out reward by version", "reward", options)
    rule = rule or {}
    records = sorted(evals.values(), key=lambda r: r["policy_version"])
    records = [r for r in records if rule_score(r, rule) is not None]
    if records:
        xs = [r["step"] if options.x == "step" else options.at(r["time"]) for r in records]
        train_xs, train_ys = points(table, "reward", options)
        if train_xs:
            fig["data"].append({"type": "scatter", "mode": "lines", "x": train_xs, "y": train_ys,
                                "name": "training reward", "opacity": 0.35, "hoverinfo": "skip",
                                "line": {"color": METRIC_COLORS["reward"], "width": 1}})
        scores = [_round(rule_score(r, rule)) for r in records]
        name = "held-out score" + (f" ({rule_text(rule)})" if rule else "")
        line = {"type": "scatter", "mode": "lines+markers", "x": xs, "y": scores, "name": name,
                "line": {"color": HELD_OUT_COLOR, "width": 2}, "marker": {"size": 7},
                "text": [f"v{r['policy_version']}" for r in records],
                "hovertemplate": f"%{{text}}: %{{y}}<extra>{name}</extra>"}
        if not rule:
            line["error_y"] = {"type": "data", "array": [_round(r.get("score_std") or 0.0) for r in records],
                               "visible": True, "thickness": 1}
        else:       # what the trainer maximised, named so, beside the score that decides
            add_line(fig, xs, [_round(r["score"]) for r in records], "trained score", "#7f7f7f", options, dash="dash")
        fig["data"].append(line)
        names = list(dict.fromkeys(n for r in records for n in r.get("rewards", {})))
        if len(names) > 1:
            for i, name in enumerate(names):
                pts = [(x, r["rewards"][name]) for x, r in zip(xs, records) if _num(r["rewards"].get(name, {}).get(
                    "mean"))]
                monitor = all(p[1].get("weight") == 0 for p in pts)
                add_line(fig, [p[0] for p in pts], [_round(p[1]["mean"]) for p in pts],
                         f"{name} (monitor-only)" if monitor else name, PALETTE[i % len(PALETTE)], options,
                         dash="dash" if monitor else "dot")
        starred = [i for i, r in enumerate(records) if best is not None and r["policy_version"] == best]
        for i in starred:
            fig["data"].append({"type": "scatter", "mode": "markers", "x": [xs[i]], "y": [scores[i]],
                                "name": f"best: v{best}", "marker": {"symbol": "star", "size": 14, "color": "#d62728"}})
    none = (spec or {}).get("eval_source", "none") == "none"
    return finish(fig, options, "no held-out set in this run" if none else "waiting for the first evaluated version")


def _extreme(table, key: str, pick) -> float:
    sketch = table.sketch(key)
    values = [b.lo_y for b in sketch.buckets] + [b.hi_y for b in sketch.buckets] if sketch else [0.0]
    return pick(values)


def cap_line(fig: dict, value, name: str, color: str, yaxis: str = "y") -> None:
    """A dashed horizontal line at a configured limit (a queue size, an in-flight cap, max staleness)."""
    if not isinstance(value, (int, float)) or not fig["data"]:
        return
    ref = "y" if yaxis == "y" else "y2"
    axis = fig["layout"].get("yaxis" if ref == "y" else "yaxis2", {})
    if "range" in axis:         # a one-value chart's range (`flat_axis_range`) holds its cap too
        low, high = axis["range"]
        axis["range"] = [min(low, value), max(high, value)]
    fig["layout"].setdefault("shapes", []).append({
        "type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": ref, "y0": value, "y1": value,
        "line": {"color": color, "dash": "dash", "width": 1}})
    fig["layout"].setdefault("annotations", []).append({
        "text": f"{name} {value:g}", "xref": "paper", "x": 1, "xanchor": "right", "yref": ref, "y": value,
        "yanchor": "bottom", "showarrow": False, "font": {"size": 10, "color": color}})


def staleness_figure(table, options: ChartOptions, spec: dict | None = None) -> dict:
    """Off-policy health: staleness against max_staleness, and the stale samples TRL dropped."""
    # TRL's dropped_stale_total is counted per logging step, not summed over the run.
    fig = lines_figure(table, {"staleness_mean": "mean", "staleness_max": "max"}, "Staleness", "policy versions",
                       options, right={"dropped_stale_total": "stale samples dropped (per step)"},
                       right_title="samples")
    cap_line(fig, (spec or {}).get("max_staleness") if (spec or {}).get("mode") == "distributed" else None,
             "max staleness", "#ff7f0e")
    return fig


def ratio_figure(table, options: ChartOptions) -> dict:
    fig = lines_figure(table, {"ratio": "ratio"}, "Importance ratio (should stay ~1)", "trainer / vLLM", options)
    if not fig["data"]:
        fig["layout"]["annotations"][0]["text"] = ("No ratio logged: async (distributed) runs log it; colocated runs "
                                                   "sample on-policy.")
        return fig
    fig["layout"]["shapes"] = [{"type": "rect", "xref": "paper", "x0": 0, "x1": 1, "yref": "y",
                                "y0": 1 - RATIO_BAND, "y1": 1 + RATIO_BAND, "fillcolor": "green", "opacity": 0.08,
                                "line": {"width": 0}}]
    # An axis scaled to the healthy range: a drift of 0.5 % must be visible, not flattened by autoscale.
    ys = [y for trace in fig["data"] for y in trace["y"]]
    fig["layout"]["yaxis"]["range"] = [min(min(ys), 1 - 3 * RATIO_BAND), max(max(ys), 1 + 3 * RATIO_BAND)]
    return fig


def kl_figure(table, options: ChartOptions) -> dict:
    kl = table.sketch("kl")
    positive = kl is not None and min(b.lo_y for b in kl.buckets) > 0
    return lines_figure(table, {"kl": "KL"}, "KL and entropy", "KL (nats)", options,
                        right={"entropy": "entropy"}, right_title="entropy (nats)", log_y=positive)


def length_figure(table, options: ChartOptions) -> dict:
    return lines_figure(table, {"completion_length": "mean completion length"}, "Completion length", "tokens",
                        options)


def throughput_figure(table, options: ChartOptions) -> dict:
    return lines_figure(table, {"tokens_per_s": "tokens/s", "gen_tokens_per_s": "generated",
                                "train_tokens_per_s": "trained"}, "Throughput", "tokens / s", options)


def timing_figure(table, options: ChartOptions) -> dict:
    """Trainer vs generation balance: where each step's time goes, and the model FLOPs utilisation."""
    return lines_figure(table, {"step_time": "step", "fwd_bwd_s": "forward + backward", "generation_s": "generation",
                                "rollout_wait_s": "waiting for rollouts"}, "Trainer vs generation (time per step)",
                        "seconds", options, right={"perf/mfu_wall_clock": "MFU (wall clock)"}, right_title="MFU")


def queue_figure(table, options: ChartOptions, spec: dict | None = None) -> dict:
    """Queue and in-flight: the rollout queue against its size, requests in flight against their cap, and the time
    rollouts spend blocked (a full queue pushes back; scoring blocks)."""
    spec = spec or {}
    fig = lines_figure(table, {"sample/rollout_queue_size": "rollout queue", "rollout/inflight": "in flight"},
                       "Queue and in-flight", "samples / requests", options,
                       right={"rollout/backpressure_s": "backpressure", "rollout/score_block_s": "score blocked"},
                       right_title="seconds")
    if not fig["data"]:
        fig["layout"]["annotations"][0]["text"] = ("Async (distributed) runs log their rollout queue; colocated runs "
                                                   "have none.")
        return fig
    if "sample/rollout_queue_size" in table.columns:
        cap_line(fig, spec.get("queue_maxsize"), "queue size", "#1f77b4")
    if "rollout/inflight" in table.columns:
        cap_line(fig, spec.get("max_inflight_tasks"), "in-flight cap", "#ff7f0e")
    return fig


def sync_figure(table, options: ChartOptions, spec: dict | None = None, loads=(),
                first_step: dict[int, int] | None = None) -> dict:
    """Weight sync: seconds per sync beside the step time, its recent share of wall time in the title, and how long
    each replica took to load each version (the proxy's `loads`: part of a sync, the slowest replica holds it up)."""
    fig = figure("Weight sync", "seconds", options)
    for key, name in (("weight_sync_s", "weight sync"), ("step_time", "step")):
        add_line(fig, *points(table, key, options), name, METRIC_COLORS.get(key), options)
    add_replica_loads(fig, loads, first_step or {}, options)
    finish(fig, options)
    every = max(int((spec or {}).get("adapter_every") or 1), 1)
    if "weight_sync_s" not in table.columns:
        if fig["data"] and not loads:
            fig["layout"]["title"]["text"] = "Weight sync (none logged: colocated runs share the weights in memory)"
        return fig
    rows = table.rows(last=20)
    syncs = [r["weight_sync_s"] for r in rows if _num(r.get("weight_sync_s"))]
    steps = [r["step_time"] for r in rows if _num(r.get("step_time"))]
    if syncs and steps and sum(steps) > 0:
        share = (sum(syncs) / len(syncs)) / (every * sum(steps) / len(steps))
        fig["layout"]["title"]["text"] = f"Weight sync ({share:.0%} of wall time lately, every {every} step(s))"
    return fig


def replica_load_points(loads, first_step: dict[int, int], options: ChartOptions) -> dict[int, tuple[list, list]]:
    """Replica index -> (x, seconds) of each adapter load it answered 200 to: on the step axis at the first step
    trained with that version (a version no step has used yet is not placed), else at the load's time."""
    out: dict[int, tuple[list, list]] = {}
    for load in loads:
        version = adapter_version(load.get("version"))
        if options.x == "step":
            x = first_step.get(version) if version is not None else None
        else:
            x = options.at(load["time"]) if _num(load.get("time")) else None
        if x is None:
            continue
        for replica in load.get("replicas", []):
            if replica.get("status") == 200 and _num(replica.get("seconds")) and isinstance(replica.get("index"), int):
                xs, ys = out.setdefault(replica["index"], ([], []))
                xs.append(x)
                ys.append(_round(replica["seconds"]))
    return out


def add_replica_loads(fig: dict, loads, first_step: dict[int, int], options: ChartOptions) -> None:
    for index, (xs, ys) in sorted(replica_load_points(loads, first_step, options).items()):
        order = sorted(range(len(xs)), key=xs.__getitem__)
        xs, ys = downsample([xs[i] for i in order], [ys[i] for i in order])
        role = f"vllm-{index}"
        add_line(fig, xs, ys, f"load on {role}", ROLE_COLORS.get(role, PALETTE[index % len(PALETTE)]), options,
                 dash="dot")


def optimisation_figure(table, options: ChartOptions) -> dict:
    return lines_figure(table, {"loss": "loss"}, "Loss and gradient", "loss", options,
                        right={"grad_norm": "grad norm"}, right_title="grad norm")


def learning_rate_figure(table, options: ChartOptions) -> dict:
    return lines_figure(table, {"learning_rate": "learning rate"}, "Learning rate", "learning rate", options)


def _usage_points(sketch, options: ChartOptions, scale: float = 1.0) -> tuple[list, list]:
    xs, ys = sketch.points()
    return [options.at(x) for x in xs], [_round(y * scale) for y in ys]


def _time_axis(options: ChartOptions) -> ChartOptions:
    """Resource samples have no step: against the step their charts use wall time from the same start."""
    return ChartOptions("time", options.smoothing, options.t0) if options.x == "step" else options


def utilisation_figure(usages: dict, options: ChartOptions) -> dict:
    """GPU utilisation per device where a job has GPUs, else CPU %, per job; one colour per job."""
    options = _time_axis(options)
    fig = figure("Utilisation", "%", options)
    for i, (role, usage) in enumerate(usages.items()):
        color = ROLE_COLORS.get(role, PALETTE[i % len(PALETTE)])
        gpus = usage.gpus()
        for g, gpu in enumerate(gpus):
            add_line(fig, *_usage_points(usage.sketch(f"{gpu} util"), options), f"{role} {gpu}", color, options,
                     dash=GPU_DASHES[g % len(GPU_DASHES)])
        if not gpus and usage.sketch("cpu_percent"):
            add_line(fig, *_usage_points(usage.sketch("cpu_percent"), options), f"{role} CPU", color, options)
    return finish(fig, options, "waiting for the first resource samples")


def memory_figure(usages: dict, options: ChartOptions) -> dict:
    options = _time_axis(options)
    fig = figure("Memory", "GiB", options)
    for i, (role, usage) in enumerate(usages.items()):
        color = ROLE_COLORS.get(role, PALETTE[i % len(PALETTE)])
        for g, gpu in enumerate(usage.gpus()):
            add_line(fig, *_usage_points(usage.sketch(f"{gpu} memory_gib"), options), f"{role} {gpu}", color,
                     options, dash=GPU_DASHES[g % len(GPU_DASHES)])
        if usage.sketch("ram_gib"):
            add_line(fig, *_usage_points(usage.sketch("ram_gib"), options), f"{role} RAM", color, options,
                     dash="dot" if usage.gpus() else "solid")
    return finish(fig, options, "waiting for the first resource samples")


def plot_json(fig: dict) -> str:
    """The figure as the JSON string Gradio's Plot sends (serialised once, shared by every session)."""
    return json.dumps(fig, separators=(",", ":"))
