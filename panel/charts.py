"""The training charts of the dashboard from a run's bounded series: reward, held-out score by version, KL, staleness,
importance ratio, trainer vs generation, queue, weight sync, throughput, lengths, loss, learning rate. Plain functions
returning plotly's JSON as dicts, unit-testable without a browser; what they are drawn with is `chart_parts.py`, the
resource charts (GPU, CPU, memory per job) `resource_charts.py`.

Every trace is drawn from a `Sketch` (backend/storage/series.py): at most a few hundred points whatever the run's
length, extremes kept, the newest points as they are. Charts share one x axis choice (steps, or wall time in
minutes since the run started, resource charts included), one colour per metric and per job, an optional
exponential moving average with the raw series kept faint behind it (as TensorBoard and W&B draw it), units on
every axis, and a line saying why a chart is empty.
"""


from backend.runtime.best_rule import rule_score, rule_text
from backend.runtime.layout import adapter_version, reward_function_keys
from backend.view.diagnose import RATIO_BAND
from panel.chart_parts import (
    HELD_OUT_COLOR,
    METRIC_COLORS,
    PALETTE,
    ROLE_COLORS,
    ChartOptions,
    add_line,
    cap_line,
    downsample,
    figure,
    finish,
    is_num,
    lines_figure,
    points,
    rounded,
)


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
        scores = [rounded(rule_score(r, rule)) for r in records]
        name = "held-out score" + (f" ({rule_text(rule)})" if rule else "")
        line = {"type": "scatter", "mode": "lines+markers", "x": xs, "y": scores, "name": name,
                "line": {"color": HELD_OUT_COLOR, "width": 2}, "marker": {"size": 7},
                "text": [f"v{r['policy_version']}" for r in records],
                "hovertemplate": f"%{{text}}: %{{y}}<extra>{name}</extra>"}
        if not rule:
            line["error_y"] = {"type": "data", "array": [rounded(r.get("score_std") or 0.0) for r in records],
                               "visible": True, "thickness": 1}
        else:       # what the trainer maximised, named so, beside the score that decides
            add_line(fig, xs, [rounded(r["score"]) for r in records], "trained score", "#7f7f7f", options, dash="dash")
        fig["data"].append(line)
        names = list(dict.fromkeys(n for r in records for n in r.get("rewards", {})))
        if len(names) > 1:
            for i, name in enumerate(names):
                pts = [(x, r["rewards"][name]) for x, r in zip(xs, records) if is_num(r["rewards"].get(name, {}).get(
                    "mean"))]
                monitor = all(p[1].get("weight") == 0 for p in pts)
                add_line(fig, [p[0] for p in pts], [rounded(p[1]["mean"]) for p in pts],
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
    syncs = [r["weight_sync_s"] for r in rows if is_num(r.get("weight_sync_s"))]
    steps = [r["step_time"] for r in rows if is_num(r.get("step_time"))]
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
            x = options.at(load["time"]) if is_num(load.get("time")) else None
        if x is None:
            continue
        for replica in load.get("replicas", []):
            if (replica.get("status") == 200 and is_num(replica.get("seconds"))
                    and isinstance(replica.get("index"), int)):
                xs, ys = out.setdefault(replica["index"], ([], []))
                xs.append(x)
                ys.append(rounded(replica["seconds"]))
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
