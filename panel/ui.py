"""The Gradio Blocks: a launch form, a runs list, and a live dashboard. Declarative; logic is in actions.py.

Every handler learns who clicked from Gradio itself: `gr.OAuthToken` / `gr.OAuthProfile` parameters, which
Gradio fills only when it can match them positionally (never after `*args`), read through `visitor_of`.
"""

import dataclasses

import gradio as gr
from gradio.components.plot import PlotData

from backend import diagnose
from backend.access import Visitor
from backend.compare import X_AXES
from backend.executors import engine
from backend.spec import COLOCATED, DISTRIBUTED, GRPO, LORA, STORAGE, RunSpec, form_fields
from panel import compare_view, dashboard, live, publish_view, spend_view
from panel.actions import Panel
from panel.presets import PRESETS, TINY_DEMO, preset_note, preset_values
from panel.runs_list import RUN_FILTERS, RUNS_HEADERS
from panel.task_form import REQUIRED_CHOICE, TaskSection

TICK_S = 2.0
PLOT_IDS = {name: elem_id for name, (elem_id, _) in dashboard.CHARTS.items()}
SCROLL_LOG_TO_END = ("() => { const t = document.querySelector('#log-box textarea'); "
                     "if (t) t.scrollTop = t.scrollHeight; }")
# The picked run is in the page's address (?run=<id>): a reload or a shared link opens it again.
RUN_IN_URL = ("(id) => { const u = new URL(window.location.href); "
              "if (id) { u.searchParams.set('run', id); } else { u.searchParams.delete('run'); } "
              "window.history.replaceState(null, '', u); return []; }")
# One click downloads the full log: the file the click wrote is fetched through its link at once.
DOWNLOAD_LOG = ("() => { let tries = 0; const go = () => { "
                "const a = document.querySelector('#log-file a[download], #log-file a[href]'); "
                "if (a) { a.click(); } else if (tries++ < 50) { setTimeout(go, 100); } }; go(); }")
# A field the last preview or launch refused is marked until the next one (passed to launch(css=...)).
CSS = ".field-error { outline: 2px solid #dc2626; outline-offset: 2px; border-radius: 6px; }"
# Gradio's dropdown takes Enter in an emptied box as "pick the first option": a required choice that was cleared
# must stay empty and be refused by the form's checks, not silently become the first dataset or flavor.
KEEP_CLEARED_CHOICES = """() => { document.addEventListener('keydown', (e) => {
    const box = e.target;
    if (e.key === 'Enter' && box instanceof HTMLInputElement && box.closest('.required-choice')
        && box.value.trim() === '') { e.stopImmediatePropagation(); e.preventDefault(); box.blur(); }
}, true); }"""
SPEC_FIELDS = {f.name: f for f in dataclasses.fields(RunSpec)}
LOGIN_HINT = "Sign in with Hugging Face (button at the top) to launch and watch your runs."


def visitor_of(token: gr.OAuthToken | None, profile: gr.OAuthProfile | None = None) -> Visitor:
    """The one place a Gradio OAuth token and profile become the backend's Visitor."""
    if token is None:
        return Visitor()
    return Visitor(token=token.token, username=profile.username if profile else None,
                   expires_at=float(token.expires_at) if token.expires_at else None)


def _field(name: str, initial: dict, flavors: list | None = None):
    """The form's widget for RunSpec field `name`, labelled and explained by the field itself (`spec.setting`)."""
    spec_field = SPEC_FIELDS[name]
    meta, value = spec_field.metadata, initial[name]
    info = "; ".join(part for part in (meta.get("help"), limits_text(meta.get("limits"))) if part)
    common = dict(label=meta.get("label", name), info=info or None, elem_id=f"f-{name}")
    if meta.get("widget") == "flavor":
        return gr.Dropdown(_flavor_choices(flavors or []), value=value, allow_custom_value=True,
                           elem_classes=[REQUIRED_CHOICE], **common)
    if isinstance(value, list):
        return gr.CheckboxGroup(choices=list(meta["choices"]), value=value, **common)
    if meta.get("choices"):
        return gr.Dropdown(choices=list(meta["choices"]), value=value, **common)
    if spec_field.type in (bool, "bool"):
        return gr.Checkbox(value=value, **common)
    if spec_field.type in (int, "int"):
        return gr.Number(value=value, precision=0, **common)
    if spec_field.type in (float, "float"):
        return gr.Number(value=value, **common)
    return gr.Textbox(value=value, **common)


def limits_text(limits: tuple | None) -> str:
    """A whole number's valid range as the form shows it: '1 to 512', 'at least 2'. (Not Gradio's own minimum and
    maximum: those refuse a value with a toast before the form's check can name the field and open its section.)"""
    if not limits:
        return ""
    low, high = limits
    return f"{low:,} to {high:,}" if high is not None else f"at least {low:,}"


def _flavor_choices(flavors) -> list[tuple[str, str]]:
    return [(f"{f.name} · {f.pretty} · ${f.price_per_hour_usd:.2f}/h", f.name) for f in flavors]


ROW = 4     # fields a row of a form section


def _section(f: dict, sections: dict, title: str, initial: dict, flavors: list, **kw) -> None:
    """An accordion holding RunSpec's fields of section `title` (in their declaration order, ROW a row; a list of
    checkboxes on a row of its own); `sections[title]` keeps it with the names of its fields."""
    names = [spec_field.name for spec_field in form_fields(title)]
    with gr.Accordion(title, open=False, **kw) as accordion:
        row: list[str] = []
        for name in [*names, None]:
            wide = name is not None and isinstance(initial[name], list)
            if row and (name is None or wide or len(row) == ROW):
                with gr.Row():
                    for held in row:
                        f[held] = _field(held, initial, flavors)
                row = []
            if wide:
                f[name] = _field(name, initial, flavors)
            elif name is not None:
                row.append(name)
    sections[title] = (accordion, set(names))


def _form(panel: Panel, initial: dict, executors: list[str]) -> tuple[dict[str, gr.components.Component],
                                                                        TaskSection, dict]:
    f, sections = {}, {}
    flavors = panel.flavors()
    with gr.Row():
        f["name"] = _field("name", initial)
        f["mode"] = gr.Radio(["colocated", "distributed"], value=initial["mode"], label="Mode", elem_id="f-mode",
                             info="colocated: one job, vLLM inside the trainer · distributed: trainer + vLLM replicas")
        f["executor"] = gr.Radio(executors, value=initial["executor"], label="Run on", elem_id="f-executor",
                                 info="local processes on this machine, or Hugging Face Jobs"
                                 if any(engine(name).on_panel_machine for name in executors)
                                 else "Hugging Face Jobs, with your own account")
    f["model"] = _field("model", initial)
    task = TaskSection.build(initial)
    f.update(task.fields)
    for title in (LORA, GRPO):
        _section(f, sections, title, initial, flavors)
    _section(f, sections, COLOCATED, initial, flavors, visible=initial["mode"] == "colocated")
    _section(f, sections, DISTRIBUTED, initial, flavors, visible=initial["mode"] == "distributed")
    _section(f, sections, STORAGE, initial, flavors)
    return f, task, sections


def _presets_for(panel: Panel) -> tuple[list[str], str]:
    """The presets this deployment can run, and the one the form opens with (an HF Jobs one on a Space, or where
    local runs cannot run)."""
    offered = panel.offered_executors()
    names = [n for n, p in PRESETS.items() if p.get("executor") in offered]
    first = next((n for n in names if not engine(PRESETS[n]["executor"]).on_panel_machine), names[0])
    return names, (first if panel.settings.on_space or TINY_DEMO not in names else TINY_DEMO)


def build_ui(panel: Panel) -> gr.Blocks:
    preset_names, first_preset = _presets_for(panel)
    initial = preset_values(first_preset, bucket=panel.default_bucket(None, PRESETS[first_preset]["executor"]))
    executors = panel.offered_executors()
    # Gradio keeps a copy of every file it serves (downloads); delete_cache drops copies older than a day, hourly.
    with gr.Blocks(title="GRPO + LoRA control panel", delete_cache=(3600, 86400)) as demo:
        with gr.Row():
            gr.Markdown("# GRPO + LoRA control panel\nLaunch GRPO runs with LoRA, colocated or distributed, "
                        "locally or on Hugging Face Jobs, and watch them live.")
            if panel.settings.on_space:
                gr.LoginButton()
        with gr.Tabs() as tabs:
            with gr.Tab("Launch", id="launch"):
                preset = gr.Dropdown(preset_names, value=first_preset, label="Preset", elem_id="preset")
                preset_info = gr.Markdown(preset_note(first_preset), elem_id="preset-note")
                form, task, sections = _form(panel, initial, executors)
                panel.field_labels = {n: c.label for n, c in form.items() if getattr(c, "label", None)}
                with gr.Accordion("Alerts", open=False):
                    webhook = gr.Textbox("", label="Alert webhook URL (optional)", type="password", elem_id="f-webhook",
                                         info="Slack or Discord webhook: the run's alerts (ratio drift, stall, a "
                                              "replica not serving its adapter, ...) are posted there. Kept encrypted "
                                              "by this panel; never shown again or written to the bucket.")
                with gr.Row():
                    preview_btn = gr.Button("Preview jobs", elem_id="preview-btn")
                    confirm = gr.Checkbox(False, label="I reviewed the jobs and the estimated cost (HF Jobs)",
                                          elem_id="confirm")
                    launch_btn = gr.Button("Launch", variant="primary", elem_id="launch-btn")
                launch_msg = gr.Markdown(elem_id="launch-msg")
            with gr.Tab("Runs", id="runs"):
                runs_hint = gr.Markdown(elem_id="runs-hint")
                with gr.Row():
                    # A timer tick that listed the runs just before a launch may send choices without the new run
                    # after the launch selected it: a custom value keeps every later event from being refused.
                    run_pick = gr.Dropdown([], label="Run", elem_id="run-pick", scale=3, allow_custom_value=True)
                    cancel_btn = gr.Button("Cancel run", variant="stop", elem_id="cancel-btn", scale=1)
                    resume_confirm = gr.Checkbox(False, label="I reviewed the resume", elem_id="resume-confirm",
                                                 scale=1)
                    resume_btn = gr.Button("Resume run", elem_id="resume-btn", scale=1)
                with gr.Row():
                    runs_query = gr.Textbox(label="Filter by name or id", elem_id="runs-query", scale=3)
                    runs_status = gr.Radio(list(RUN_FILTERS), value="all", label="Status", elem_id="runs-status",
                                           scale=2)
                runs_table = gr.Dataframe(headers=RUNS_HEADERS, interactive=False, elem_id="runs-table",
                                          label="Runs (newest first; click a row to open it)")
                spend_view.build_orphans(panel, visitor_of)
                action_msg = gr.Markdown(elem_id="action-msg")
                status = gr.Markdown(elem_id="run-status")
                cost_md = gr.Markdown(elem_id="run-cost")
                with gr.Row():
                    change_btn = gr.Button("New run with this change", visible=False, elem_id="new-run-change",
                                           variant="primary")
                    clone_btn = gr.Button("New run from this", elem_id="new-run-from")
                with gr.Row():
                    x_axis = gr.Radio(list(X_AXES), value="step", label="Charts' x axis", elem_id="x-axis", scale=1)
                    smoothing = gr.Slider(0, 0.99, value=0, step=0.01, label="Smoothing (exponential moving average)",
                                          elem_id="smoothing", scale=2)
                plots = {}
                names = list(PLOT_IDS)
                for pair in (names[i:i + 2] for i in range(0, len(names), 2)):
                    with gr.Row():
                        for name in pair:
                            plots[name] = gr.Plot(elem_id=PLOT_IDS[name], show_label=False)
                adapters = gr.Dataframe(headers=["adapter", "step", "published", "size (MB)", "on replicas", "note"],
                                        interactive=False, label="Adapter versions in the bucket",
                                        elem_id="adapters-table")
                with gr.Accordion("What the policy writes (samples)", open=True, elem_id="samples-section"):
                    sample_step = gr.Dropdown(["latest"], value="latest", label="Step", elem_id="sample-step",
                                              allow_custom_value=True)
                    samples = gr.Dataframe(headers=dashboard.SAMPLE_HEADERS, interactive=False, wrap=True,
                                           elem_id="samples-table")
                replicas = gr.Dataframe(headers=["replica", "health", "in flight", "served", "errors", "adapters",
                                                 "serving proof (canary)", "url"],
                                        interactive=False, label="vLLM replicas (distributed runs)",
                                        elem_id="replicas-table")
                final_btn = gr.DownloadButton("Download final adapter (.zip)", interactive=False, elem_id="final-btn")
                with gr.Accordion("Config (spec.json: everything this run was launched with)", open=False):
                    config = gr.JSON(elem_id="config-json")
                push = publish_view.build(panel)
                with gr.Row():
                    log_role = gr.Dropdown(["trainer"], value="trainer", label="Job", elem_id="log-role", scale=1)
                    log_query = gr.Textbox(label="Search the log", elem_id="log-query", scale=3)
                    log_btn = gr.Button("Download full log", elem_id="log-btn", scale=1)
                log_file = gr.File(label="Full log", elem_id="log-file", interactive=False, visible=False)
                log_box = gr.Textbox(label="Log (tail)", lines=16, max_lines=16, autoscroll=True, elem_id="log-box")
            compare = compare_view.build(panel, visitor_of)
        timer = gr.Timer(TICK_S)
        drawn = gr.State(None)      # what this browser session last drew (panel.live keeps it)
        listed = gr.State(None)     # the runs table this browser session last received
        reviewed = gr.State(None)   # {"fingerprint", "run_id"} of the preview this session last saw
        marks = gr.State([])        # the form fields marked as refused by the last preview or launch
        resume_reviewed = gr.State(None)   # {"fingerprint", "run_id"} of the resume preview last shown

        names = list(form)
        inputs = [form[n] for n in names]
        task.wire(panel, names, inputs)
        dash = {**plots, "status": status, "adapters": adapters, "replicas": replicas, live.LOG_KEY: log_box}
        dash_outputs = [*dash.values(), cost_md, change_btn, samples, sample_step, config, final_btn, log_role, drawn]

        def values_of(data: dict) -> dict:
            return {name: data[form[name]] for name in names}

        def on_preset(choice, oauth_token: gr.OAuthToken | None, profile: gr.OAuthProfile | None):
            # A preset is a complete starting point: every field it does not name takes its default.
            executor = PRESETS[choice]["executor"]
            values = preset_values(choice, bucket=panel.default_bucket(visitor_of(oauth_token, profile), executor))
            return [*(values[n] for n in names), preset_note(choice)]

        def show_fields(bad: tuple[str, ...] | list[str], marked: list[str] | None) -> dict:
            """Open the sections holding `bad` fields and mark those fields; unmark the ones marked before."""
            out = {accordion: gr.Accordion(open=True) for accordion, held in sections.values() if held & set(bad)}
            for name in set(marked or []) - set(bad):
                out[form[name]] = gr.update(elem_classes=[])
            for name in bad:
                if name in form:
                    out[form[name]] = gr.update(elem_classes=["field-error"])
            return {**out, marks: [n for n in bad if n in form]}

        def on_mode(mode):
            """Only the sections that apply to the chosen mode are shown."""
            return {sections[COLOCATED][0]: gr.Accordion(visible=mode == "colocated"),
                    sections[DISTRIBUTED][0]: gr.Accordion(visible=mode == "distributed")}

        def on_preview(data: dict, oauth_token: gr.OAuthToken | None, profile: gr.OAuthProfile | None):
            shown = panel.preview(values_of(data), visitor_of(oauth_token, profile))
            seen = {"fingerprint": shown.fingerprint, "run_id": shown.run_id} if shown.fingerprint else None
            return {launch_msg: shown.markdown, reviewed: seen, confirm: False,
                    **show_fields(shown.fields, data[marks])}

        def on_launch(data: dict, oauth_token: gr.OAuthToken | None, profile: gr.OAuthProfile | None):
            seen = data[reviewed] or {}
            result = panel.launch(values_of(data), visitor_of(oauth_token, profile),
                                  confirmed=seen.get("fingerprint") if data[confirm] else None,
                                  run_id=seen.get("run_id"), webhook=data[webhook])
            if result.run_id is None:
                fresh = result.preview
                seen = {"fingerprint": fresh.fingerprint, "run_id": fresh.run_id} if fresh else data[reviewed]
                return {launch_msg: result.message, reviewed: seen, confirm: False,
                        **show_fields(result.fields, data[marks])}
            # The reviewed preview is spent: a second launch needs its own preview (and its own run id).
            return {launch_msg: result.message, reviewed: None, confirm: False, tabs: gr.Tabs(selected="runs"),
                    **show_fields((), data[marks]),
                    webhook: "", run_pick: gr.update(choices=_run_choices(panel, visitor_of(oauth_token, profile)),
                                        value=result.run_id)}

        def cost_line(run_id, visitor) -> str:
            view = panel.view(run_id, visitor)
            try:
                cost, spec, _ = spend_view.run_cost(panel, run_id, visitor, view)
            except Exception:   # a failing price list or listing must not break the dashboard
                return ""
            return spend_view.cost_markdown(cost, float(spec.get("budget_usd") or 0.0), view.events)

        def draw(run_id, role, query, x, smooth, pick, session, visitor) -> dict:
            """The dashboard components this session has not drawn yet (only what changed)."""
            session = dict(session or {})
            axis = {"wall time": "time"}.get(x, x)
            corners = spend_view.spend_corners(panel, run_id, visitor) if axis == "dollars" else None
            update = live.dashboard_update(panel, run_id, session, visitor, role, query, x=axis, smoothing=smooth,
                                           dollars=corners)
            out = {dash[name]: PlotData(type="plotly", plot=value) if name in PLOT_IDS else value
                   for name, value in update.values.items()}
            view = panel.view(run_id, visitor)
            cost = cost_line(run_id, visitor)      # time passes: spend and ETA change without new records
            if session.get("cost") != cost:
                session["cost"] = cost
                out[cost_md] = cost
            change = diagnose.verdict(view.table.rows(last=diagnose.WINDOW), view.spec).change
            if session.get("change") != change:
                session["change"] = change
                out[change_btn] = gr.update(visible=bool(change))
            steps = dashboard.sample_steps(view)[:100]
            if session.get("sample_steps") != steps:
                session["sample_steps"] = steps
                out[sample_step] = gr.update(choices=["latest", *steps])
            rows = dashboard.sample_rows(view, pick)
            if session.get("samples") != rows:
                session["samples"] = rows
                out[samples] = rows
            if session.get("config") != view.version and view.spec:
                session["config"] = view.version
                out[config] = view.spec
            final = panel.final_adapter(run_id, visitor) if view.final_files else None
            if session.get("final") != final:
                session["final"] = final
                out[final_btn] = gr.update(value=final, interactive=final is not None)
            roles = sorted(view.jobs)
            if session.get("roles") != roles:
                session["roles"] = roles
                out[log_role] = gr.update(choices=roles, value=role if role in roles else "trainer")
            out[drawn] = session
            return out

        def list_update(visitor, find, state, last_rows) -> dict:
            """The runs list, re-sent only when it changed: a re-render resets the table for the visitor."""
            rows = panel.runs_table(visitor, query=find, status=state)
            if rows == last_rows:
                return {}
            choices = _run_choices(panel, visitor)
            return {runs_table: rows, run_pick: gr.update(choices=choices), listed: rows,
                    compare["picks"]: gr.update(choices=choices)}

        def on_tick(run_id, role, query, x, smooth, pick, session, last_rows, find, state,
                    oauth_token: gr.OAuthToken | None, profile: gr.OAuthProfile | None):
            visitor = visitor_of(oauth_token, profile)
            out = {runs_hint: panel.runs_hint(visitor)}
            if run_id:
                try:       # first: drawing refreshes the open run's view, which the runs list then reads
                    out.update(draw(run_id, role, query, x, smooth, pick, session, visitor))
                except KeyError:
                    out[drawn] = None     # signed out, or not this visitor's run
            return {**out, **list_update(visitor, find, state, last_rows)}

        def on_select(run_id, role, query, x, smooth, pick, oauth_token: gr.OAuthToken | None,
                      profile: gr.OAuthProfile | None):
            untick = {resume_confirm: False, resume_reviewed: None}
            if not run_id:
                return {**untick, drawn: None, cost_md: ""}
            visitor = visitor_of(oauth_token, profile)
            try:
                out = draw(run_id, role, query, x, smooth, "latest", None, visitor)
                steps = out[drawn].get("sample_steps", [])
                return {**untick, **out, sample_step: gr.update(choices=["latest", *steps], value="latest"),
                        push["repo"]: publish_view.suggested_repo_id(panel, run_id, visitor)}
            except KeyError as exc:
                return {**untick, status: exc.args[0], drawn: None, cost_md: ""}

        def on_options(run_id, role, query, x, smooth, pick, session, oauth_token: gr.OAuthToken | None,
                       profile: gr.OAuthProfile | None):
            if not run_id:
                return {drawn: gr.skip()}     # Gradio wants at least one output named
            try:
                return draw(run_id, role, query, x, smooth, pick, session, visitor_of(oauth_token, profile))
            except KeyError:
                return {drawn: gr.skip()}     # Gradio wants at least one output named

        def new_run(run_id, with_change: bool, oauth_token: gr.OAuthToken | None, profile: gr.OAuthProfile | None):
            """The launch form filled from a run's spec (with the verdict's change), ready to preview."""
            if not run_id:
                return {action_msg: "Pick a run first."}
            visitor = visitor_of(oauth_token, profile)
            try:
                view = panel.view(run_id, visitor)
                change = (diagnose.verdict(view.table.rows(last=diagnose.WINDOW), view.spec).change
                          if with_change else None)
                values, line = panel.form_from_run(run_id, visitor, change)
            except KeyError as exc:
                return {action_msg: exc.args[0]}
            opened = {accordion: gr.Accordion(open=True) for accordion, held in sections.values()
                      if held & set(change or {})}
            return {**{form[n]: values[n] for n in names}, launch_msg: line, reviewed: None, confirm: False,
                    tabs: gr.Tabs(selected="launch"), **opened}

        def on_new_run_with_change(run_id, oauth_token: gr.OAuthToken | None, profile: gr.OAuthProfile | None):
            return new_run(run_id, True, oauth_token, profile)

        def on_new_run_from(run_id, oauth_token: gr.OAuthToken | None, profile: gr.OAuthProfile | None):
            return new_run(run_id, False, oauth_token, profile)

        def on_push(run_id, repo_id, private, oauth_token: gr.OAuthToken | None, profile: gr.OAuthProfile | None):
            return publish_view.push(panel, run_id, repo_id, private, visitor_of(oauth_token, profile))

        def on_log_filter(run_id, role, query, oauth_token: gr.OAuthToken | None):
            try:
                view = panel.view(run_id, visitor_of(oauth_token)) if run_id else None
            except KeyError:
                view = None
            return dashboard.log_text(view, role, query) if view else ""

        def on_filter(find, state, oauth_token: gr.OAuthToken | None, profile: gr.OAuthProfile | None):
            return list_update(visitor_of(oauth_token, profile), find, state, None)

        def on_row(evt: gr.SelectData):
            """A click anywhere in a row opens that run (the dropdown follows)."""
            row = evt.row_value or []
            return row[0] if row else gr.skip()

        def on_url(request: gr.Request, oauth_token: gr.OAuthToken | None, profile: gr.OAuthProfile | None):
            """`?run=<id>` opens that run on the Runs tab, if this visitor may see it."""
            run_id = (request.query_params.get("run") or "").strip() if request else ""
            if not run_id:
                return {run_pick: gr.skip()}
            try:
                panel.view(run_id, visitor_of(oauth_token, profile))
            except KeyError:
                return {action_msg: f"Run `{run_id}` (from the address) is not one you can open here.",
                        tabs: gr.Tabs(selected="runs")}
            return {run_pick: run_id, tabs: gr.Tabs(selected="runs")}

        def on_full_log(run_id, role, oauth_token: gr.OAuthToken | None):
            try:
                path = panel.full_log_file(run_id, role, visitor_of(oauth_token)) if run_id else None
            except KeyError:
                path = None
            return gr.update(value=path, visible=path is not None)

        def on_cancel(run_id, oauth_token: gr.OAuthToken | None, profile: gr.OAuthProfile | None):
            if not run_id:
                return "Pick a run first."
            return panel.cancel(run_id, visitor_of(oauth_token, profile))

        def on_resume(run_id, ticked, seen, oauth_token: gr.OAuthToken | None, profile: gr.OAuthProfile | None):
            if not run_id:
                return "Pick a run first.", False, None
            visitor = visitor_of(oauth_token, profile)
            confirmed = seen["fingerprint"] if ticked and seen and seen.get("run_id") == run_id else None
            message = panel.resume(run_id, visitor, confirmed=confirmed)
            if message.startswith("**Not resumed yet"):
                shown = panel.resume_preview(run_id, visitor)
                return message, False, {"fingerprint": shown.fingerprint, "run_id": run_id}
            return message, False, None

        def on_load(executor, bucket, oauth_token: gr.OAuthToken | None, profile: gr.OAuthProfile | None):
            visitor = visitor_of(oauth_token, profile)
            flavors = _flavor_choices(panel.flavors(visitor))
            if engine(executor).bucket_on_hub and not bucket:
                bucket = panel.default_bucket(visitor, executor)
            return (gr.update(choices=_run_choices(panel, visitor)), panel.runs_hint(visitor), bucket,
                    gr.update(choices=flavors), gr.update(choices=flavors))

        preset.change(on_preset, preset, [*inputs, preset_info])
        # Any change to the form withdraws the tick: the review was of another spec (the server checks it too).
        gr.on([c.change for c in inputs], lambda: False, None, confirm, show_progress="hidden")
        accordions = [accordion for accordion, _ in sections.values()]
        form["mode"].change(on_mode, form["mode"], [sections[COLOCATED][0], sections[DISTRIBUTED][0]],
                            show_progress="hidden")
        preview_btn.click(on_preview, {*inputs, marks}, [launch_msg, reviewed, confirm, marks, *accordions, *inputs])
        launch_btn.click(on_launch, {*inputs, confirm, reviewed, webhook, marks},
                         [launch_msg, reviewed, confirm, tabs, run_pick, webhook, marks, *accordions, *inputs])
        view_inputs = [run_pick, log_role, log_query, x_axis, smoothing, sample_step]
        timer.tick(on_tick, [*view_inputs, drawn, listed, runs_query, runs_status],
                   [runs_table, run_pick, listed, compare["picks"], runs_hint, *dash_outputs], show_progress="hidden")
        run_pick.change(on_select, view_inputs, [*dash_outputs, status, resume_confirm, resume_reviewed, push["repo"]])
        run_pick.change(None, run_pick, None, js=RUN_IN_URL)
        runs_table.select(on_row, None, run_pick)
        gr.on([runs_query.submit, runs_status.change], on_filter, [runs_query, runs_status],
              [runs_table, run_pick, listed, compare["picks"]], show_progress="hidden")
        gr.on([x_axis.change, smoothing.release, sample_step.change], on_options, [*view_inputs, drawn], dash_outputs,
              show_progress="hidden")
        new_run_outputs = [*inputs, launch_msg, reviewed, confirm, tabs, action_msg, *accordions]
        change_btn.click(on_new_run_with_change, run_pick, new_run_outputs)
        clone_btn.click(on_new_run_from, run_pick, new_run_outputs)
        push["button"].click(on_push, [run_pick, push["repo"], push["private"]], push["message"])
        log_query.change(on_log_filter, [run_pick, log_role, log_query], log_box)
        log_role.change(on_log_filter, [run_pick, log_role, log_query], log_box)
        log_btn.click(on_full_log, [run_pick, log_role], log_file).then(None, None, None, js=DOWNLOAD_LOG)
        # A tail is read from the bottom; the textbox's own autoscroll does not fire on timer updates here.
        log_box.change(None, None, None, js=SCROLL_LOG_TO_END)
        cancel_btn.click(on_cancel, run_pick, action_msg)
        resume_btn.click(on_resume, [run_pick, resume_confirm, resume_reviewed],
                         [action_msg, resume_confirm, resume_reviewed])
        demo.load(on_load, [form["executor"], form["bucket"]],
                  [run_pick, runs_hint, form["bucket"], form["flavor"], form["vllm_flavor"]])
        demo.load(on_url, None, [run_pick, tabs, action_msg])
    return demo


def _run_choices(panel: Panel, visitor: Visitor) -> list[str]:
    return [r[0] for r in panel.runs_table(visitor, with_cost=False)]
