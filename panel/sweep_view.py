"""The Sweep tab: every member of a sweep overlaid (training reward, held-out score by version under each member's own
best-by rule, staleness, importance ratio: the Compare tab's `overlay`), the members ranked by best held-out score
(`backend.view.sweep`), the sweep's stated early-stop rule carried out, "Stop this member" by hand, and the best
member's best version one click from download.

Opened from a member's *Open sweep view* (Runs tab) or by picking any member here; refreshed every SWEEP_TICK_S while
a sweep with a member still training is shown: its timer is off otherwise (every tick of any timer costs the browser a
pass over the whole page, whichever tab shows: docs/measurements.md, "Idle page in the browser"). Handlers are plain
functions (see `panel.page`).
"""

import gradio as gr

from backend.outcome.best_version import ChoiceError
from backend.outcome.publish import PublishError
from backend.plan.jobspec import TERMINAL_STAGES
from backend.runtime import layout
from backend.runtime.redact import redact_tokens
from backend.view.sweep import (
    BY_HAND,
    RANK_HEADERS,
    Halving,
    Member,
    Stop,
    best_member,
    rank,
    rank_rows,
    scores_of,
    worst_live,
)
from panel.compare_view import HELD_OUT, overlay
from panel.markdown import masked
from panel.sweep_rule import apply_rule, members_of, stop_events, stop_members

SWEEP_TICK_S = 10.0
SWEEP_PLOTS = ("reward", HELD_OUT, "staleness", "ratio")
STOP_CHOICE_SEP = " · "             # a stop pick reads "m2 · <run id>"


def build(page, panel) -> None:
    """The Sweep tab's components, added to `page`."""
    with gr.Tab("Sweep", id="sweep"):
        with gr.Row():
            member = gr.Dropdown([], label="A member of the sweep (any of its runs)", elem_id="sweep-run", scale=4,
                                 allow_custom_value=True)
            show = gr.Button("Show sweep", variant="primary", elem_id="sweep-show", scale=1)
        note = gr.Markdown(elem_id="sweep-note")
        ranking = gr.Dataframe(headers=RANK_HEADERS, interactive=False, wrap=True, elem_id="sweep-rank",
                               label="Members ranked by best held-out score (each by its own best-by rule)")
        with gr.Row():
            stop_pick = gr.Dropdown([], label="Member to stop (the worst still training by default)",
                                    elem_id="sweep-stop-pick", scale=3, allow_custom_value=True)
            stop = gr.Button("Stop this member", variant="stop", elem_id="sweep-stop-btn", scale=1)
        stop_msg = gr.Markdown(elem_id="sweep-stop-msg")
        with gr.Row():
            best_file = gr.DownloadButton("Download the best member's best version (.zip)", interactive=False,
                                          elem_id="sweep-best-btn", scale=1)
            best_msg = gr.Markdown(elem_id="sweep-best-msg")
        plots = {}
        for pair in (SWEEP_PLOTS[0:2], SWEEP_PLOTS[2:4]):
            with gr.Row():
                for name in pair:
                    plots[name] = gr.Plot(elem_id=f"sweep-{name}")
        seen = gr.State(None)      # {"best": [run id, choice]} whose zip this session's button holds
    page.add(sweep_run=member, sweep_show=show, sweep_note=note, sweep_rank=ranking, sweep_stop_pick=stop_pick,
             sweep_stop=stop, sweep_stop_msg=stop_msg, sweep_best_file=best_file, sweep_best_msg=best_msg,
             sweep_plots=plots, sweep_seen=seen, sweep_timer=gr.Timer(SWEEP_TICK_S, active=False))


SHOWN = ["sweep_note", "sweep_rank", "sweep_stop_pick", "sweep_best_file", "sweep_best_msg", "sweep_plots",
         "sweep_seen", "sweep_timer"]


def wire(page) -> None:
    page.on([page["sweep_show"].click, page["sweep_run"].change], on_sweep_show, ["sweep_run", "sweep_seen"], SHOWN)
    page.on(page["sweep_timer"].tick, on_sweep_tick, ["sweep_run", "sweep_seen", "sweep_stop_pick"], SHOWN,
            show_progress="hidden")
    page.on(page["sweep_stop"].click, on_sweep_stop, ["sweep_run", "sweep_stop_pick", "sweep_seen"],
            [*SHOWN, "sweep_stop_msg"])


def on_sweep_show(panel, visitor, run_id, seen) -> dict:
    return show(panel, visitor, run_id, seen, apply=True)


def on_sweep_tick(panel, visitor, run_id, seen, pick=None) -> dict:
    """The picked sweep drawn again (and its rule's next rung carried out where due); the visitor's stop pick kept
    while that member still trains."""
    if not run_id:
        return {}
    return show(panel, visitor, run_id, seen, apply=True, pick=pick)


def on_sweep_stop(panel, visitor, run_id, pick, seen) -> dict:
    """Stop the picked member (by hand), recorded with every member's score then; the others train on."""
    if not run_id or not pick:
        return {"sweep_stop_msg": "Pick a sweep and the member to stop first."}
    tag = str(pick).split(STOP_CHOICE_SEP, 1)[0].strip()
    try:
        record, members = members_of(panel, run_id, visitor)
    except KeyError as exc:
        return {"sweep_stop_msg": f"**Not stopped.** {masked(exc.args[0] if exc.args else exc)}"}
    states = [m for m, _ in members]
    if tag not in {m.tag for m in states}:
        return {"sweep_stop_msg": f"**Not stopped.** {masked(tag)} is not a member of sweep {record['sweep_id']}."}
    message = stop_members(panel, visitor, record, states, Stop(BY_HAND, None, (tag,), scores_of(states)))
    return {**show(panel, visitor, run_id, seen, apply=False), "sweep_stop_msg": message[0].upper() + message[1:]}


def show(panel, visitor, run_id, seen, apply: bool, pick: str | None = None) -> dict:
    """The sweep of `run_id` drawn: its note (the rule, what it waits for, the stops so far), the ranking, the stop
    picker (`pick` kept where it names a member still training, else the worst of them: a tick never moves a pick
    the visitor made), the best member's best version on the download button, and the overlaid charts."""
    if not run_id:
        return {"sweep_note": "Pick a member of a sweep (or press *Open sweep view* on one in the Runs tab).",
                **_ticking(False)}
    try:
        record, members = members_of(panel, run_id, visitor)
    except KeyError as exc:
        return {"sweep_note": f"**No sweep to show.** {masked(exc.args[0] if exc.args else exc)}", **_ticking(False)}
    done = apply_rule(panel, visitor, run_id, record) if apply else ""
    if done.startswith("Rung"):        # it stopped members: read them again
        record, members = members_of(panel, run_id, visitor, fresh=True)
    states, views = [m for m, _ in members], [v for _, v in members]
    figures, _ = overlay([(m.run_id, v, None) for m, v in members], "step", SWEEP_PLOTS,
                         label=lambda member_id, view: f"{view.member or 'run'} · {member_id}")
    worst = worst_live(states)
    choices = [f"{m.tag}{STOP_CHOICE_SEP}{m.run_id}" for m in rank(states) if m.live]
    picked = pick if pick in choices else (f"{worst.tag}{STOP_CHOICE_SEP}{worst.run_id}" if worst else None)
    pending = {m.tag: record["orders"][m.tag] for m in states if m.ordered and m.stage not in TERMINAL_STAGES}
    return {"sweep_note": _note(record, states, stop_events(views), done, pending),
            "sweep_rank": rank_rows(states),
            "sweep_stop_pick": gr.update(choices=choices, value=picked),
            "sweep_plots": {name: figures[name] for name in SWEEP_PLOTS},
            **_best_download(panel, visitor, states, seen), **_ticking(any(m.live for m in states))}


def _ticking(live: bool) -> dict:
    """The Sweep tab's timer on while the shown sweep has a member still training, off once none has (or none is
    shown): *Show sweep* draws it again and turns it back on where a member trains again."""
    return {"sweep_timer": gr.update(active=live)}


def _note(record: dict, members: list[Member], events: list[dict], done: str, orders: dict) -> str:
    after = record["early_stop_after"]
    rule = Halving(after).text() if after else "by hand only (Stop this member); no automatic rule was stated"
    head = (f"**Sweep `{record['sweep_id']}`**: {len(members)} member(s), {sum(m.live for m in members)} still "
            f"training. **Early stop:** {rule}.")
    lines = [head]
    if done:
        lines.append(done)
    for event in sorted(events, key=lambda e: e.get("time") or 0):
        scores = event.get("scores") if isinstance(event.get("scores"), dict) else {}
        shown = ", ".join(f"{tag} {'-' if s is None else f'{s:.3f}'}" for tag, s in scores.items()
                          if s is None or isinstance(s, (int, float)))
        lines.append(f"■ *Stopped:* {event.get('member')} ({event.get('rule')}); best held-out scores then: "
                     f"{shown or 'none yet'}")
    for tag, order in sorted(orders.items()):
        lines.append(f"□ *Ordered to stop:* {tag} ({masked(order.get('rule'))}, by {masked(order.get('by') or '?')}):"
                     " its trainer ends at its next step")
    return redact_tokens("\n\n".join(lines))


def _best_download(panel, visitor, members: list[Member], seen) -> dict:
    """The best member's best version on the download button (its zip built once per (run, version)), and which
    it is; the member's run is where to push it from."""
    best = best_member(members)
    if best is None:
        return {"sweep_best_file": gr.update(value=None, interactive=False),
                "sweep_best_msg": "No member has a held-out score yet."}
    choice = "best" if best.beats_base else layout.adapter_name(best.best_version, best.tag)
    key = [best.run_id, choice, best.best_version]
    said = (f"Best: **{best.tag}** (`{best.run_id}`), v{best.best_version}, held-out {best.best_score:.3f} "
            f"({best.rule})" + ("" if best.beats_base else ", below its base model") +
            ". To push it, open the run in the Runs tab.")
    if isinstance(seen, dict) and seen.get("best") == key:
        return {"sweep_best_msg": said}
    try:
        path, _chosen = panel.adapter_version_zip(best.run_id, choice, visitor)
    except (KeyError, ChoiceError, PublishError) as exc:
        why = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        return {"sweep_best_file": gr.update(value=None, interactive=False),
                "sweep_best_msg": f"{said} **No download.** {masked(why)}"}
    return {"sweep_best_file": gr.update(value=path, interactive=True), "sweep_best_msg": said,
            "sweep_seen": {"best": key}}
