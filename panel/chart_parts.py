"""What every dashboard chart is drawn with: the chart options (x axis, smoothing, the run's start), a metric's
points from its bounded series, an empty figure with titled axes, a (smoothed) line, the finishing touches (integer
steps, a note on an empty chart, a flat axis's range), limit lines, one colour per metric and per job, and the JSON
Gradio sends. Plain dicts, no plotly objects (their validation cost more than the data).
"""

import bisect
import json
import math
from dataclasses import dataclass

from backend.view.axes import wall_minutes

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
        return rounded(spent_at(self.dollars, t))


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
    pts = [(r[x_key], r[key]) for r in records if is_num(r.get(key)) and r.get(x_key) is not None]
    return [p[0] for p in pts], [float(p[1]) for p in pts]


def is_num(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def rounded(value: float) -> float:
    return float(f"{value:.5g}")


def points(table, key: str, options: ChartOptions, summary: str = "points") -> tuple[list, list]:
    """A metric's drawable points on the chosen x axis (steps, or minutes since the start); `summary` "means" gives
    each bucket's mean instead of its extremes."""
    sketch = table.sketch(key, "step" if options.x == "step" else "time")
    if sketch is None:
        return [], []
    xs, ys = getattr(sketch, summary)()
    xs = [int(x) for x in xs] if options.x == "step" else [options.at(x) for x in xs]
    return xs, [rounded(y) for y in ys]


def ema(ys: list[float], weight: float) -> list[float]:
    """TensorBoard's smoothing: an exponential moving average, debiased so the start is not pulled to 0."""
    out, last = [], 0.0
    for i, y in enumerate(ys, start=1):
        last = weight * last + (1 - weight) * y
        out.append(rounded(last / (1 - weight**i)))
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
    ys = [y for t in fig["data"] if t.get("yaxis", "y") == ref for y in t.get("y") or () if is_num(y)]
    ys += [s["y0"] for s in fig["layout"].get("shapes", ()) if s.get("yref") == ref and is_num(s.get("y0"))]
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


def plot_json(fig: dict) -> str:
    """The figure as the JSON string Gradio's Plot sends (serialised once, shared by every session)."""
    return json.dumps(fig, separators=(",", ":"))
