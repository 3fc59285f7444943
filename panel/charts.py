"""Plotly figures from RunView data. Plain functions: unit-testable without a browser.

Long series are down-sampled to min/max per bin so a 100k-step run stays fast to draw.
"""

import math

import plotly.graph_objects as go

MAX_POINTS = 600
RATIO_DRIFT = 0.1   # |ratio - 1| beyond this means a policy was probably lost between trainer and vLLM


def downsample(xs: list, ys: list, max_points: int = MAX_POINTS) -> tuple[list, list]:
    """Keep the min and max of each bin, in order, so spikes survive down-sampling."""
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


def _figure(title: str, y_title: str, x_title: str = "step") -> go.Figure:
    fig = go.Figure()
    # The legend sits below the x-axis title, not on it.
    fig.update_layout(title=title, height=300, margin=dict(l=40, r=10, t=40, b=70), xaxis_title=x_title,
                      yaxis_title=y_title, legend=dict(orientation="h", y=-0.3, yanchor="top"),
                      template="plotly_white")
    return fig


def reward_figure(records: list[dict]) -> go.Figure:
    fig = _figure("Reward", "reward")
    xs, mean = series(records, "reward")
    std_by_step = dict(zip(*series(records, "reward_std")))
    if xs and std_by_step:
        upper = [m + std_by_step.get(x, 0.0) for x, m in zip(xs, mean)]
        lower = [m - std_by_step.get(x, 0.0) for x, m in zip(xs, mean)]
        fig.add_trace(go.Scatter(x=xs + xs[::-1], y=upper + lower[::-1], fill="toself", name="± std",
                                 line=dict(width=0), fillcolor="rgba(31,119,180,0.2)", hoverinfo="skip"))
    dx, dy = downsample(xs, mean)
    fig.add_trace(go.Scatter(x=dx, y=dy, mode="lines+markers", name="mean reward", line=dict(color="#1f77b4")))
    for key in sorted({k for r in records for k in r if k.startswith("rewards/")}):
        fx, fy = downsample(*series(records, key))
        fig.add_trace(go.Scatter(x=fx, y=fy, mode="lines", name=key.split("/", 1)[1], line=dict(dash="dot")))
    return fig


def lines_figure(records: list[dict], keys: dict[str, str], title: str, y_title: str) -> go.Figure:
    """One line per metric key that has data; `keys` maps metric key -> legend name."""
    fig = _figure(title, y_title)
    for key, name in keys.items():
        xs, ys = downsample(*series(records, key))
        if xs:
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=name))
    return fig


def staleness_figure(records: list[dict]) -> go.Figure:
    return lines_figure(records, {"staleness_mean": "mean", "staleness_max": "max",
                                  "dropped_stale_total": "dropped (total)"}, "Staleness (policy versions)", "versions")


def ratio_figure(records: list[dict]) -> go.Figure:
    fig = lines_figure(records, {"ratio": "ratio"}, "Importance ratio (should stay ~1)", "ratio")
    if not fig.data:
        _note(fig, "No ratio logged: async (distributed) runs log it; colocated runs sample on-policy.")
        return fig
    fig.add_hrect(y0=1 - RATIO_DRIFT, y1=1 + RATIO_DRIFT, fillcolor="green", opacity=0.08, line_width=0)
    return fig


def throughput_figure(records: list[dict]) -> go.Figure:
    """Completion length and weight-sync time on the left axis, tokens/s on the right: their scales differ
    by three orders of magnitude, so one axis would flatten the small ones to zero."""
    fig = _figure("Completions and throughput", "tokens · seconds")
    left = {"completion_length": "completion length (tokens)", "weight_sync_s": "weight sync (s)"}
    right = {"tokens_per_s": "tokens/s", "gen_tokens_per_s": "generated tok/s", "train_tokens_per_s": "trained tok/s"}
    for keys, axis in ((left, "y"), (right, "y2")):
        for key, name in keys.items():
            xs, ys = downsample(*series(records, key))
            if xs:
                fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=name, yaxis=axis,
                                         line=dict(dash="dot") if axis == "y2" else None))
    fig.update_layout(yaxis2=dict(title="tokens/s", overlaying="y", side="right", showgrid=False),
                      margin=dict(r=50))
    return fig


def _note(fig: go.Figure, text: str) -> None:
    """A line of text in an empty chart, so a blank plot is never a riddle."""
    fig.add_annotation(text=text, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5,
                       font=dict(color="#888"))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)


def ratio_warning(records: list[dict], window: int = 5) -> str | None:
    """A warning when the recent mean ratio drifts from 1 beyond RATIO_DRIFT, else None."""
    _, ys = series(records, "ratio")
    if not ys:
        return None
    recent = ys[-window:]
    mean = sum(recent) / len(recent)
    if abs(mean - 1) > RATIO_DRIFT:
        return (f"ratio {mean:.3f} has drifted from 1 (threshold ±{RATIO_DRIFT}): the trainer and vLLM disagree "
                "on the policy; an adapter version was probably lost or not loaded")
    return None


def utilisation_figure(resources: dict[str, list]) -> go.Figure:
    """GPU utilisation per device where there are GPUs, else CPU %, per job role; time in seconds."""
    fig = _figure("Utilisation", "%", x_title="seconds since start")
    t0 = min((s[0].time for s in resources.values() if s), default=0)
    for role, samples in resources.items():
        gpus = max((len(s.gpu_util) for s in samples), default=0)
        for g in range(gpus):
            pts = [(s.time - t0, s.gpu_util[g]) for s in samples if len(s.gpu_util) > g]
            xs, ys = downsample([p[0] for p in pts], [p[1] for p in pts])
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=f"{role} {samples[-1].gpu_name(g)} util"))
        if not gpus:
            pts = [(s.time - t0, s.cpu_percent) for s in samples if s.cpu_percent is not None]
            xs, ys = downsample([p[0] for p in pts], [p[1] for p in pts])
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=f"{role} CPU"))
    return fig


def memory_figure(resources: dict[str, list]) -> go.Figure:
    fig = _figure("Memory", "GiB", x_title="seconds since start")
    t0 = min((s[0].time for s in resources.values() if s), default=0)
    for role, samples in resources.items():
        gpus = max((len(s.gpu_mem_bytes) for s in samples), default=0)
        for g in range(gpus):
            pts = [(s.time - t0, s.gpu_mem_bytes[g] / 2**30) for s in samples if len(s.gpu_mem_bytes) > g]
            fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines",
                                     name=f"{role} {samples[-1].gpu_name(g)}"))
        pts = [(s.time - t0, s.ram_bytes / 2**30) for s in samples if s.ram_bytes is not None]
        if pts:
            xs, ys = downsample([p[0] for p in pts], [p[1] for p in pts])
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=f"{role} RAM"))
    return fig
