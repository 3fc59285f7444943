"""A sweep's stop decisions from the panel: its stated early-stop rule (successive halving,
`backend.runtime.trainer.halving`)
where its next rung is due, and stops by hand, each a stop order in the bucket that the member's trainer obeys at
its next step (`backend/runtime/trainer/sweep_stops.py`: the one path every stop takes; its trainer records the
`sweep_stop` event, ends as at its last step and writes its final adapter).

The rule's own decider is the sweep's trainers (the first member still training writes the orders of a due rung),
with no page open on any engine. The panel writes the same orders, once: the Sweep tab (`panel/sweep_view.py`) on
every draw of a sweep a page shows, and a local panel's background watch (`apply_stated_rules`, every budget check);
a rung already ordered (by a trainer or a page) is not decided again. On a Space the watch writes nothing (it holds
no visitor's sign-in, and needs none: the trainers decide), and a stop by hand is the run's owner's (Cancel run's
check). Gradio-free: the watch's thread imports it.
"""

import logging
import threading
from collections import defaultdict
from dataclasses import replace

from backend.plan.jobspec import TERMINAL_STAGES
from backend.runs.access import ANONYMOUS, Refused, Visitor
from backend.runtime.records import STARTED, SWEEP_STOP
from backend.runtime.redact import redact_tokens
from backend.runtime.trainer.sweep_stops import done_rungs as ordered_rungs
from backend.view.runview import reading
from backend.view.sweep import Halving, Member, Stop, done_rungs, member_of
from panel.markdown import masked

log = logging.getLogger(__name__)
# One rung at a time per sweep in this process: two sessions watching one sweep (or a session and the background
# watch) must not both carry out a rung (the second, not yet seeing the first's stop, would halve the members left
# again).
_RULE_LOCKS: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)


def members_of(panel, run_id: str, visitor: Visitor,
               fresh: bool = False) -> tuple[dict, list[tuple[Member, object]]]:
    """The sweep's record and each member (its ranking state and view) this visitor can see, views refreshed when
    due (`fresh`: now); KeyError where `run_id` is not a sweep member this visitor sees."""
    record = panel.operations.sweep_record(run_id, visitor)
    orders = panel.operations.sweep_orders(run_id, visitor, record)
    out = []
    for tag, member_id in record["members"].items():
        try:
            view = panel.view(member_id, visitor)
        except KeyError:
            continue        # a member this visitor cannot see (another namespace's) is not shown
        if fresh:
            view.refresh()
        else:
            view.refresh_if_due()
        member = member_of(tag, member_id, view, record["settings"].get(tag))
        out.append((replace(member, ordered=tag in orders and not started_since(view, orders[tag])), view))
    return {**record, "orders": orders}, out


def started_since(view, order: dict) -> bool:
    """Whether the member's trainer obeyed its stop order and then started again (a Resume by hand): the order is
    spent. (An order written before the trainer's first start still stands: the trainer obeys it at its first step.)"""
    with reading(view):
        obeyed = [e.get("time") or 0 for e in view.events
                  if e.get("event") == SWEEP_STOP and e.get("ordered_at") == order.get("time")]
        return bool(obeyed) and any(e.get("event") == STARTED and (e.get("time") or 0) > min(obeyed)
                                    for e in view.events)


def stop_events(views) -> list[dict]:
    with_events = []
    for view in views:
        with reading(view):
            with_events += [e for e in view.events if e.get("event") == SWEEP_STOP]
    return with_events


def apply_rule(panel, visitor: Visitor, run_id: str, record: dict) -> str:
    """The sweep's stated successive halving carried out where its next rung is due: the members it stops, each
    ordered to (`stop_members`). What it did or waits for, in words ("" for a sweep stopped by hand only). Decided on
    the members, their stop events and the orders standing read afresh, one rung at a time per sweep in this
    process (and a rung a trainer or another page ordered already is not ordered again)."""
    after = record["early_stop_after"]
    if not after:
        return ""
    with _RULE_LOCKS[record["sweep_id"]]:
        record, members = members_of(panel, run_id, visitor, fresh=True)
        states = [m for m, _ in members]
        rungs = max(done_rungs(stop_events(v for _, v in members)), ordered_rungs(record["orders"]))
        rule = Halving(after)
        decision = rule.decide(states, rungs)
        if decision is None:
            return rule.waiting(states, rungs)
        return f"Rung {decision.rung} due: " + stop_members(panel, visitor, record, states, decision)


def stop_members(panel, visitor: Visitor, record: dict, members: list[Member], decision: Stop) -> str:
    """Order the members `decision` names to stop (each its stop order, which its trainer obeys); what happened."""
    by_tag = {m.tag: m for m in members}
    said = []
    for tag in decision.stopped:
        member = by_tag[tag]
        try:
            written = panel.operations.stop_member(member.run_id, visitor, record["sweep_id"], tag, decision.rule,
                                                   decision.scores, decision.rung)
        except (Refused, KeyError) as exc:
            said.append(f"{tag} not stopped: {masked(exc.args[0] if exc.args else exc)}")
            continue
        except Exception as exc:     # the Hub or the bucket failing: the member may still bill
            said.append(f"{tag} not stopped: {masked(exc)}. Try again, or Cancel run on it")
            continue
        said.append(f"stopped {tag} ({member.run_id}): its trainer ends at its next step, writing its final adapter"
                    if written else f"{tag} ({member.run_id}) has a stop order already: its trainer ends at its next "
                                    "step")
    return "; ".join(said) + "."


def apply_stated_rules(panel) -> list[str]:
    """The background watch's pass on a local panel: every live sweep with a stated early-stop rule has its next
    rung ordered where due (`apply_rule`, as the Sweep tab would; the trainers do the same on their own). What it
    did, a line per sweep that stopped members. Each sweep is looked at once a pass, through any of its live members."""
    visitor = Visitor()
    looked, said = set(), []
    for registry in panel.runs.registries(ANONYMOUS):
        for run in registry.list_runs():
            if run.run_id in looked or not run.stages or all(s in TERMINAL_STAGES for s in run.stages.values()):
                continue
            try:
                record = panel.operations.sweep_record(run.run_id, visitor)
            except KeyError:        # not a sweep member (or the fleet: no spec.json)
                looked.add(run.run_id)
                continue
            looked.update(record["members"].values())
            if not record["early_stop_after"]:
                continue
            done = apply_rule(panel, visitor, run.run_id, record)
            if done.startswith("Rung"):
                log.info("sweep %s: %s", record["sweep_id"], done)
                said.append(f"{record['sweep_id']}: {done}")
    return said


def rules_in_background(panel) -> None:
    """`apply_stated_rules` for the watch's thread: a failure is logged and tried again at the next pass."""
    try:
        apply_stated_rules(panel)
    except Exception as exc:
        log.warning("sweep early-stop check failed: %s", redact_tokens(str(exc)))
