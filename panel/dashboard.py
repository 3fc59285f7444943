"""One dashboard frame from a RunView: status text, figures, tables and the log tail. No Gradio here."""

import time
from dataclasses import dataclass

import plotly.graph_objects as go

from backend.runtime.redact import redact_tokens
from panel import charts

LOG_TAIL = 400
TRACEBACK_LINES = 30


@dataclass
class Frame:
    status: str
    reward: go.Figure
    staleness: go.Figure
    utilisation: go.Figure
    memory: go.Figure
    kl: go.Figure
    length: go.Figure
    ratio: go.Figure
    adapters: list[list]
    replicas: list[list]


def build_frame(view) -> Frame:
    m = view.metrics
    resources = {role: job.resources for role, job in view.jobs.items()}
    return Frame(
        status=status_markdown(view),
        reward=charts.reward_figure(m),
        staleness=charts.staleness_figure(m),
        utilisation=charts.utilisation_figure(resources),
        memory=charts.memory_figure(resources),
        kl=charts.lines_figure(m, {"kl": "KL", "entropy": "entropy"}, "KL and entropy", "nats"),
        length=charts.throughput_figure(m),
        ratio=charts.ratio_figure(m),
        adapters=adapter_rows(view),
        replicas=replica_rows(view),
    )


def status_markdown(view) -> str:
    spec = view.spec
    last = view.metrics[-1] if view.metrics else {}
    degraded = f" · ⚠️ {view.degraded}" if view.degraded else ""
    parts = [f"### Run `{view.run_id}` — **{view.stage}**{degraded}"]
    jobs = " · ".join(f"{role}: {job.status.stage}" + (f" ({job.status.message})" if job.status.message else "")
                      for role, job in sorted(view.jobs.items()))
    parts.append(jobs)
    engine = view.engine
    if engine:
        parts.append(f"Generation engine: **{engine}**")
    if spec:
        step = last.get("step", 0)
        parts.append(f"{spec.get('mode')} · model `{spec.get('model')}` · step {step}/{spec.get('max_steps')}"
                     + (f" · reward {last['reward']:.3f}" if isinstance(last.get("reward"), (int, float)) else "")
                     + f" · {len(view.adapters)} adapter version(s)"
                     + (" · **final adapter ready**" if view.final_files else ""))
    warning = charts.ratio_warning(view.metrics)
    if warning:
        parts.append(f"⚠️ **{warning}**")
    unreadable = view.unreadable
    if unreadable:
        total = sum(unreadable.values())
        files = ", ".join(f"`{path}`: {n}" for path, n in sorted(unreadable.items()))
        parts.append(f"⚠️ {total} unreadable record{'s' if total != 1 else ''} skipped ({files})")
    parts += end_lines(view)
    return "\n\n".join(parts)


def end_lines(view) -> list[str]:
    """Why the current attempt's trainer stopped, if it failed or was cancelled: its event (with the end of its
    traceback, a failing reward's own frames last), else its job's status (a trainer that was killed, or could
    not write to the bucket, records no event)."""
    ends = [e for e in view.events if e.get("writer") == "trainer"
            and e.get("event") in ("started", "finished", "failed", "canceled")]
    last = ends[-1] if ends else {}
    if last.get("event") == "failed":
        lines = [f"❌ **{redact_tokens(str(last.get('error', 'the trainer failed')))}**"]
        if last.get("code_traceback") or last.get("traceback"):
            lines.append(traceback_block(last.get("code_traceback") or last["traceback"]))
        return lines
    if last.get("event") == "canceled":
        return [f"⏹ {redact_tokens(str(last.get('error', 'the trainer was stopped')))}"]
    trainer = view.current_jobs.get("trainer")
    if trainer is not None and trainer.status.stage == "ERROR" and last.get("event") != "finished":
        return [f"❌ **trainer: {redact_tokens(trainer.status.message or 'the job failed')}**"]
    return []


def traceback_block(text: str, lines: int = TRACEBACK_LINES) -> str:
    """The end of a failed trainer's traceback (a failing reward's own frames come last), masked, in a code block."""
    tail = "\n".join(redact_tokens(str(text)).rstrip().splitlines()[-lines:])
    return "```text\n" + tail.replace("```", "'''") + "\n```"


def adapter_rows(view) -> list[list]:
    """version, step, published at, size (MB), registered on replicas, note (superseded by a resume)."""
    registered = _registered_adapters(view)
    first_step = _first_step_per_policy_version(view.metrics)
    rows = []
    for v in sorted(view.adapters.values(), key=lambda a: a.version, reverse=True):
        on = ", ".join(r for r, names in registered.items() if v.name in names) or "-"
        step = v.step if v.step is not None else first_step.get(v.version, "-")
        note = (f"superseded: the run resumed from step {view.superseded[v.name]}"
                if v.name in view.superseded else "")
        rows.append([v.name, step, time.strftime("%H:%M:%S", time.localtime(v.time)),
                     round(v.size_bytes / 1e6, 3), on, note])
    return rows


def _first_step_per_policy_version(records: list[dict]) -> dict[int, int]:
    """Async runs log the policy version each step trained with; a version's step is the first such step."""
    first: dict[int, int] = {}
    for r in records:
        if isinstance(r.get("policy_version"), int):
            first.setdefault(r["policy_version"], r["step"])
    return first


def _replicas(view) -> list[tuple[dict, str | None]]:
    """The proxy's latest snapshot of each replica, with why it is down when its job has ended (replica i is
    the job `vllm-i`: the trainer's proxy lists the replicas in that order)."""
    if not view.replica_stats:
        return []
    jobs = view.current_jobs
    out = []
    for i, r in enumerate(view.replica_stats[-1].get("replicas", [])):
        job = jobs.get(f"vllm-{i}")
        ended = job is not None and job.status.done
        out.append((r, f"DOWN (job {job.status.stage})" if ended else None))
    return out


def _registered_adapters(view) -> dict[str, list[str]]:
    # A replica that is down serves nothing, whatever its last snapshot held.
    return {r.get("url", f"replica-{i}"): r.get("adapters", []) if r.get("healthy") and not down else []
            for i, (r, down) in enumerate(_replicas(view))}


def replica_rows(view) -> list[list]:
    rows = []
    for r, down in _replicas(view):
        healthy = r.get("healthy") and not down
        rows.append([r.get("url"), "up" if healthy else (down or "DOWN"), r.get("in_flight"), r.get("served"),
                     r.get("errors"), ", ".join(r.get("adapters", [])) if healthy else ""])
    return rows


def log_text(view, role: str | None, query: str = "", tail: int = LOG_TAIL) -> str:
    """The last `tail` lines of a job's log, keeping only lines that contain `query` (case-insensitive)."""
    job = view.jobs.get(role) if role else None
    if job is None:
        job = view.jobs.get("trainer") or next(iter(view.jobs.values()), None)
    if job is None:
        return ""
    lines = list(job.logs)
    if query:
        q = query.lower()
        lines = [line for line in lines if q in line.lower()]
    return "\n".join(lines[-tail:])
