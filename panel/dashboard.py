"""One dashboard frame from a RunView: status text, figures, tables. No Gradio here.

A frame is built once per (run, view version, chart options) and shared by every session watching the run:
each component carries its value serialised once and a digest, so a session sends only what changed since it
last drew, and a tick of ten sessions costs about one frame.
"""

import hashlib
import threading
import time
import weakref
from dataclasses import dataclass, field

from backend import diagnose
from backend.diagnose import ratio_alert
from backend.runtime.redact import redact_tokens
from panel import charts

LOG_TAIL = 400
TRACEBACK_LINES = 30
ADAPTER_PAGE = 50          # the adapters table shows the newest versions; the count of all is in the header
PLOTS = ("reward", "staleness", "utilisation", "memory", "kl", "length", "throughput", "timing", "optimisation",
         "learning_rate", "ratio")


@dataclass
class Frame:
    """What the dashboard shows: plots as plotly JSON strings, the status as markdown, tables as rows."""

    values: dict = field(default_factory=dict)     # component -> value
    digests: dict = field(default_factory=dict)    # component -> digest of its value

    def __getattr__(self, name):
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None


def build_frame(view, options: charts.ChartOptions | None = None) -> Frame:
    """Every component of the dashboard for `view` (built from its bounded series: the cost does not grow with
    the run's length)."""
    options = options or charts.ChartOptions(t0=run_start(view))
    table = view.table
    usages = {role: job.usage for role, job in view.current_jobs.items()}
    values = {
        "status": status_markdown(view),
        "reward": charts.reward_figure(table, options),
        "staleness": charts.staleness_figure(table, options),
        "utilisation": charts.utilisation_figure(usages, options),
        "memory": charts.memory_figure(usages, options),
        "kl": charts.kl_figure(table, options),
        "length": charts.length_figure(table, options),
        "throughput": charts.throughput_figure(table, options),
        "timing": charts.timing_figure(table, options),
        "optimisation": charts.optimisation_figure(table, options),
        "learning_rate": charts.learning_rate_figure(table, options),
        "ratio": charts.ratio_figure(table, options),
        "adapters": adapter_rows(view),
        "replicas": replica_rows(view),
    }
    for name in PLOTS:
        values[name] = charts.plot_json(values[name])
    return Frame(values, {k: _digest(v) for k, v in values.items()})


def _digest(value) -> str:
    return hashlib.blake2b(repr(value).encode(), digest_size=8).hexdigest()


def run_start(view) -> float:
    """When the run started, for wall-time axes: its spec's creation, else its first logged step."""
    created = view.spec.get("created_at")
    if isinstance(created, (int, float)) and created > 0:
        return float(created)
    return float(view.table.times[0]) if len(view.table) else 0.0


_frames: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_frames_lock = threading.Lock()


def shared_frame(view, options: charts.ChartOptions | None = None) -> Frame:
    """The frame of `view` at its current version, built once for every session that asks (thread-safe)."""
    options = options or charts.ChartOptions(t0=run_start(view))
    key = (view.version, options)
    with _frames_lock:
        slot = _frames.setdefault(view, {"lock": threading.Lock(), "frames": {}})
    with slot["lock"]:                   # a second session asking meanwhile waits for this build
        frames = slot["frames"]
        if key not in frames:
            if len(frames) > 8:          # versions move on: keep the newest few option sets only
                frames.clear()
            frames[key] = build_frame(view, options)
        return frames[key]


def status_markdown(view) -> str:
    spec = view.spec
    last = view.latest
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
    for alert in sorted(view.open_alerts.values(), key=lambda a: a.get("time", 0)):
        when = time.strftime("%H:%M:%S", time.localtime(alert.get("time", 0)))
        parts.append(f"🔔 **{alert.get('kind', 'alert')}** since {when}: {redact_tokens(str(alert.get('message')))}")
    if not view.open_alerts:     # no panel has recorded it yet: say it anyway
        drift = ratio_alert(view.table.rows(last=5))
        if drift:
            parts.append(f"⚠️ **{drift.message}**")
    verdict = diagnose.verdict(view.table.rows(last=diagnose.WINDOW), view.spec)
    if verdict.kind not in ("unknown",):
        parts.append(f"**Bottleneck:** {verdict.line}" + (f" {verdict.advice}" if verdict.advice else ""))
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
    last = view.trainer_end
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


def adapter_rows(view, page: int = ADAPTER_PAGE) -> list[list]:
    """The newest `page` versions: version, step, published at, size (MB), registered on replicas, note
    (superseded by a resume)."""
    registered = _registered_adapters(view)
    first_step = view.first_step
    rows = []
    for v in view.newest_adapters(page):
        on = ", ".join(r for r, names in registered.items() if v.name in names) or "-"
        step = v.step if v.step is not None else first_step.get(v.version, "-")
        note = (f"superseded: the run resumed from step {view.superseded[v.name]}"
                if v.name in view.superseded else "")
        rows.append([v.name, step, time.strftime("%H:%M:%S", time.localtime(v.time)),
                     round(v.size_bytes / 1e6, 3), on, note])
    return rows


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
