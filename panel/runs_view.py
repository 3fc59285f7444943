"""The Runs tab's list: pick a run (from the list, a row, or the page's address), filter the list, cancel and
resume; the timer that keeps the list and the open run live. The open run's dashboard is `dashboard_view`.

Handlers are plain functions (see `panel.page`)."""

import gradio as gr

from backend.runs.access import Visitor
from panel import dashboard_view, spend_view, tick
from panel.actions import Panel
from panel.page import visitor_of
from panel.runs_list import RUN_FILTERS, RUNS_HEADERS

# The picked run is in the page's address (?run=<id>): a reload or a shared link opens it again.
RUN_IN_URL = ("(id) => { const u = new URL(window.location.href); "
              "if (id) { u.searchParams.set('run', id); } else { u.searchParams.delete('run'); } "
              "window.history.replaceState(null, '', u); return []; }")
TIMERS = ["timer", "idle_timer"]      # what `tick.cadence` and `tick.wake` update
LISTED = ["runs_table", "run_pick", "listed", "compare_picks", "sweep_run", "runs_hint"]


def build(page, panel: Panel) -> None:
    """The runs list's components (the top of the Runs tab), added to `page`."""
    with gr.Row(equal_height=False):      # the actions keep their own height beside the picker
        # A timer tick that listed the runs just before a launch may send choices without the new run after the
        # launch selected it: a custom value keeps every later event from being refused.
        run_pick = gr.Dropdown([], label="Run", elem_id="run-pick", scale=3, allow_custom_value=True)
        # Shown where they apply to the picked run (`run_actions`): Cancel on a live run, Resume on a stopped one.
        cancel = gr.Button("Cancel run", variant="stop", elem_id="cancel-btn", scale=1, size="sm")
        cancel_sweep = gr.Button("Cancel sweep", variant="stop", elem_id="cancel-sweep-btn", scale=1, size="sm",
                                 visible=False)
        open_sweep = gr.Button("Open sweep view", elem_id="open-sweep-btn", scale=1, size="sm", visible=False)
        resume_confirm = gr.Checkbox(False, label="I reviewed the resume", elem_id="resume-confirm", scale=1)
        resume = gr.Button("Resume run", elem_id="resume-btn", scale=1, size="sm")
    # The list folds away once a run is open, so the run's header and key charts fill the first screen.
    with gr.Accordion("All runs", open=True, elem_id="runs-list") as runs_list:
        runs_hint = gr.Markdown(elem_id="runs-hint")    # why the list holds no Hub runs, where it does not
        with gr.Row():
            runs_query = gr.Textbox(label="Filter by name, id or #tag", elem_id="runs-query", scale=3)
            runs_status = gr.Radio(list(RUN_FILTERS), value="all", label="Status", elem_id="runs-status", scale=2)
        runs_table = gr.Dataframe(headers=RUNS_HEADERS, interactive=False, elem_id="runs-table",
                                  label="Runs (newest first; click a row to open it)")
    action_msg = gr.Markdown(elem_id="action-msg")
    listed = gr.State(None)     # the runs table and run choices this browser session last received
    resume_reviewed = gr.State(None)   # {"fingerprint", "run_id"} of the resume preview last shown
    page.add(runs_hint=runs_hint, runs_list=runs_list, run_pick=run_pick, cancel=cancel, cancel_sweep=cancel_sweep,
             resume_confirm=resume_confirm, resume=resume, open_sweep=open_sweep,
             runs_query=runs_query, runs_status=runs_status, runs_table=runs_table, action_msg=action_msg,
             listed=listed, resume_reviewed=resume_reviewed)


def build_orphans(panel: Panel) -> None:
    """The orphan jobs' finder, at the foot of the Runs tab (below the open run)."""
    spend_view.build_orphans(panel, visitor_of)


def wire(page) -> None:
    """The runs list's events, and the timer's tick (the list and the open run)."""
    view_inputs = dashboard_view.VIEW_INPUTS
    # The full update: on the fast timer, or on the idle check's click where something changed (panel/tick.py). The
    # fast timer's period is an input and an output: it stops, and the idle check starts, while nothing shown is live.
    # Gradio's default trigger mode ("once"): a tick while the last is pending is dropped, never queued behind it.
    page.on([page["timer"].tick, page["tick_full"].click], on_tick,
            [*view_inputs, "drawn", "listed", "runs_query", "runs_status", "version_pick", "timer", "tick_seen"],
            [*LISTED, *dashboard_view.DRAWN, *dashboard_view.ACTIONS, *TIMERS, "tick_seen"], show_progress="hidden")
    # The idle check runs in the browser, no Gradio event (`tick.CHECK`). The stamp it asks for is an endpoint off the
    # queue (no check waits behind a long event); its trigger, a hidden textbox's submit, never fires on the page.
    page["idle_timer"].tick(None, None, None, js=tick.CHECK)
    page.on(page["tick_stamp"].submit, tick.on_stamp, ["run_pick"], ["tick_stamp"], queue=False,
            api_name=tick.STAMP_API, api_visibility="undocumented", show_progress="hidden")
    page.on(page["run_pick"].change, dashboard_view.on_select, view_inputs,
            [*dashboard_view.DRAWN, "status", "resume_confirm", "resume_reviewed", "push.repo", "best_by",
             "best_by_msg", "runs_list", "cancel", "cancel_sweep", "open_sweep", "resume", *TIMERS])
    # A picked run opens on its default version (the best, else final/): its zip is built at once.
    page["run_pick"].change(None, page["run_pick"], None, js=RUN_IN_URL)
    page["runs_table"].select(on_row, None, page["run_pick"])
    page.on([page["runs_query"].submit, page["runs_status"].change], on_filter, ["runs_query", "runs_status"],
            LISTED, show_progress="hidden")
    page.on(page["cancel"].click, on_cancel, ["run_pick"], ["action_msg"])
    page.on(page["cancel_sweep"].click, on_cancel_sweep, ["run_pick"], ["action_msg"])
    page.on(page["open_sweep"].click, on_open_sweep, ["run_pick"], ["sweep_run", "tabs"])
    page.on(page["resume"].click, on_resume, ["run_pick", "resume_confirm", "resume_reviewed"],
            ["action_msg", "resume_confirm", "resume_reviewed", *TIMERS])
    page.on(page["demo"].load, on_url, [], ["run_pick", "tabs", "action_msg"], request=True)


def run_choices(panel: Panel, visitor: Visitor) -> list[tuple[str, str]]:
    """The run pickers' choices, (label, run id): a renamed run's display name (and tags) beside its id, as the runs
    list names it; a run that was not renamed by its id alone (the cheap table reads no spec)."""
    return labelled(panel.runs_table(visitor, with_cost=False))


def labelled(rows: list[list]) -> list[tuple[str, str]]:
    return [(f"{r[1]} · {r[0]}" if r[1] else r[0], r[0]) for r in rows]


def list_update(panel, visitor, find: str, state: str, listed, live: list | None = None) -> dict:
    """The runs list, re-sent only when it changed (a re-render resets the table for the visitor), and the run
    pickers' choices only when the runs did (a live run's cells change every tick; its id does not). `listed` is
    what this session was sent last ({"rows", "choices", "hint"}): kept up to date in place, so a tick sets no state.
    The hint above the list is read after the listing, which may have just failed (why it failed is the hint)."""
    rows = panel.runs_table(visitor, query=find, status=state)
    seen = listed if isinstance(listed, dict) else {}
    out = {} if rows == seen.get("rows") else {"runs_table": rows}
    every = panel.runs_table(visitor, with_cost=False)      # unfiltered: a live run the filter hides is live
    choices = labelled(every)
    if live is not None:
        live.append(tick.listed_live(every))
    if choices != seen.get("choices"):
        out.update(run_pick=gr.update(choices=choices), compare_picks=gr.update(choices=choices),
                   sweep_run=gr.update(choices=choices))
    hint = panel.runs_hint(visitor)
    if hint != seen.get("hint"):
        out["runs_hint"] = hint
    if out and not isinstance(listed, dict):
        out["listed"] = {"rows": rows, "choices": choices, "hint": hint}
    elif out:
        listed.update(rows=rows, choices=choices, hint=hint)
    return out


def on_tick(panel, visitor, run_id, role, query, x, smooth, pick, follow, session, last_rows, find, state,
            shown=None, interval=None, seen=None) -> dict:
    """The open run and the runs list, what changed of them; and the timer's period (`interval` now) set to fit:
    TICK_S while the open run or any listed run is live, IDLE_TICK_S while none is (panel/tick.py); `seen` the stamp
    of what the page last drew, replaced by this update's own (the idle check compares with it)."""
    out = tick.seen(panel, visitor, run_id, seen)
    if run_id:
        try:       # first: drawing refreshes the open run's view, which the runs list then reads
            out.update(dashboard_view.draw(panel, visitor, run_id, role, query, x, smooth, pick, follow, session,
                                           shown))
        except KeyError:
            out["drawn"] = None     # signed out, or not this visitor's run
    live: list = []
    out.update(list_update(panel, visitor, find, state, last_rows, live))
    drawn = out.get("drawn", session)
    # `actions` is (live, stopped, member) as `run_actions` last saw the open run; unknown yet: taken as live.
    open_live = bool(run_id) and isinstance(drawn, dict) and bool(drawn.get("actions", (True,))[0])
    return {**out, **tick.cadence(open_live or any(live), interval)}


def on_filter(panel, visitor, find: str, state: str) -> dict:
    return list_update(panel, visitor, find, state, None)


def on_row(evt: gr.SelectData):
    """A click anywhere in a row opens that run (the dropdown follows)."""
    row = evt.row_value or []
    return row[0] if row else gr.skip()


def on_url(panel, visitor, request) -> dict:
    """`?run=<id>` opens that run on the Runs tab, if this visitor may see it."""
    run_id = (request.query_params.get("run") or "").strip() if request else ""
    if not run_id:
        return {"run_pick": gr.skip()}
    try:
        panel.view(run_id, visitor)
    except KeyError:
        return {"action_msg": f"Run `{run_id}` (from the address) is not one you can open here.",
                "tabs": gr.Tabs(selected="runs")}
    return {"run_pick": run_id, "tabs": gr.Tabs(selected="runs")}


def on_cancel(panel, visitor, run_id: str | None) -> dict:
    return {"action_msg": panel.cancel(run_id, visitor) if run_id else "Pick a run first."}


def on_cancel_sweep(panel, visitor, run_id: str | None) -> dict:
    """Every member of the picked run's sweep cancelled."""
    return {"action_msg": panel.cancel_sweep(run_id, visitor) if run_id else "Pick a run first."}


def on_open_sweep(panel, visitor, run_id: str | None) -> dict:
    """The picked member's sweep on the Sweep tab (its pick's change draws it)."""
    return {"sweep_run": run_id, "tabs": gr.Tabs(selected="sweep")} if run_id else {"tabs": gr.skip()}


def on_resume(panel, visitor, run_id: str | None, ticked: bool, seen: dict | None) -> dict:
    out = {"resume_confirm": False, "resume_reviewed": None}
    if not run_id:
        return {**out, "action_msg": "Pick a run first."}
    confirmed = seen["fingerprint"] if ticked and seen and seen.get("run_id") == run_id else None
    message = panel.resume(run_id, visitor, confirmed=confirmed)
    if message.startswith("**Not resumed yet"):
        shown = panel.resume_preview(run_id, visitor)
        out["resume_reviewed"] = {"fingerprint": shown.fingerprint, "run_id": run_id}
    else:
        out.update(tick.wake())     # the run may be live again: the next tick shows it, not one IDLE_TICK_S away
    return {**out, "action_msg": message}
