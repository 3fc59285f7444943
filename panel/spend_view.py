"""What a run costs, as the panel shows it: the runs list's cost cell, the run header's cost line, the spend curve
behind the charts' dollars axis and the orphan finder. Plain functions over the backend, and the orphan
finder's few components (`build_orphans`)."""

import time

from backend.plan.cost import RunCost, format_duration, format_usd, spend_curve, spend_knots
from backend.runs.access import Refused, Visitor
from backend.runs.orphans import cancel_orphans, find_orphans
from backend.runtime.records import BUDGET_CAP
from backend.runtime.redact import redact_tokens
from backend.view.fleet_cost import FleetSplit
from panel import dashboard
from panel.markdown import masked

ORPHAN_HEADERS = ["job", "run", "role", "stage", "flavor", "$/h", "why"]


def cost_cell(cost: RunCost, budget: float) -> str:
    """One short cell for the runs list, coarse enough not to change every tick."""
    live = any(j.active for j in cost.jobs)
    eta = f" · ETA {_coarse(cost.eta_s)}" if live and cost.eta_s is not None else ""
    if not cost.billed:
        return f"{_coarse(cost.elapsed_s)}{eta}"
    text = format_usd(cost.spent_usd or 0.0) + ("?" if cost.unknown_flavors else "")
    if live and cost.projected_usd is not None:
        text += f" → {format_usd(cost.projected_usd)}"
    text += eta
    if budget:
        reached = (cost.spent_usd or 0) >= budget or (live and (cost.projected_usd or 0) >= budget)
        text += f" · {'⛔ ' if reached else ''}cap {format_usd(budget)}"
    return text


def cost_markdown(cost: RunCost, budget: float, events: list[dict], rule: str = "local runs cost nothing") -> str:
    """The run header's cost line, and the budget cap's verdict once the panel acted on it; `rule`: how the run's
    engine reckons cost (`Engine.cost_rule`)."""
    live = any(j.active for j in cost.jobs)
    rate = f"{cost.steps_per_s:.3g} steps/s" if cost.steps_per_s else None
    if not cost.billed:
        parts = [f"**Time:** {format_duration(cost.elapsed_s)}"]
        parts += [rate] if rate and live else []
        parts += [f"ETA {format_duration(cost.eta_s)}"] if live and cost.eta_s is not None else []
        return " · ".join(parts + ([rule] if rule else []))
    parts = [f"**Cost:** {format_usd(cost.spent_usd or 0.0)} spent"
             + (f" ({format_usd(cost.usd_per_step)}/step)" if cost.usd_per_step is not None else "")
             + (f" ({rule})" if rule else "")]
    if live:
        parts.append(f"{format_usd(cost.burn_usd_per_h)}/h now")
        if cost.projected_usd is not None:
            parts.append(f"projected {format_usd(cost.projected_usd)} at step {cost.max_steps} (ETA "
                         f"{format_duration(cost.eta_s or 0)}{', ' + rate if rate else ''})")
        else:
            parts.append("projection once a few steps are logged")
    parts.append(f"{format_duration(cost.elapsed_s)} since launch")
    if budget:
        parts.append(f"budget cap {format_usd(budget)} ({100 * (cost.spent_usd or 0) / budget:.0f}% spent)")
    lines = [" · ".join(parts)]
    if cost.unknown_flavors:
        lines.append(f"⚠️ No price known for {', '.join(cost.unknown_flavors)}: those jobs are not counted.")
    stops = [e for e in events if e.get("event") == BUDGET_CAP]
    if stops:
        last = stops[-1]
        when = time.strftime("%H:%M:%S", time.localtime(float(last.get("time") or 0)))
        lines.append(f"⛔ **Budget cap reached:** the panel cancelled {len(last.get('cancelled') or [])} job(s) "
                     f"at {when}: {masked(last.get('reason', ''))}.")
    return "\n\n".join(lines)


def budget_line(spec) -> str:
    """What the preview says about a run's budget cap."""
    return (f"Budget cap **{format_usd(spec.budget_usd)}**: the panel cancels every job of the run once its spend, or "
            f"its projected total at step {spec.max_steps}, reaches it. Whichever panel process is running enforces it "
            "(every 30 s by default, also after a restart); the job timeout stays the hard limit."
            + (f" Retried attempts (up to {spec.attempts} per job) count toward it." if spec.attempts > 1 else ""))


def run_cost(panel, run_id: str, visitor: Visitor, view=None) -> tuple[RunCost, dict, object]:
    """(cost, spec, registry) of a run this visitor reaches."""
    registry = panel.runs.find(run_id, visitor)
    cost, spec = panel.spend.cost(registry, run_id, view=view)
    return cost, spec, registry


def cost_line(panel, run_id: str, visitor: Visitor, view) -> str:
    """The run header's cost line for a run this visitor reaches; '' when its cost cannot be known now."""
    try:
        cost, spec, registry = run_cost(panel, run_id, visitor, view)
    except Exception:   # a failing price list or listing must not break the dashboard
        return ""
    stops = dashboard.shared_value(view, "budget events", lambda: [e for e in view.events
                                                                  if e.get("event") == BUDGET_CAP])
    line = cost_markdown(cost, float(spec.get("budget_usd") or 0.0), stops, registry.engine.cost_rule)
    if spec.get("fleet"):      # a sweep member on a shared fleet: its share of the fleet, by tokens
        try:
            split = panel.spend.fleets.split(registry, spec)
        except Exception:   # a failing listing or bucket: the member's own line stands
            split = None
        line = "\n\n".join(filter(None, (line, fleet_markdown(split, str(spec.get("sweep_member") or "")))))
    return line


def fleet_markdown(split: FleetSplit | None, tag: str) -> str:
    """A sweep member's share of its shared fleet, split by the tokens the replicas generated for each member
    (`backend/view/fleet_cost.py`), its own trainer, and the sweep's total (the fleet plus every member's own jobs).
    On an engine that bills nothing: the token share and the replica-seconds it stands for. '' before the split can be
    read."""
    mine = split.members.get(tag) if split is not None else None
    if mine is None:
        return ""
    fleet_cost = format_usd(split.fleet_usd or 0.0) if split.billed else f"{split.fleet_s:,.0f} replica-s"
    cap = ""
    if split.billed and split.budget_usd:
        spent = split.total_usd or 0.0
        cap = (f" · {'⛔ ' if spent >= split.budget_usd else ''}sweep budget cap {format_usd(split.budget_usd)} "
               f"({100 * spent / split.budget_usd:.0f}% spent: {format_usd(spent)}, every member and the fleet)")
    if mine.token_share is None:
        return (f"**Fleet share ({tag}):** no member has generated tokens on the shared fleet `{split.fleet_id}` yet: "
                f"its cost so far ({fleet_cost}) is split between the members by their tokens once they do{cap}.")
    total = sum(m.tokens for m in split.members.values())
    if not mine.tokens:
        head = (f"**Fleet share ({tag}):** no tokens generated for {tag} yet ({total:,} for the other members): "
                f"no share of the fleet `{split.fleet_id}` so far")
    elif split.billed:
        head = (f"**Fleet share ({tag}):** {format_usd(mine.fleet_usd or 0.0)} of the fleet's {fleet_cost}, by "
                f"tokens ({100 * mine.token_share:.0f}% of its generated tokens: {mine.tokens:,} of {total:,})")
    else:
        head = (f"**Fleet share ({tag}):** {100 * mine.token_share:.0f}% by tokens ({mine.tokens:,} of {total:,} "
                f"generated): {mine.fleet_s or 0.0:,.0f} of the fleet's {fleet_cost}")
    if split.billed:
        own = f"this trainer {format_usd(mine.own_usd or 0.0)}"
        whole = (f"sweep total {format_usd(split.total_usd or 0.0)} (fleet {fleet_cost} + "
                 f"{len(split.members)} members' trainers "
                 f"{format_usd(sum(m.own_usd or 0.0 for m in split.members.values()))})")
        whole += cap
    else:
        own = f"this trainer {mine.own_s:,.0f} s"
        whole = (f"sweep total {split.total_s:,.0f} job-s (fleet {fleet_cost} + {len(split.members)} members' "
                 f"trainers {sum(m.own_s for m in split.members.values()):,.0f} s)")
    return f"{head} · {own} · {whole}"


def cost_at(panel, registry, run_id: str):
    """The run's `cost_at(t)` for a dollars axis, or None for a run that costs nothing."""
    if not registry.engine.billed:
        return None
    return spend_curve(registry.job_records(run_id), panel.spend.prices(registry), panel.spend.clock())


def spend_corners(panel, run_id: str, visitor: Visitor) -> tuple | None:
    """The corners of the run's spend curve for the dashboard's dollars axis; None for a run that costs nothing."""
    registry = panel.runs.find(run_id, visitor)
    if not registry.engine.billed:
        return None
    return spend_knots(registry.job_records(run_id), panel.spend.prices(registry), panel.spend.clock())


def orphan_rows(panel, visitor: Visitor) -> tuple[list[list], str]:
    """Every orphan job this visitor can see, and a line saying how many (or why none could be listed)."""
    rows, problems = [], []
    registries = panel.runs.registries(visitor)
    if not registries:
        return [], panel.runs_hint(visitor) or "No runs you can see."
    for registry in registries:
        try:
            orphans = find_orphans(registry)
        except Exception as exc:   # say so: an unlisted namespace may hold billing jobs
            problems.append(f"{_where(registry)}: {masked(exc)}")
            continue
        prices = _prices(panel, registry)
        for o in orphans:
            r = o.record
            price = prices.get(r.flavor) if r.flavor else None
            rows.append([r.job_id, r.run_id, r.role, r.stage, r.flavor or "-",
                         "-" if price is None else f"{price:.2f}", o.why])
    note = (f"**{len(rows)} job(s) still running after their run ended.**" if rows
            else "No job is running after its run ended.")
    if problems:
        note += " Could not check: " + "; ".join(problems)
    return rows, note


def cancel_all_orphans(panel, visitor: Visitor) -> str:
    """Cancel every orphan found now, in each namespace the visitor may control."""
    done, refused, errors = [], [], []
    registries = panel.runs.registries(visitor)
    if not registries:
        return f"**Nothing cancelled.** {panel.runs_hint(visitor) or 'No runs you can control.'}"
    for registry in registries:
        try:
            panel.control_token(registry, visitor)
        except Refused as exc:
            if find_orphans(registry):
                refused.append(f"{_where(registry)}: {masked(exc)}")
            continue
        cancelled, failed = cancel_orphans(registry)
        done += cancelled
        errors += failed
        panel.runs.relist(registry.namespace or "")
    parts = [f"Cancel requested for {len(done)} orphan job(s)" + (f": {', '.join(done)}." if done else ".")]
    if refused:
        parts.append("Not cancelled: " + "; ".join(refused))
    if errors:
        parts.append("Could NOT cancel: " + "; ".join(errors) + " - cancel them on the Hub.")
    return redact_tokens(" ".join(parts))


def _where(registry) -> str:
    return f"HF Jobs in {registry.namespace}" if registry.namespace else "local runs"


def _prices(panel, registry) -> dict[str, float]:
    try:
        return panel.spend.prices(registry)
    except Exception:
        return {}


def _coarse(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return "<1 min"
    if seconds < 3600:
        return f"{int(seconds // 60)} min"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"


def build_orphans(panel, visitor_of) -> None:
    """The orphan finder under the runs list: list the jobs left running, cancel them all in one click."""
    import gradio as gr  # noqa: PLC0415 gradio loads slowly: cost_cell() etc. do without it
    import pandas as pd  # noqa: PLC0415 only with gradio

    with gr.Accordion("Jobs still running after their run ended", open=False, elem_id="orphans-section"):
        with gr.Row():
            find = gr.Button("Find orphan jobs", elem_id="orphans-find")
            cancel = gr.Button("Cancel them all", variant="stop", elem_id="orphans-cancel")
        note = gr.Markdown(elem_id="orphans-msg")
        table = gr.Dataframe(headers=ORPHAN_HEADERS, interactive=False, wrap=True, elem_id="orphans-table")

    def on_find(oauth_token: gr.OAuthToken | None, profile: gr.OAuthProfile | None):
        rows, message = orphan_rows(panel, visitor_of(oauth_token, profile))
        return pd.DataFrame(rows, columns=ORPHAN_HEADERS), message

    def on_cancel(oauth_token: gr.OAuthToken | None, profile: gr.OAuthProfile | None):
        visitor = visitor_of(oauth_token, profile)
        message = cancel_all_orphans(panel, visitor)
        rows, found = orphan_rows(panel, visitor)
        return pd.DataFrame(rows, columns=ORPHAN_HEADERS), f"{message}\n\n{found}"

    find.click(on_find, None, [table, note])
    cancel.click(on_cancel, None, [table, note])
