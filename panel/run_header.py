"""The run's header on its dashboard: its stage, jobs, step and reward, the best version, why it failed (at the top),
the start-up stage, alerts and warnings, the bottleneck verdict, unreadable records, how its trainer stopped (Markdown,
from a RunView)."""

import time

from backend.plan.cost import format_duration
from backend.runtime import records
from backend.runtime.best_rule import rule_text
from backend.runtime.job.cause import cause_line
from backend.runtime.redact import redact_tokens
from backend.view import diagnose
from backend.view.diagnose import ratio_alert
from backend.view.hacking import hacking_alert
from backend.view.runview import reading
from backend.view.startup import start_up
from panel.markdown import code_span, fenced, masked, plain
from panel.marks import mark

TRACEBACK_LINES = 30
MAX_CAUSE = 300


def status_markdown(view) -> str:
    spec = view.spec
    last = view.latest
    degraded = " · " + mark("warning", view.degraded) if view.degraded else ""
    parts = [f"### Run {code_span(view.run_id)} — **{view.stage}**{degraded}"]
    retries = getattr(view, "retries", None)    # a RunView's; a summary-only view has none
    if retries:
        parts.append(mark("retried", " · ".join(retries)))
    cause = failure_cause(view)
    if cause:
        parts.append(cause)
    jobs = " · ".join(f"{masked(role)}: {masked(job.status.stage)}"
                      + (f" ({masked(job.status.message)})" if job.status.message else "")
                      for role, job in sorted(view.jobs.items()))
    parts.append(jobs)
    engine = view.engine
    if engine:
        parts.append(f"Generation engine: **{engine}**")
    if spec:
        step = last.get("step", 0)
        parts.append(f"{masked(spec.get('mode'))} · model {code_span(spec.get('model'))} · step {masked(step)}/"
                     f"{masked(spec.get('max_steps'))}"
                     + (f" · reward {last['reward']:.3f}" if isinstance(last.get("reward"), (int, float)) else "")
                     + f" · {len(view.adapters)} adapter version(s)" + best_line(view)
                     + (" · **final adapter ready**" if view.final_files else ""))
    elif getattr(view, "fleet", None):
        parts.append(fleet_line(view.fleet))
    failure = getattr(view, "history_failure", "")
    if view.history_pending:
        first = f" before step {int(view.table.steps[0])}" if len(view.table) else ""
        parts.append(mark("warning", f"Could not read the run's earlier history{first} ({redact_tokens(failure)}): "
                          "trying again; the charts lack those steps meanwhile.") if failure else
                     mark("waiting", f"Reading the run's earlier history{first} in the background: the charts fill in "
                          "shortly."))
    live = {} if view.done else view.open_alerts     # an ended run has no live alert left, whatever was recorded
    for alert in sorted(live.values(), key=lambda a: a.get("time", 0)):
        when = time.strftime("%H:%M:%S", time.localtime(alert.get("time", 0)))
        kind = masked(alert.get("kind", "alert"))
        parts.append(mark("warning", f"Alert: **{kind}** since {when}: {masked(alert.get('message'))}"))
    # What the metrics themselves show, recorded by no panel yet or left by a run that ended: say it anyway.
    shown = {alert.get("kind") for alert in live.values()}
    rows = view.table.rows(last=diagnose.NO_SIGNAL_STEPS)
    for finding in (hacking_alert(view), ratio_alert(rows[-5:]), diagnose.no_signal_alert(rows, view.spec)):
        if finding and finding.kind not in shown:
            parts.append(f"{mark('warning', 'Warning:')} **{finding.message}**")
    verdict = diagnose.view_verdict(view)
    if verdict.kind not in ("unknown",):
        parts.append(f"**Bottleneck:** {verdict.line}" + (f" {verdict.advice}" if verdict.advice else ""))
    unreadable = view.unreadable
    if unreadable:
        total = sum(unreadable.values())
        files = ", ".join(f"{code_span(path)}: {n}" for path, n in sorted(unreadable.items()))
        parts.append(f"{mark('warning', str(total))} unreadable record{'s' if total != 1 else ''} skipped ({files})")
    parts += end_lines(view)
    return "\n\n".join(parts)


def fleet_line(fleet: dict) -> str:
    """What a sweep's shared fleet is (its fleet.json; it has no spec): 'Shared vLLM fleet of sweep `sweep-x` · 3
    members: m0, m1, m2 · 9 adapter slots (--max-loras) · LoRA rank up to 8'."""
    members = fleet.get("members") if isinstance(fleet.get("members"), dict) else {}
    parts = [f"Shared vLLM fleet of sweep {code_span(fleet.get('sweep_id') or '?')}",
             f"{len(members)} member(s): {', '.join(masked(tag) for tag in sorted(members))}" if members else ""]
    if isinstance(fleet.get("max_loras"), int):
        parts.append(f"{fleet['max_loras']} adapter slots (`--max-loras`)")
    if isinstance(fleet.get("max_lora_rank"), int):
        parts.append(f"LoRA rank up to {fleet['max_lora_rank']}")
    return " · ".join(part for part in parts if part)


def titled(status: str, name: str) -> str:
    """The header (`status_markdown`) headed by the run's name, as its owner called it: '### math-lr · Run `id` —
    **RUNNING**'. The name is the visitor's text: shown as itself."""
    head = "### "
    if not name or not status.startswith(head):
        return status
    return f"{head}{plain(name)} · {status[len(head):]}"


def start_up_line(view, now: float | None = None) -> str:
    """'◌ Starting: **building the model** for 12 s' while the run starts (`startup.start_up`), else ''. The time
    since launch is the cost line's beside it (one clock: the run's jobs' creation, `plan.cost.run_cost`), not said
    twice from two sources. Time passes: the live update sends it again each tick, apart from the frame."""
    with reading(view):     # a refresh meanwhile appends to the events and logs read here
        stage = start_up(view)
    if stage is None:
        return ""
    now = time.time() if now is None else now
    took = f" for {format_duration(now - stage.since)}" if stage.since else ""
    return mark("waiting", f"Starting: **{stage.stage}**{took}")


def best_line(view) -> str:
    """' · best trl-policy-v7 (held-out 0.412 ± 0.050) by <the rule>, base model 0.100' once a version was
    evaluated; ' · no version beats the base model ...' when none does; else ''."""
    held = getattr(view, "held_out", None)
    if held is None or not held.scores:
        return ""
    rule = rule_text(held.rule)
    base = f", base model (v0) {held.baseline:.3f}" if held.baseline is not None else ""
    if held.none_beats_base:
        return f" · **no version beats the base model** by {rule}{base}: none is starred"
    best = held.best_version
    if best is None:
        return ""
    # (not read yet on a first look at a long run: best.json's score then, which `score_text` reads)
    return f" · best **{held.adapter_name(best)}** (held-out {held.score_text(best)}) by {rule}{base}"


def failure_cause(view) -> str:
    """Why the run failed, in one line of Markdown for the top of the header (`failure_parts`), or ''."""
    found = failure_parts(view)
    if found is None:
        return ""
    what, line = found
    return f"{mark('failed', 'Failed:')} **{masked(what)}**" + (f" — {code_span(line)}" if line else "")


def failure_text(view) -> str:
    """Why the run failed, as plain text (for an agent), or ''."""
    found = failure_parts(view)
    return "" if found is None else found[0] + (f" — {found[1]}" if found[1] else "")


def failure_parts(view) -> tuple[str, str] | None:
    """(why the run failed, the log line that says more or ''), masked, or None: a failed launch's cause (what it
    had started was cancelled), the trainer's own error when it recorded one, else the job status of the first
    failing job with the line of its log that says why."""
    launch = getattr(view, "launch_failure", None)     # a RunView's; a stand-in view may have none
    if launch is not None:
        return "the launch failed: " + redact_tokens(str(launch.get("message") or "no reason recorded")), ""
    last = view.trainer_end
    if last.get("event") == records.FAILED:
        return redact_tokens(str(last.get("error", "the trainer failed"))), ""
    failing = sorted((role != "trainer", role, job) for role, job in view.current_jobs.items()
                     if job.status.stage == "ERROR")
    if not failing or (last.get("event") == records.FINISHED and failing[0][1] == "trainer"):
        return None
    _, role, job = failing[0]
    status = redact_tokens(job.status.message or "the job failed")
    line = cause_line(job.logs)
    shown = redact_tokens(line)[:MAX_CAUSE] if line and line not in status else ""
    return f"{role}: {status}", shown


def end_lines(view) -> list[str]:
    """How the current launch's trainer stopped, below the charts' summary: the end of a failed trainer's
    traceback (a failing reward's own frames last), or why it was cancelled. The cause itself is at the top."""
    last = view.trainer_end
    if last.get("event") == records.FAILED:
        if last.get("code_traceback") or last.get("traceback"):
            return [traceback_block(last.get("code_traceback") or last["traceback"])]
        return []
    if last.get("event") == records.CANCELED:
        return [mark("stopped", f"Stopped: {masked(last.get('error', 'the trainer was stopped'))}")]
    return []


def traceback_block(text: str, lines: int = TRACEBACK_LINES) -> str:
    """The end of a failed trainer's traceback (a failing reward's own frames come last), masked, in a code block."""
    return fenced("\n".join(redact_tokens(str(text)).rstrip().splitlines()[-lines:]))
