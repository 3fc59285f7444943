"""The resource charts of the dashboard: GPU utilisation (or CPU %) and memory per job, from the jobs' resource
samples, against wall time (samples have no step)."""


from panel.chart_parts import GPU_DASHES, PALETTE, ROLE_COLORS, ChartOptions, add_line, figure, finish, rounded


def _usage_points(sketch, options: ChartOptions, scale: float = 1.0) -> tuple[list, list]:
    xs, ys = sketch.points()
    return [options.at(x) for x in xs], [rounded(y * scale) for y in ys]


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
