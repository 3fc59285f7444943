"""The open run, below the runs list: its status and cost, the charts, the adapters, samples and replicas, the
final adapter with the push to the Hub, the config and the logs.

What a session is sent is `live.run_update` (only what changed); `present` turns its values into Gradio's. The
handlers are plain functions (see `panel.page`)."""

import gradio as gr
from gradio.components.plot import PlotData

from backend.outcome.best_version import ChoiceError, default_choice, version_choices
from backend.outcome.publish import PublishError
from backend.outcome.try_it import BASE
from backend.plan.jobspec import TERMINAL_STAGES
from backend.runs import resume
from backend.runtime.redact import redact_tokens
from backend.view.compare import X_AXES
from panel import adapters_table, dashboard, live, notes_view, publish_view, run_header, samples_table, tick, try_view
from panel.markdown import masked, plain
from panel.task_form import format_weights

PLOT_IDS = {name: elem_id for name, (elem_id, _) in dashboard.CHARTS.items()}
BOTTLENECK_ID = "bottleneck-plot"       # the bottleneck's chart, third among the key charts where there is one
CHART_IDS = [*PLOT_IDS.values(), BOTTLENECK_ID]     # every chart of the run, on the x axis they share
SCROLL_LOG_TO_END = ("() => { const t = document.querySelector('#log-box textarea'); "
                     "if (t) t.scrollTop = t.scrollHeight; }")
# One click downloads the full log: the file the click wrote is fetched through its link at once.
def click_download(elem_id: str) -> str:
    """JS that clicks the download link of the file component `#elem_id` once the click's answer has put it there."""
    return ("() => { let tries = 0; const go = () => { "
            f"const a = document.querySelector('#{elem_id} a[download], #{elem_id} a[href]'); "
            "if (a) { a.click(); } else if (tries++ < 50) { setTimeout(go, 100); } }; go(); }")


DOWNLOAD_LOG = click_download("log-file")
DOWNLOAD_METRICS = click_download("metrics-file")
DOWNLOAD_HELD_OUT = click_download("heldout-file")
ADAPTER_HEADERS = adapters_table.ADAPTER_HEADERS
SAMPLE_HEADERS = samples_table.SAMPLE_HEADERS
REPLICA_HEADERS = ["replica", "health", "in flight", "served", "errors", "adapters", "serving proof (canary)",
                   "generated tok/s", "API CPU (cores)", "history (run)", "url"]
# What a draw reads (the picked run and how to show it) and updates (`live.run_update`'s names, and its state).
VIEW_INPUTS = ["run_pick", "roles", "log_query", "x_axis", "smoothing", "sample_steps", "sample_prompt"]
DRAWN = [*PLOT_IDS, "bottleneck", "status", "adapters", "replicas", live.LOG_KEY, "cost", "change", "samples",
         "sample_steps", "sample_prompt", "version_pick", "version_msg", "try_picks", "config", "final", "roles",
         "drawn"]
# A run's actions, shown as fit it (`run_actions`).
ACTIONS = ["cancel", "cancel_sweep", "open_sweep", "resume", "resume_confirm"]
ALL_OF_THE_STEP = ("all prompts of the step", "")     # the follow picker's "follow nothing"
# A run's sections, one click away: (the element a link scrolls to, its name).
SECTION_LINKS = (("key-charts", "Key charts"), ("chart-options", "All charts"), ("adapters-table", "Adapters"),
                 ("notes-section", "Notes"), ("samples-section", "Samples"), ("replicas-table", "Servers"),
                 ("config-section", "Config"), ("log-box", "Log"))
JUMP_BAR = "<nav class='jump-bar'>Jump to: " + " · ".join(
    f"<a href='#{target}'>{name}</a>" for target, name in SECTION_LINKS) + "</nav>"


def build(page, panel) -> None:
    """The open run's components (the rest of the Runs tab), added to `page`."""
    with gr.Row(equal_height=False):
        with gr.Column(scale=5):
            status = gr.Markdown(elem_id="run-status")
            cost = gr.Markdown(elem_id="run-cost")
        with gr.Column(scale=1, min_width=200):
            change = gr.Button("New run with this change", visible=False, elem_id="new-run-change",
                               variant="primary", size="sm")
            clone = gr.Button("New run from this", elem_id="new-run-from", size="sm")
            metrics_btn = gr.Button("Download metrics (.csv)", elem_id="metrics-btn", size="sm")
            metrics_file = gr.File(label="Metrics", elem_id="metrics-file", interactive=False, visible=False)
    # Outside the header's column, so that it stays at the top of the window down the whole run (`ui.CSS`: sticky).
    gr.HTML(JUMP_BAR, elem_id="jump-bar", padding=False)
    plots = {}
    names = list(PLOT_IDS)
    with gr.Row(elem_id="key-charts"):      # the run's key charts first, on the first screen
        for name in names[:2]:
            plots[name] = gr.Plot(elem_id=PLOT_IDS[name], show_label=False)
        plots["bottleneck"] = gr.Plot(elem_id=BOTTLENECK_ID, show_label=False, visible=False)
    with gr.Row(elem_id="chart-options"):
        x_axis = gr.Radio(list(X_AXES), value="step", label="Charts' x axis", elem_id="x-axis", scale=1)
        smoothing = gr.Slider(0, 0.99, value=0, step=0.01, label="Smoothing (exponential moving average)",
                              elem_id="smoothing", scale=2)
    rest = names[2:]
    for pair in (rest[i:i + 2] for i in range(0, len(rest), 2)):
        with gr.Row():
            for name in pair:
                plots[name] = gr.Plot(elem_id=PLOT_IDS[name], show_label=False)
    adapters = gr.Dataframe(headers=ADAPTER_HEADERS, interactive=False, label="Adapter versions in the bucket",
                            elem_id="adapters-table")
    heldout_btn = gr.Button("Download held-out scores (.csv)", elem_id="heldout-btn", size="sm")
    heldout_file = gr.File(label="Held-out scores", elem_id="heldout-file", interactive=False, visible=False)
    with gr.Row():
        best_by = gr.Textbox(label="Best version by", elem_id="best-by", scale=3,
                             info="a held-out reward (trained or monitor-only) or a weighting, e.g. right_answer or "
                                  "right_answer=1, varied=0.5; empty: the trained rewards' weighted score. Ranked "
                                  "again from the evaluations, best/ republished, the change recorded")
        best_by_btn = gr.Button("Choose the best by this", elem_id="best-by-btn", scale=1)
    best_by_msg = gr.Markdown(elem_id="best-by-msg")
    with gr.Row():
        # Custom values reach the backend, which refuses a version the run never published (a tick may also send
        # new choices just after a pick).
        version_pick = gr.Dropdown([], label="Adapter version (download, push)", elem_id="version-pick", scale=3,
                                   info="the best by held-out score where the run was evaluated, else final/",
                                   allow_custom_value=True)
        version_file = gr.DownloadButton("Download this version (.zip)", interactive=False, elem_id="version-btn",
                                         scale=1)
    version_msg = gr.Markdown(elem_id="version-msg")
    notes_view.build(page, panel)
    try_view.build(page, panel)
    with gr.Accordion("What the policy writes (samples)", open=True, elem_id="samples-section"):
        with gr.Row():
            sample_steps = gr.Dropdown(["latest"], value="latest", label="Step", elem_id="sample-step",
                                       allow_custom_value=True)
            sample_prompt = gr.Dropdown([ALL_OF_THE_STEP], value="", elem_id="sample-prompt",
                                        label="Follow one prompt across steps and versions", allow_custom_value=True)
        samples = gr.Dataframe(headers=SAMPLE_HEADERS, interactive=False, wrap=True, elem_id="samples-table")
    replicas = gr.Dataframe(headers=REPLICA_HEADERS, interactive=False, elem_id="replicas-table",
                            label="vLLM servers (distributed runs: vllm-<job>/<server> where a job runs several)")
    final = gr.DownloadButton("Download final adapter (.zip)", interactive=False, elem_id="final-btn")
    with gr.Accordion("Config (spec.json: everything this run was launched with)", open=False,
                      elem_id="config-section"):
        config = gr.JSON(elem_id="config-json")
    push = publish_view.build(panel)
    with gr.Row():
        roles = gr.Dropdown(["trainer"], value="trainer", label="Job", elem_id="log-role", scale=1)
        log_query = gr.Textbox(label="Search the log", elem_id="log-query", scale=3)
        log_btn = gr.Button("Download full log", elem_id="log-btn", scale=1)
    log_file = gr.File(label="Full log", elem_id="log-file", interactive=False, visible=False)
    log = gr.Textbox(label="Log (tail)", lines=16, max_lines=16, autoscroll=True, elem_id="log-box")
    drawn = gr.State(None)      # what this browser session last drew (panel.live keeps it)
    page.add(**plots, status=status, cost=cost, change=change, clone=clone, metrics_btn=metrics_btn,
             metrics_file=metrics_file, x_axis=x_axis, smoothing=smoothing,
             adapters=adapters, heldout_btn=heldout_btn, heldout_file=heldout_file,
             best_by=best_by, best_by_btn=best_by_btn, best_by_msg=best_by_msg,
             version_pick=version_pick, version_file=version_file, version_msg=version_msg,
             sample_steps=sample_steps, sample_prompt=sample_prompt, samples=samples, replicas=replicas, final=final,
             config=config, push=push, roles=roles, log_query=log_query, log_btn=log_btn, log_file=log_file,
             **{live.LOG_KEY: log}, drawn=drawn)


def wire(page) -> None:
    """The open run's events (picking a run is the runs list's: `runs_view`)."""
    page.on([page["x_axis"].change, page["smoothing"].release, page["sample_steps"].change], on_options,
            [*VIEW_INPUTS, "drawn", "version_pick"], [*DRAWN, *ACTIONS], show_progress="hidden")
    page.on(page["sample_steps"].focus, on_steps, ["run_pick"], ["sample_steps"], show_progress="hidden")
    page.on(page["version_pick"].focus, on_versions, ["run_pick"], ["version_pick"], show_progress="hidden")
    page.on(page["push.button"].click, on_push, ["run_pick", "push.repo", "push.private", "version_pick"],
            ["push.message"])
    page.on(page["version_pick"].change, on_version, ["run_pick", "version_pick"], ["version_file", "version_msg"])
    page.on([page["best_by_btn"].click, page["best_by"].submit], on_best_by, ["run_pick", "best_by"],
            ["best_by_msg", "status", "adapters", "version_pick"])
    page.on(page["sample_prompt"].change, on_options, [*VIEW_INPUTS, "drawn", "version_pick"], [*DRAWN, *ACTIONS],
            show_progress="hidden")
    try_view.wire(page)
    notes_view.wire(page)
    page.on(page["log_query"].change, on_log_filter, ["run_pick", "roles", "log_query"], [live.LOG_KEY])
    page.on(page["roles"].change, on_log_filter, ["run_pick", "roles", "log_query"], [live.LOG_KEY])
    page.on(page["log_btn"].click, on_full_log, ["run_pick", "roles"], ["log_file"]).then(
        None, None, None, js=DOWNLOAD_LOG)
    page.on(page["metrics_btn"].click, on_metrics, ["run_pick"], ["metrics_file"]).then(
        None, None, None, js=DOWNLOAD_METRICS)
    page.on(page["heldout_btn"].click, on_heldout, ["run_pick"], ["heldout_file"]).then(
        None, None, None, js=DOWNLOAD_HELD_OUT)
    # A tail is read from the bottom; the textbox's own autoscroll does not fire on timer updates here.
    page[live.LOG_KEY].change(None, None, None, js=SCROLL_LOG_TO_END)


def present(values: dict, role: str) -> dict:
    """`live.run_update`'s values as Gradio's, by component name."""
    out = {}
    for name, value in values.items():
        if name in PLOT_IDS:
            value = PlotData(type="plotly", plot=value)
        elif name == "bottleneck":
            value = gr.update(visible=False) if value is None else gr.update(
                value=PlotData(type="plotly", plot=value), visible=True)
        elif name == "change":
            value = gr.update(visible=bool(value))
        elif name == "sample_steps":
            value = gr.update(choices=["latest", *value])
        elif name == "sample_prompt":
            value = gr.update(choices=[ALL_OF_THE_STEP, *value])
        elif name == "version_pick":
            value = gr.update(choices=value["choices"], value=value["value"])
        elif name == "try_picks":
            value = gr.update(choices=value)
        elif name == "final":
            value = gr.update(value=value, interactive=value is not None)
        elif name == "roles":
            value = gr.update(choices=value, value=role if role in value else "trainer")
        out[name] = value
    return out


def draw(panel, visitor, run_id, role, query, x, smooth, pick, follow, session, shown=None) -> dict:
    """The dashboard components this session has not drawn yet (only what changed). What it has drawn is kept in
    `session`, its state, updated in place (Gradio rebuilds a state's config each time one is sent, so a tick
    sends none); a session without one yet is sent a new one. `shown`: the version its picker shows."""
    fresh = not isinstance(session, dict)
    session = {} if fresh else session
    update = live.run_update(panel, run_id, session, visitor, role, query, x=x, smoothing=smooth, pick=pick,
                             follow=follow, shown=shown)
    return {**present(update.values, role), **run_actions(panel.view(run_id, visitor), session),
            **({"drawn": session} if fresh else {})}


def on_select(panel, visitor, run_id, role, query, x, smooth, pick, follow) -> dict:
    untick = {"resume_confirm": False, "resume_reviewed": None}
    if not run_id:
        return {**untick, "drawn": None, "cost": ""}
    try:
        state: dict = {}
        update = live.run_update(panel, run_id, state, visitor, role, query, x=x, smoothing=smooth)
        steps = update.values.get("sample_steps", [])
        view = panel.view(run_id, visitor)
        default = default_choice(view)
        actions = run_actions(view, state)
        # A live run opened (one just launched here among them) ticks at once at TICK_S (panel/tick.py).
        return {**untick, **present(update.values, role), "drawn": state, **actions,
                **(tick.wake() if state["actions"][0] else {}),
                "runs_list": gr.Accordion(open=False),
                "sample_steps": gr.update(choices=["latest", *steps], value="latest"),
                "sample_prompt": gr.update(choices=[ALL_OF_THE_STEP, *update.values.get("sample_prompt", [])],
                                           value=""),
                "version_pick": gr.update(choices=update.values.get("version_pick", {}).get("choices", []),
                                          value=default),
                "try_picks": gr.update(choices=update.values.get("try_picks", []),
                                       value=[BASE, default] if default else [BASE]),
                "push.repo": publish_view.suggested_repo_id(panel, run_id, visitor),
                "best_by": format_weights(view.best_by), "best_by_msg": ""}
    except KeyError as exc:
        return {**untick, "status": exc.args[0], "drawn": None, "cost": ""}


def run_actions(view, drawn: dict | None = None) -> dict:
    """The run's actions that fit its state: Cancel on a live run; Cancel sweep and Open sweep view on a sweep's
    member (its neighbours may be live while it is not); Resume (and its review tick) on one that stopped before it
    finished. With `drawn`, the session's state: only when they changed since it last drew them (a run that ends,
    or is resumed, while it is open)."""
    live = view.stage not in TERMINAL_STAGES
    stopped = not live and not resume.finished(view)
    member = bool((view.spec or {}).get("sweep_id"))
    if drawn is not None:
        if drawn.get("actions") == (live, stopped, member):
            return {}
        drawn["actions"] = (live, stopped, member)
    return {"cancel": gr.update(visible=live), "cancel_sweep": gr.update(visible=member),
            "open_sweep": gr.update(visible=member),
            "resume": gr.update(visible=stopped), "resume_confirm": gr.update(value=False, visible=stopped)}


def on_steps(panel, visitor, run_id) -> dict:
    """The step picker's choices, sent when it is opened (a tick does not: `live.ON_REQUEST`)."""
    view = _view_or_none(panel, visitor, run_id)
    steps = samples_table.sample_steps(view)[:samples_table.SAMPLE_STEPS] if view else []
    return {"sample_steps": gr.update(choices=["latest", *steps])}


def on_versions(panel, visitor, run_id) -> dict:
    """The version picker's choices, sent when it is opened (a tick does not: `live.ON_REQUEST`)."""
    view = _view_or_none(panel, visitor, run_id)
    return {"version_pick": gr.update(choices=version_choices(view) if view else [])}


def _view_or_none(panel, visitor, run_id):
    try:
        return panel.view(run_id, visitor) if run_id else None
    except KeyError:
        return None


def on_options(panel, visitor, run_id, role, query, x, smooth, pick, follow, session, shown=None) -> dict:
    if not run_id:
        return {"drawn": gr.skip()}     # Gradio wants at least one output named
    try:
        return {"drawn": gr.skip(),
                **draw(panel, visitor, run_id, role, query, x, smooth, pick, follow, session, shown)}
    except KeyError:
        return {"drawn": gr.skip()}     # Gradio wants at least one output named


def on_version(panel, visitor, run_id, choice) -> dict:
    """The picked version's zip on the download button, and which version it is and why."""
    if not run_id or not choice:
        return {"version_file": gr.update(value=None, interactive=False), "version_msg": ""}
    try:
        path, chosen = panel.adapter_version_zip(run_id, choice, visitor)
    except (KeyError, ChoiceError, PublishError) as exc:
        why = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        return {"version_file": gr.update(value=None, interactive=False),
                "version_msg": f"**No download.** {masked(why)}"}
    return {"version_file": gr.update(value=path, interactive=True),
            "version_msg": f"{redact_tokens(chosen.why)} From {plain(panel.run_named(run_id, visitor))}."}


def on_best_by(panel, visitor, run_id, text) -> dict:
    """Change which held-out score decides the run's best version; the header, the table and the picker follow."""
    if not run_id:
        return {"best_by_msg": "Pick a run first."}
    try:
        message = panel.set_best_by(run_id, text or "", visitor)
        view = panel.view(run_id, visitor)
    except KeyError as exc:
        return {"best_by_msg": f"**Not changed.** {redact_tokens(str(exc.args[0] if exc.args else exc))}"}
    except (ValueError, ChoiceError) as exc:
        return {"best_by_msg": f"**Not changed.** {redact_tokens(str(exc))}"}
    return {"best_by_msg": message,
            "status": run_header.titled(run_header.status_markdown(view), panel.run_title(run_id, visitor, view)),
            "adapters": adapters_table.adapter_table(view),
            "version_pick": gr.update(choices=version_choices(view), value=default_choice(view))}


def on_push(panel, visitor, run_id, repo_id, private, version) -> dict:
    return {"push.message": publish_view.push(panel, run_id, repo_id, private, visitor, version or None)}


def on_log_filter(panel, visitor, run_id, role, query) -> dict:
    try:
        view = panel.view(run_id, visitor) if run_id else None
    except KeyError:
        view = None
    return {live.LOG_KEY: dashboard.log_text(view, role, query) if view else ""}


def on_metrics(panel, visitor, run_id) -> dict:
    return _download(panel.metrics_csv, visitor, run_id, "metrics_file")


def on_heldout(panel, visitor, run_id) -> dict:
    return _download(panel.heldout_csv, visitor, run_id, "heldout_file")


def _download(build, visitor, run_id, output: str) -> dict:
    """The file `build(run_id, visitor)` writes, into the hidden file component `output` (the click's script then
    fetches it); nothing for a run this visitor does not reach."""
    try:
        path = build(run_id, visitor) if run_id else None
    except KeyError:
        path = None
    return {output: gr.update(value=path, visible=path is not None)}


def on_full_log(panel, visitor, run_id, role) -> dict:
    try:
        path = panel.full_log_file(run_id, role, visitor) if run_id else None
    except KeyError:
        path = None
    return {"log_file": gr.update(value=path, visible=path is not None)}
