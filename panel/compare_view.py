"""The Compare tab: two or more runs (local or HF Jobs, any mode) overlaid on one set of charts, their held-out
outcome (each version's held-out score under the run's own best-by rule from the base model on, and each run's best
version), and the settings that differ between them. Figures are built from down-sampled series
(backend.view.compare), so long runs stay cheap."""

import gradio as gr
import pandas as pd
import plotly.graph_objects as go

from backend.runs.access import Visitor
from backend.view.axes import run_start
from backend.view.compare import (
    BEST_HEADERS,
    COMPARED,
    HELD_OUT_TITLE,
    X_AXES,
    best_point,
    best_row,
    config_diff,
    first_key,
    held_out_points,
    metric_points,
    on_axis,
)
from backend.view.run_history import HISTORY_WAIT_S
from panel import spend_view

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")
X_TITLES = {"step": "step", "wall time": "wall time (min)", "dollars": "dollars spent (USD)"}
HELD_OUT = "heldout"        # the held-out figure's name among the compared ones
NOT_LOGGED = {"ratio": "not logged: only async (distributed) runs log the importance ratio",
              HELD_OUT: "no held-out evaluation in these runs"}
PLOTS = (*COMPARED, HELD_OUT)


def compare(panel, run_ids: list[str], x: str,
            visitor: Visitor) -> tuple[dict[str, go.Figure], pd.DataFrame, str, pd.DataFrame]:
    """Overlaid figures (one per COMPARED metric, and the held-out score by version), the settings that differ (a
    column per run), a note, and each evaluated run's best version under its own rule."""
    notes, runs, names = [], [], {}
    for run_id in dict.fromkeys(run_ids or []):
        try:
            registry = panel.runs.find(run_id, visitor)
            view = registry.view(run_id)
        except KeyError:
            notes.append(f"no run {run_id} that you can see")
            continue
        view.refresh()
        names[run_id] = _shown_name(panel, run_id, visitor, view)
        if not view.wait_for_history(HISTORY_WAIT_S):
            notes.append(f"{run_id}'s earlier history is still being read: compare again shortly for all of it")
        runs.append((run_id, view, spend_view.cost_at(panel, registry, run_id) if x == "dollars" else None))
    if len(runs) < 2:
        notes.insert(0, "Pick two or more runs to compare.")
    figures, said = overlay(runs, x, label=lambda run_id, view: f"{names.get(run_id) or 'run'} · {run_id}")
    notes += said
    # A renamed run is named by its display name in the settings too (its launch name is only what it was called).
    diff = config_diff({run_id: {**view.spec, "name": names.get(run_id) or view.spec.get("name")}
                        for run_id, view, _ in runs}) if len(runs) >= 2 else []
    note = "; ".join(notes) if notes else f"{len(runs)} runs; {len(diff)} setting(s) differ."
    table = pd.DataFrame(diff, columns=["setting", *(run_id for run_id, _, _ in runs)] if len(runs) >= 2
                         else ["setting", "run 1", "run 2"])
    best = [row for run_id, view, _ in runs if (row := best_row(run_id, view)) is not None]
    return figures, table, note, pd.DataFrame(best, columns=BEST_HEADERS)


def _shown_name(panel, run_id: str, visitor: Visitor, view) -> str:
    """The run's name as the runs list and its header show it: its display name, else the one it was launched with."""
    try:
        return panel.run_title(run_id, visitor, view)
    except Exception:      # a bucket failing to give the notes: the launch name
        return str((view.spec or {}).get("name") or "")


def overlay(runs: list[tuple[str, object, object]], x: str, names: tuple[str, ...] = PLOTS,
            label=lambda run_id, view: f"{view.spec.get('name', 'run')} · {run_id}") -> tuple[dict, list[str]]:
    """The figures `names` (COMPARED metrics, HELD_OUT) with every run of `runs` ((run id, view, its dollars-at or
    None)) overlaid on the `x` axis, a colour per run; and notes on runs left off an axis. The Compare tab and the
    sweep view draw with it."""
    notes = []
    figures = {name: _figure(COMPARED[name][0] if name in COMPARED else HELD_OUT_TITLE, x) for name in names}
    for i, (run_id, view, dollars_at) in enumerate(runs):
        shown_as, start, color = label(run_id, view), run_start(view), COLORS[i % len(COLORS)]
        if x == "dollars" and dollars_at is None:
            notes.append(f"{run_id} is a local run: it costs nothing, so it is not on the dollars axis")
            continue
        for name in names:
            if name == HELD_OUT:
                _add_held_out(figures[name], view, x, start, dollars_at, shown_as, run_id, color)
                continue
            key = first_key(view, COMPARED[name][1])
            if key is None:
                continue
            xs, ys = metric_points(view, key, x)
            figures[name].add_trace(go.Scatter(x=on_axis(xs, x, start, dollars_at), y=ys, mode="lines",
                                               name=shown_as, legendgroup=run_id, line=dict(color=color)))
    for name, figure in figures.items():
        if not figure.data:
            _note(figure, NOT_LOGGED.get(name, "not logged by these runs") if runs else "pick runs to compare")
    return figures, notes


def _add_held_out(fig: go.Figure, view, x: str, start: float, dollars_at, label: str, run_id: str,
                  color: str) -> None:
    """The run's held-out score by version (v0 first) and a star on its best version, on the chosen x axis."""
    xs, ys = held_out_points(view, x)
    shown = on_axis(xs, x, start, dollars_at)
    if not xs or shown is None:
        return
    fig.add_trace(go.Scatter(x=shown, y=ys, mode="lines+markers", name=label, legendgroup=run_id,
                             line=dict(color=color)))
    best = best_point(view, x)
    if best is not None:
        fig.add_trace(go.Scatter(x=on_axis([best[0]], x, start, dollars_at), y=[best[1]], mode="markers+text",
                                 text=[f"v{best[2]}"], textposition="top center", name=f"best: v{best[2]}",
                                 legendgroup=run_id, showlegend=False,
                                 marker=dict(symbol="star", size=14, color=color)))


def _figure(title: str, x: str) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(title=title, height=300, margin=dict(l=40, r=10, t=40, b=70), xaxis_title=X_TITLES[x],
                      legend=dict(orientation="h", y=-0.3, yanchor="top"), template="plotly_white")
    return fig


def _note(fig: go.Figure, text: str) -> None:
    fig.add_annotation(text=text, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5, font=dict(color="#888"))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)


def build(panel, visitor_of) -> dict:
    """The Compare tab's components and its handler; `visitor_of` turns Gradio's OAuth values into a Visitor."""
    with gr.Tab("Compare", id="compare"):
        with gr.Row():
            # Custom values: a picked run that a later listing lacks must not make every compare fail.
            picks = gr.Dropdown([], multiselect=True, label="Runs to compare (two or more)", elem_id="compare-pick",
                                scale=4, allow_custom_value=True)
            x_axis = gr.Radio(list(X_AXES), value="step", label="x axis", elem_id="compare-x", scale=2)
            button = gr.Button("Compare", variant="primary", elem_id="compare-btn", scale=1)
        note = gr.Markdown(elem_id="compare-note")
        plots = {}
        names = list(PLOTS)
        for pair in (names[0:2], names[2:4], names[4:]):
            with gr.Row():
                for name in pair:
                    plots[name] = gr.Plot(elem_id=f"compare-{name.replace('_', '-')}")
        best = gr.Dataframe(headers=BEST_HEADERS, interactive=False, wrap=True, elem_id="compare-best",
                            label="Each run's best version (by its own best-by rule; it must beat the base model)")
        diff = gr.Dataframe(headers=["setting", "run 1", "run 2"], interactive=False, wrap=True,
                            label="Settings that differ", elem_id="compare-diff")

    def on_compare(run_ids, x, oauth_token: gr.OAuthToken | None, profile: gr.OAuthProfile | None):
        figures, table, message, bests = compare(panel, run_ids or [], x, visitor_of(oauth_token, profile))
        return [*(figures[n] for n in PLOTS), table, message, bests]

    outputs = [*(plots[n] for n in PLOTS), diff, note, best]
    button.click(on_compare, [picks, x_axis], outputs)
    x_axis.change(on_compare, [picks, x_axis], outputs)
    return {"picks": picks}
