"""The Launch tab: a preset, the form (RunSpec's fields by section, and the task section), the alert webhook,
Preview and Launch; and filling the form from a run (the Runs tab's "New run from this" buttons).

Handlers are plain functions over the form's values by field name (see `panel.page`)."""

import dataclasses

import gradio as gr

from backend.plan.engines import engine, engines, known_engine
from backend.plan.spec import COLOCATED, DISTRIBUTED, GRPO, HELD_OUT_FIELDS, LORA, STORAGE, RunSpec, form_fields
from backend.plan.sweep import EARLY_STOP_FIELD, MAX_EARLY_STOP_AFTER, MAX_SWEPT_FIELDS, sweepable_fields
from backend.runs.operations import WEBHOOK_FIELD, SweepForm
from backend.view import diagnose
from panel import tick
from panel.actions import Panel
from panel.presets import PRESETS, TINY_DEMO, preset_note, preset_values
from panel.runs_view import run_choices
from panel.task_form import HELD_OUT_TITLE, REQUIRED_CHOICE, TaskSection

SPEC_FIELDS = {f.name: f for f in dataclasses.fields(RunSpec)}
ROW = 4     # fields a row of a form section
# Each section of the form (an accordion) and the RunSpec fields it holds, opened when one of them is refused.
# The settings a user changes first, on the first screen with Launch (out of their sections).
FIRST = ("max_steps", "learning_rate")
SECTIONS = {title: {f.name for f in form_fields(title)} - set(FIRST)
            for title in (LORA, GRPO, COLOCATED, DISTRIBUTED, STORAGE)}
SECTIONS[HELD_OUT_TITLE] = set(HELD_OUT_FIELDS)
ALERTS = "Alerts"
SECTIONS[ALERTS] = {WEBHOOK_FIELD}     # the alert webhook, beside the form: a refusal opens and marks it too
SWEEP = "Sweep (distributed)"
SWEEP_FIELD = "sweep"                  # how a refusal names the sweep as a whole (backend/plan/sweep.py)
EARLY_STOP_LABEL = "Stop early after K held-out versions each (0: by hand)"
SECTIONS[SWEEP] = {SWEEP_FIELD, EARLY_STOP_FIELD}
GRID, SIDE_BY_SIDE = "grid", "side by side"


def _field(name: str, initial: dict, flavors: list | None = None):
    """The form's widget for RunSpec field `name`, labelled and explained by the field itself (`spec.setting`)."""
    spec_field = SPEC_FIELDS[name]
    meta, value = spec_field.metadata, initial[name]
    info = "; ".join(part for part in (meta.get("help"), limits_text(meta.get("limits"))) if part)
    common = dict(label=meta.get("label", name), info=info or None, elem_id=f"f-{name}")
    if meta.get("widget") == "flavor":
        return gr.Dropdown(flavor_choices(flavors or []), value=value, allow_custom_value=True,
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


def flavor_choices(flavors) -> list[tuple[str, str]]:
    return [(f"{f.name} · {f.pretty} · ${f.price_per_hour_usd:.2f}/h", f.name) for f in flavors]


def form_flavors(panel: Panel, visitor, executor: str) -> list:
    """The hardware the form offers for runs on `executor`: its own (another engine's would fail at submission);
    for one whose runs pick no hardware, every offered executor's, as the spec's flavor fields are then unused."""
    known = known_engine(executor)
    return panel.flavors(visitor, executor if known is not None and known.chooses_hardware else None)


def _section(f: dict, title: str, initial: dict, flavors: list, **kw):
    """An accordion holding RunSpec's fields of section `title` (in their declaration order, ROW a row; a list of
    checkboxes on a row of its own)."""
    names = [spec_field.name for spec_field in form_fields(title) if spec_field.name not in FIRST]
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
    return accordion


def executor_choices(executors: list[str]) -> list[tuple[str, str]]:
    """*Run on*'s choices in words ("This machine", "Hugging Face Jobs"); the value stays the executor's name."""
    return [(engine(name).choice or name, name) for name in executors]


def run_on_help(executors: list[str]) -> str:
    """*Run on*'s help: what each choice means where its name does not say it ("This machine: local processes ·
    Hugging Face Jobs: billed per hour, with your Hugging Face token"), never a name repeated as its own meaning."""
    parts = []
    for label, name in executor_choices(executors):
        where = engine(name)
        said = [where.label] if where.label and where.label.lower() != label.lower() else []
        said += ["billed per hour"] if where.billed else []
        said += ["with your Hugging Face token"] if where.needs_token else []
        parts.append(f"{label}: {', '.join(said)}" if said else label)
    return " · ".join(parts)


def _first_fields(initial: dict, executors: list[str]) -> dict:
    """The fields of the first screen, beside Launch: name, model, the settings changed first, where and how."""
    f = {}
    with gr.Row():
        for name in ("name", "model", *FIRST):
            f[name] = _field(name, initial)
    with gr.Row():
        f["executor"] = gr.Radio(executor_choices(executors), value=initial["executor"], label="Run on",
                                 elem_id="f-executor",
                                 info=run_on_help(executors))
        f["mode"] = gr.Radio(["colocated", "distributed"], value=initial["mode"], label="Mode", elem_id="f-mode",
                             info="colocated: one job, vLLM inside the trainer · distributed: trainer + vLLM replicas")
    return f


def _more_fields(panel: Panel, f: dict, initial: dict) -> tuple[TaskSection, dict]:
    """The rest of the form below Launch, added to `f`: the task section, and the accordions by section title."""
    flavors = form_flavors(panel, None, initial["executor"])
    task = TaskSection.build(initial)
    f.update(task.fields)
    sections = {title: _section(f, title, initial, flavors) for title in (LORA, GRPO)}
    sections[COLOCATED] = _section(f, COLOCATED, initial, flavors, visible=initial["mode"] == "colocated")
    sections[DISTRIBUTED] = _section(f, DISTRIBUTED, initial, flavors, visible=initial["mode"] == "distributed")
    sections[STORAGE] = _section(f, STORAGE, initial, flavors)
    sections[HELD_OUT_TITLE] = task.held_out
    return task, sections


def _sweep_section() -> tuple[gr.Accordion, dict]:
    """The sweep: up to MAX_SWEPT_FIELDS rows of a field and its values, and grid or side by side. Rows left empty
    launch one run as before; a filled row makes Preview and Launch show and start the sweep's members."""
    choices = [(f"{SPEC_FIELDS[name].metadata.get('label', name)} ({name})", name) for name in sweepable_fields()]
    parts = {}
    with gr.Accordion(SWEEP, open=False, elem_id="sweep") as accordion:
        gr.Markdown("Launch several runs that differ in one to three settings, each an ordinary distributed run of "
                    "the form's settings with its own values: pick a field, give its values separated by commas "
                    "(semicolons where a value holds commas, e.g. reward weights). Leave the rows empty for one run.")
        for i in range(MAX_SWEPT_FIELDS):
            with gr.Row():
                parts[f"field{i}"] = gr.Dropdown([("", ""), *choices], value="", label=f"Swept field {i + 1}",
                                                 allow_custom_value=True, elem_id=f"sweep-field-{i}", scale=1)
                parts[f"values{i}"] = gr.Textbox("", label=f"Values {i + 1}", placeholder="1e-4, 5e-4, 1e-3",
                                                 elem_id=f"sweep-values-{i}", scale=2)
        parts["grid"] = gr.Radio([GRID, SIDE_BY_SIDE], value=GRID, label="Combine the values", elem_id="sweep-grid",
                                 info="grid: every combination · side by side: the i-th values of each row together")
        parts["stop_after"] = gr.Number(0, label=EARLY_STOP_LABEL, precision=0, minimum=0,
                                        maximum=MAX_EARLY_STOP_AFTER, elem_id="sweep-stop-after",
                                        info="successive halving: once every member still training has K more "
                                             "held-out versions, the worse half by best held-out score is stopped; "
                                             "0: stop members by hand only (Sweep tab)")
        parts["budget"] = gr.Number(0, label="Sweep budget cap (USD)", elem_id="sweep-budget",
                                    info="HF Jobs: one cap over every member's jobs and the fleet's; once their spend "
                                         "together reaches it, all are cancelled; 0: none")
    return accordion, parts


def sweep_form(parts: dict, reviewed: dict | None = None) -> SweepForm:
    """The sweep section's values as the backend reads them, with the sweep id and run ids the reviewed preview
    showed (the launch keeps them)."""
    rows = tuple((str(parts.get(f"field{i}") or ""), str(parts.get(f"values{i}") or ""))
                 for i in range(MAX_SWEPT_FIELDS))
    seen = reviewed if isinstance(reviewed, dict) else {}
    return SweepForm(rows, parts.get("grid") != SIDE_BY_SIDE, str(seen.get("sweep_id") or ""),
                     tuple(str(r) for r in seen.get("run_ids") or ()), _whole(parts.get("stop_after")),
                     parts.get("budget"))


def _whole(value):
    """A Number field's value as the whole number it stands for (None: 0); anything else as it is, for the backend
    to refuse by the field's name."""
    if value is None or value == "":
        return 0
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def presets_for(panel: Panel) -> tuple[list[str], str]:
    """The presets this deployment can run, and the one the form opens with (an HF Jobs one on a Space, or where
    local runs cannot run)."""
    offered = panel.offered_executors()
    names = [n for n, p in PRESETS.items() if p.get("executor") in offered]
    first = next((n for n in names if not engine(PRESETS[n]["executor"]).on_panel_machine), names[0])
    return names, (first if panel.settings.on_space or TINY_DEMO not in names else TINY_DEMO)


def build(page, panel: Panel) -> None:
    """The Launch tab's components, added to `page`."""
    preset_names, first_preset = presets_for(panel)
    initial = preset_values(first_preset, bucket=panel.default_bucket(None, PRESETS[first_preset]["executor"]))
    executors = panel.offered_executors()
    with gr.Tab("Launch", id="launch"):
        # The first screen: a preset, the fields changed first, Preview and Launch; the rest of the form below.
        with gr.Row(equal_height=False):
            preset = gr.Dropdown(preset_names, value=first_preset, label="Preset", elem_id="preset", scale=1)
            with gr.Column(scale=1):
                preset_info = gr.Markdown(preset_note(first_preset), elem_id="preset-note")
        form = _first_fields(initial, executors)
        with gr.Row():
            preview_btn = gr.Button("Preview jobs", elem_id="preview-btn")
            confirm = gr.Checkbox(False, label="I reviewed the jobs and the estimated cost (HF Jobs)",
                                  elem_id="confirm")
            launch_btn = gr.Button("Launch", variant="primary", elem_id="launch-btn")
        launch_msg = gr.Markdown(elem_id="launch-msg")
        task, sections = _more_fields(panel, form, initial)
        sections[SWEEP], sweep = _sweep_section()
        panel.field_labels = {n: c.label for n, c in form.items() if getattr(c, "label", None)}
        panel.field_labels[SWEEP_FIELD] = "Sweep"
        panel.field_labels[EARLY_STOP_FIELD] = EARLY_STOP_LABEL
        with gr.Accordion(ALERTS, open=False) as sections[ALERTS]:
            webhook = gr.Textbox("", label="Alert webhook URL (optional)", type="password", elem_id="f-webhook",
                                 info="Slack or Discord webhook: the run's alerts (ratio drift, stall, a replica not "
                                      "serving its adapter, ...) are posted there. Kept encrypted by this panel; "
                                      "never shown again or written to the bucket."
                                      + (" This panel serves others: https to a public address only."
                                         if panel.settings.serves_others else ""))
        panel.field_labels[WEBHOOK_FIELD] = webhook.label
        # {"fingerprint", "run_id"} of the preview this session last saw (a sweep's: "sweep_id", "run_ids" too)
        reviewed = gr.State(None)
        marks = gr.State([])        # the form fields marked as refused by the last preview or launch
    page.add(preset=preset, preset_info=preset_info, form=form, sections=sections, task=task, webhook=webhook,
             preview_btn=preview_btn, confirm=confirm, launch_btn=launch_btn, launch_msg=launch_msg,
             reviewed=reviewed, marks=marks, sweep=sweep)


def wire(page) -> None:
    """The Launch tab's events (and the Runs tab's buttons that fill the form)."""
    form = page["form"]
    inputs = list(form.values())
    page["task"].wire(page.panel, list(form), inputs)
    page.on(page["preset"].change, on_preset, ["preset"], ["form", "preset_info"])
    # Any change to the form withdraws the tick: the review was of another spec (the server checks it too).
    gr.on([c.change for c in [*inputs, *page["sweep"].values()]], lambda: False, None, page["confirm"],
          show_progress="hidden")
    sections = page["sections"]
    form["mode"].change(on_mode, form["mode"], [sections[COLOCATED], sections[DISTRIBUTED]],
                        show_progress="hidden")
    refused = ["launch_msg", "reviewed", "confirm", "marks", "sections", "form"]
    page.on(page["preview_btn"].click, on_preview, ["form", "marks", "webhook", "sweep"], [*refused, "webhook"])
    page.on(page["launch_btn"].click, on_launch, ["form", "marks", "confirm", "reviewed", "webhook", "sweep"],
            [*refused, "tabs", "run_pick", "webhook", "timer", "idle_timer"])
    filled = ["form", "launch_msg", "reviewed", "confirm", "tabs", "action_msg", "sections"]
    page.on(page["change"].click, on_new_run_with_change, ["run_pick"], filled)
    page.on(page["clone"].click, on_new_run_from, ["run_pick"], filled)
    page.on(form["executor"].change, on_executor, ["form.executor", "form.mount_path"],
            ["form.flavor", "form.vllm_flavor", "form.mount_path"], show_progress="hidden")
    page.on(page["demo"].load, on_load, ["form.executor", "form.bucket"],
            ["run_pick", "runs_hint", "form.bucket", "form.flavor", "form.vllm_flavor"])


def on_preset(panel, visitor, choice: str) -> dict:
    # A preset is a complete starting point: every field it does not name takes its default.
    values = preset_values(choice, bucket=panel.default_bucket(visitor, PRESETS[choice]["executor"]))
    return {"form": values, "preset_info": preset_note(choice)}


def on_mode(mode: str) -> list:
    """Only the sections that apply to the chosen mode are shown (colocated's, distributed's)."""
    return [gr.Accordion(visible=mode == "colocated"), gr.Accordion(visible=mode == "distributed")]


def show_fields(bad, marked: list[str] | None, names) -> dict:
    """Open the sections holding `bad` fields and mark those of the form's `names`; unmark the ones marked
    before."""
    fields = {name: gr.update(elem_classes=[]) for name in set(marked or []) - set(bad)}
    fields.update({name: gr.update(elem_classes=["field-error"]) for name in bad if name in names})
    return {"sections": {title: gr.Accordion(open=True) for title, held in SECTIONS.items() if held & set(bad)},
            "form": fields, "marks": [n for n in bad if n in names]}


def _seen(preview) -> dict:
    seen = {"fingerprint": preview.fingerprint, "run_id": preview.run_id}
    if preview.sweep_id:
        seen.update(sweep_id=preview.sweep_id, run_ids=list(preview.run_ids))
    return seen


def on_preview(panel, visitor, values: dict, marked: list[str], webhook: str = "", sweep: dict | None = None) -> dict:
    shown = panel.preview(values, visitor, webhook=webhook, sweep=sweep_form(sweep or {}))
    return {"launch_msg": shown.markdown, "reviewed": _seen(shown) if shown.fingerprint else None, "confirm": False,
            **show_fields(shown.fields, marked, values), "webhook": _webhook_mark(shown.fields)}


def _webhook_mark(bad) -> dict:
    """The alert webhook marked as refused, or unmarked (it is not one of the form's fields)."""
    return gr.update(elem_classes=["field-error"] if WEBHOOK_FIELD in bad else [])


def on_launch(panel, visitor, values: dict, marked: list[str], confirm: bool, reviewed: dict | None,
              webhook: str, sweep: dict | None = None) -> dict:
    seen = reviewed or {}
    result = panel.launch(values, visitor, confirmed=seen.get("fingerprint") if confirm else None,
                          run_id=seen.get("run_id"), webhook=webhook, sweep=sweep_form(sweep or {}, seen))
    if result.run_id is None:
        fresh = result.preview
        return {"launch_msg": result.message, "reviewed": _seen(fresh) if fresh else reviewed, "confirm": False,
                **show_fields(result.fields, marked, values), "webhook": _webhook_mark(result.fields)}
    # The reviewed preview is spent: a second launch needs its own preview (and its own run id).
    return {"launch_msg": result.message, "reviewed": None, "confirm": False, "tabs": gr.Tabs(selected="runs"),
            **show_fields((), marked, values), "webhook": gr.update(value="", elem_classes=[]),
            "run_pick": gr.update(choices=run_choices(panel, visitor), value=result.run_id),
            **tick.wake()}      # the new run is live: the page ticks at TICK_S again (panel/tick.py)


def new_run(panel, visitor, run_id: str | None, with_change: bool) -> dict:
    """The launch form filled from a run's spec (with the verdict's change), ready to preview."""
    if not run_id:
        return {"action_msg": "Pick a run first."}
    try:
        view = panel.view(run_id, visitor)
        change = (diagnose.view_verdict(view).change
                  if with_change else None)
        values, line = panel.form_from_run(run_id, visitor, change)
    except KeyError as exc:
        return {"action_msg": exc.args[0]}
    opened = {title: gr.Accordion(open=True) for title, held in SECTIONS.items() if held & set(change or {})}
    return {"form": values, "launch_msg": line, "reviewed": None, "confirm": False,
            "tabs": gr.Tabs(selected="launch"), "sections": opened}


def on_new_run_with_change(panel, visitor, run_id: str | None) -> dict:
    return new_run(panel, visitor, run_id, True)


def on_new_run_from(panel, visitor, run_id: str | None) -> dict:
    return new_run(panel, visitor, run_id, False)


def on_executor(panel, visitor, executor: str, mount: str = "") -> dict:
    """Another executor picked: the hardware lists offer its flavors, and a mount path the user left at an
    executor's default becomes the new executor's (a Ray job's is a folder the cluster shares, not /bucket)."""
    flavors = flavor_choices(form_flavors(panel, visitor, executor))
    out = {"form.flavor": gr.update(choices=flavors), "form.vllm_flavor": gr.update(choices=flavors)}
    defaults = {RunSpec.mount_path, ""} | {panel.default_mount(each.name) for each in engines()}
    if (mount or "") in defaults:
        out["form.mount_path"] = panel.default_mount(executor, make=True)
    return out


def on_load(panel, visitor, executor: str, bucket: str) -> dict:
    """A page load: the visitor's runs to pick from, the flavors with their prices, the bucket of their own."""
    flavors = flavor_choices(form_flavors(panel, visitor, executor))
    if engine(executor).bucket_on_hub and not bucket:
        bucket = panel.default_bucket(visitor, executor)
    return {"run_pick": gr.update(choices=run_choices(panel, visitor)), "runs_hint": panel.runs_hint(visitor),
            "form.bucket": bucket, "form.flavor": gr.update(choices=flavors),
            "form.vllm_flavor": gr.update(choices=flavors)}
