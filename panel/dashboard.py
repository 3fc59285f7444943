"""One dashboard frame from a RunView: status text, figures, tables. No Gradio here.

A frame is built once per (run, view version, chart options) and shared by every session watching the run:
each component carries its value serialised once and a digest, so a session sends only what changed since it
last drew, and a tick of ten sessions costs about one frame.
"""

import hashlib
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

from backend.outcome.best_version import default_choice, version_choices
from backend.outcome.try_it import try_choices
from backend.plan.cost import format_duration
from backend.runtime import records
from backend.runtime.best_rule import rule_text
from backend.runtime.job.cause import cause_line
from backend.runtime.redact import redact_tokens
from backend.runtime.serving.canary import SERVING_TOLERANCE
from backend.view import diagnose
from backend.view.axes import run_start
from backend.view.diagnose import ratio_alert
from backend.view.hacking import hacking_alert
from backend.view.runview import reading, replica_counts
from backend.view.servers import latest_servers, server_name, server_role, view_servers_per_job
from backend.view.startup import start_up
from panel import charts
from panel.markdown import code_span, fenced, masked, plain
from panel.marks import mark

LOG_TAIL = 400
TRACEBACK_LINES = 30
MAX_CAUSE = 300
ADAPTER_PAGE = 50          # the adapters table shows the newest versions; the count of all is in the header
SAMPLE_STEPS = 100         # the sample step picker offers the newest steps

def _usages(view) -> dict:
    return {role: job.usage for role, job in view.current_jobs.items()}


# Every chart of the dashboard, in the order the page shows them (two a row): name -> (element id, its figure from
# the view and the chart options). Learning first, then the questions of a slow or off run: off-policy health,
# trainer vs generation, queue, sync, resources. Adding a chart is one entry here (and its figure in charts.py).
CHARTS: dict[str, tuple[str, Callable]] = {
    "reward": ("reward-plot", lambda view, o: charts.reward_figure(view.table, o)),
    "heldout": ("heldout-plot", lambda view, o: charts.heldout_figure(view.held_out.chart_records(), view.table, o,
                                                                         view.spec, view.held_out.best_version,
                                                                         view.held_out.rule)),
    "kl": ("kl-plot", lambda view, o: charts.kl_figure(view.table, o)),
    "staleness": ("staleness-plot", lambda view, o: charts.staleness_figure(view.table, o, view.spec)),
    "ratio": ("ratio-plot", lambda view, o: charts.ratio_figure(view.table, o)),
    "timing": ("timing-plot", lambda view, o: charts.timing_figure(view.table, o)),
    "queue": ("queue-plot", lambda view, o: charts.queue_figure(view.table, o, view.spec)),
    "sync": ("sync-plot", lambda view, o: charts.sync_figure(view.table, o, view.spec, view.adapter_loads,
                                                             view.first_step)),
    "throughput": ("throughput-plot", lambda view, o: charts.throughput_figure(view.table, o)),
    "utilisation": ("util-plot", lambda view, o: charts.utilisation_figure(_usages(view), o)),
    "memory": ("memory-plot", lambda view, o: charts.memory_figure(_usages(view), o)),
    "length": ("length-plot", lambda view, o: charts.length_figure(view.table, o)),
    "optimisation": ("optimisation-plot", lambda view, o: charts.optimisation_figure(view.table, o)),
    "learning_rate": ("lr-plot", lambda view, o: charts.learning_rate_figure(view.table, o)),
}
PLOTS = tuple(CHARTS)
# The chart that shows what bounds a distributed run (`diagnose.view_verdict`'s kind), drawn again among the key charts.
BOTTLENECK_CHARTS = {"sync-bound": "sync", "generation-bound": "queue", "trainer-bound": "timing"}


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
    the run's length): the charts, the status, the adapter and replica tables, the verdict's change (None: no
    change to suggest), the steps with samples, the job roles (the log's picker) and the spec (once read)."""
    options = options or charts.ChartOptions(t0=run_start(view))
    with reading(view):     # a refresh or a history join meanwhile would change the tables being drawn
        values = {name: charts.plot_json(figure(view, options)) for name, (_, figure) in CHARTS.items()}
        values["bottleneck"] = bottleneck_chart(view, options)
        values.update(status=status_markdown(view), adapters=adapter_table(view), replicas=replica_rows(view),
                      change=diagnose.view_verdict(view).change,
                      sample_steps=sample_steps(view)[:SAMPLE_STEPS], sample_prompt=sample_prompts(view),
                      version_pick={"choices": version_choices(view), "value": default_choice(view)},
                      try_picks=try_choices(view), roles=sorted(view.jobs))
        if view.spec:       # before spec.json is read, the config shown stays as it was
            values["config"] = view.spec
    return Frame(values, {k: digest(v) for k, v in values.items()})


def bottleneck_chart(view, options: charts.ChartOptions) -> str | None:
    """The chart of what bounds the run, titled with the verdict, for the key charts' row; None when nothing does
    (a colocated run, a healthy one, too few steps): the row then holds the reward and held-out charts alone."""
    name = BOTTLENECK_CHARTS.get(diagnose.view_verdict(view).kind)
    if name is None:
        return None
    fig = CHARTS[name][1](view, options)
    title = fig["layout"]["title"]["text"]     # its numbers are in the header's verdict: the chart's name will do
    fig["layout"]["title"]["text"] = f"Bottleneck: {title.split(' (', 1)[0]}"
    return charts.plot_json(fig)


def digest(value) -> str:
    """A short digest of a component's value: equal values, equal digests."""
    return hashlib.blake2b(repr(value).encode(), digest_size=8).hexdigest()


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


def shared_value(view, key, make: Callable):
    """`make()` once per version of `view` and `key`, for every session that asks (thread-safe): what each session
    would otherwise build alike (its samples table, the budget events of its cost line)."""
    with _frames_lock:
        slot = _frames.setdefault(view, {"lock": threading.Lock(), "frames": {}})
    with slot["lock"]:
        values = slot.setdefault("values", {})
        if values.get(None) != view.version:
            values.clear()
            values[None] = view.version
        if key not in values:
            values[key] = make()
        return values[key]


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
    """How the current attempt's trainer stopped, below the charts' summary: the end of a failed trainer's
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


# The held-out score (★ on the best) stands next to the version's name: on a phone's width the table shows its first
# two columns, and the star must be among them.
ADAPTER_HEADERS = ["adapter", "held-out score", "step", "published", "size (MB)", "on replicas", "note"]
BEST_MARK = "★ best"
DECIDES = " ◆"      # marks the held-out column(s) that decide the best version


def held_out_names(view) -> list[str]:
    """Every reward scored on the held-out set, trained ones first, as the newest record lists them."""
    held = getattr(view, "held_out", None)
    if held is None or not held.scores:
        return []
    newest = held.scores[held.span[1]]
    return sorted(newest.rewards, key=lambda n: (newest.rewards[n].get("weight") == 0, list(newest.rewards).index(n)))


def adapter_headers(view) -> list[str]:
    """The adapters table's columns: a version's name and held-out score, its facts, then each held-out reward
    (trained ×weight, or monitor-only); the column(s) that decide the best version marked ◆."""
    held = getattr(view, "held_out", None)
    rule = held.rule if held is not None else {}
    # The held-out score column is the score under the rule in force: it decides, whatever the rule.
    heads = [ADAPTER_HEADERS[0], ADAPTER_HEADERS[1] + DECIDES, *ADAPTER_HEADERS[2:-1]]
    heads += [ADAPTER_HEADERS[-1]] if _notes_shown(view) else []
    newest = held.scores[held.span[1]].rewards if held is not None and held.scores else {}
    for name in held_out_names(view):
        weight = newest[name].get("weight")
        kind = "monitor" if weight == 0 else f"×{weight:g}" if isinstance(weight, (int, float)) else "trained"
        heads.append(f"{name} ({kind})" + (DECIDES if name in rule else ""))
    return heads


def adapter_table(view, page: int = ADAPTER_PAGE) -> dict:
    """The adapters table as Gradio's Dataframe takes it: its headers (they name the run's rewards) and rows."""
    return {"headers": adapter_headers(view), "data": adapter_rows(view, page)}


def adapter_rows(view, page: int = ADAPTER_PAGE) -> list[list]:
    """The newest `page` versions: version, held-out score (the best's starred first, so a narrow table shows the
    star), step, published at, size (MB), registered on replicas, note (superseded by a resume), each held-out
    reward's mean; last, the base model (version 0) where it was evaluated: the baseline."""
    registered = _registered_adapters(view)
    first_step = view.first_step
    held = getattr(view, "held_out", None)
    scores, best = (held.scores, held.best_version) if held is not None else ({}, None)
    names = held_out_names(view)
    rows = []
    notes = _notes_shown(view)
    for v in view.newest_adapters(page):
        on = ", ".join(r for r, names_on in registered.items() if v.name in names_on) or "-"
        step = v.step if v.step is not None else first_step.get(v.version, "-")
        note = (f"superseded: the run resumed from step {view.superseded[v.name]}"
                if v.name in view.superseded else "")
        score = (f"{BEST_MARK} " if v.version == best else "") + held_score(held, v.version)
        rows.append([v.name, score, step, time.strftime("%H:%M:%S", time.localtime(v.time)),
                     round(v.size_bytes / 1e6, 3), on, *([note] if notes else []),
                     *_reward_cells(scores.get(v.version), names)])
    if 0 in scores:
        name = "base model (v0)" + (": no version beats it" if held.none_beats_base else "")
        rows.append([name, held_score(held, 0), 0, "-", "-", "-", *(["the baseline"] if notes else []),
                     *_reward_cells(scores[0], names)])
    return rows


def _notes_shown(view) -> bool:
    """Whether the table has a note column: only a resumed run's superseded versions have notes, and an empty
    column would take a fifth of the width from the held-out reward columns at 1440 px."""
    return bool(getattr(view, "superseded", None))


def held_score(held, version: int) -> str:
    """A version's held-out score in the table: under the run's rule, as the header and the picker say it."""
    return held.score_text(version) if held is not None and version in held.scores else "-"


def _reward_cells(score, names: list[str]) -> list:
    out = []
    for name in names:
        stat = score.rewards.get(name) if score is not None else None
        mean = stat.get("mean") if isinstance(stat, dict) else None
        out.append(round(float(mean), 3) if isinstance(mean, (int, float)) else "-")
    return out


def _replicas(view) -> list[tuple[str, dict, str | None]]:
    """The proxy's latest snapshot of each vLLM server, named by its replica job (server i of the proxy's list runs
    in job `vllm-i`, or with several servers a job, in `vllm-<i // per job>`), with why it is down when its job has
    ended."""
    servers = latest_servers(view)
    if not servers:
        return []
    jobs = view.current_jobs
    per_job = view_servers_per_job(view)
    out = []
    for i, r in enumerate(servers):
        job = jobs.get(server_role(i, per_job))
        if job is None or not job.status.done:
            out.append((server_name(i, per_job), r, None))
            continue
        # A replica stops by itself when the trainer has finished: that is no fault, so it is not DOWN.
        out.append((server_name(i, per_job), r,
                    f"{'stopped' if job.status.stage == 'COMPLETED' else 'DOWN'} (job {job.status.stage})"))
    return out


def _registered_adapters(view) -> dict[str, list[str]]:
    # A replica that is down serves nothing, whatever its last snapshot held.
    return {name: r.get("adapters", []) if r.get("healthy") and not down else []
            for name, r, down in _replicas(view)}


def replica_rows(view) -> list[list]:
    """One row per vLLM server: its name, health, load, adapters, the proof that it serves the newest version (the
    proxy's canary: listed and answering for vN, with logprobs that differ from the base model's), its generated
    tokens a second and its API process's CPU (a core's worth bounds a server), its history over the run
    (restarts, disconnects, canary misses: each what it is), its URL."""
    proofs = {p.get("url"): p for p in (view.serving or {}).get("replicas", [])}
    version = (view.serving or {}).get("version")
    rows = []
    for name, r, down in _replicas(view):
        healthy = r.get("healthy") and not down
        rows.append([name, "up" if healthy else (down or "DOWN"), r.get("in_flight"), r.get("served"),
                     r.get("errors"), ", ".join(r.get("adapters", [])) if healthy else "",
                     proof_cell(version, proofs.get(r.get("url"))), _rate(r.get("gen_tok_s"), healthy),
                     _rate(r.get("api_cpu"), healthy), history_cell(r), r.get("url")])
    return rows


def history_cell(r: dict) -> str:
    """'restarted 1x · came back 2x · missed the canary 3x', or '-': each kind of trouble counted as itself."""
    restarted, reconnected, missed = replica_counts(r)
    parts = [f"{label} {n}x" for label, n in (("restarted", restarted), ("came back", reconnected),
                                                ("missed the canary", missed)) if n]
    return " · ".join(parts) or "-"


def _rate(value, healthy: bool):
    return value if healthy and isinstance(value, (int, float)) else "-"


def proof_cell(version: str | None, proof: dict | None) -> str:
    """'serves trl-policy-v17: yes · differs from base: yes', or what the canary found instead."""
    if not version or proof is None:
        return "-"
    if proof.get("error"):
        return f"canary failed: {redact_tokens(str(proof['error']))}"
    serves = proof.get("listed") and proof.get("served") == version
    differs = (proof.get("delta_base") or 0) > SERVING_TOLERANCE
    return f"serves {version}: {'yes' if serves else 'NO'} · differs from base: {'yes' if differs else 'NO'}"


SAMPLE_HEADERS = ["step", "version", "prompt", "completion", "rewards", "advantage", "length", "truncated"]


def sample_steps(view) -> list[int]:
    """The steps the trainer wrote samples of, newest first."""
    return sorted({int(s["step"]) for s in view.samples if isinstance(s.get("step"), (int, float))}, reverse=True)


HELD_OUT_KEY, TRAINING_KEY = "held-out:", "training:"
PROMPTS_FOLLOWED = 50      # prompts of each kind the follow picker offers


def prompt_key(prompt: str) -> str:
    """A training prompt's key in the follow picker (the text itself can be long)."""
    return TRAINING_KEY + hashlib.blake2b(prompt.encode(), digest_size=8).hexdigest()


def _head(text: str, chars: int = 60) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= chars else line[:chars - 1] + "…"


def sample_prompts(view, limit: int = PROMPTS_FOLLOWED) -> list[tuple[str, str]]:
    """(label, key) of the prompts the samples view can follow across steps and versions: the held-out prompts by
    their stable index (one row per evaluated version), and training prompts written at two steps or more."""
    held = getattr(view, "held_out", None)
    indices: dict[int, str] = {}
    for samples in (held.samples.values() if held is not None else ()):
        for s in samples:
            indices.setdefault(s["prompt_index"], str(s.get("prompt", "")))
    out = [(f"held-out #{i}: {_head(indices[i])}", f"{HELD_OUT_KEY}{i}") for i in sorted(indices)[:limit]]
    steps: dict[str, set] = {}
    for s in view.samples:
        if isinstance(s.get("prompt"), str):
            steps.setdefault(s["prompt"], set()).add(s.get("step"))
    repeated = [p for p, seen in steps.items() if len(seen) >= 2][:limit]
    return out + [(f"training: {_head(p)}", prompt_key(p)) for p in repeated]


def _sample_row(s: dict, version) -> list:
    rewards = " · ".join(f"{k.split('/', 1)[-1]} {v:.3g}" for k, v in (s.get("rewards") or {}).items()
                         if isinstance(v, (int, float)))
    advantage = s.get("advantage")
    return [s.get("step"), version, s.get("prompt", ""), s.get("completion", ""), rewards,
            "-" if not isinstance(advantage, (int, float)) else round(float(advantage), 3), s.get("length") or "-",
            {True: "yes", False: "no"}.get(s.get("truncated"), "-")]


def sample_rows(view, step: int | str | None = "latest", follow: str | None = None) -> list[list]:
    """What the policy wrote at `step` ("latest": the newest step with samples): prompt, completion, each
    reward, advantage, length in tokens and whether it hit the completion limit. With `follow` (a key of
    `sample_prompts`), one prompt across steps and versions instead, oldest first."""
    if follow:
        return followed_rows(view, str(follow))
    steps = sample_steps(view)
    if not steps:
        return []
    try:
        chosen = steps[0] if step in (None, "", "latest") else int(step)
    except (TypeError, ValueError):     # a value typed into the picker that is no step
        return []
    return [_sample_row(s, s.get("policy_version") if s.get("policy_version") is not None else "-")
            for s in view.samples if s.get("step") == chosen]


def followed_rows(view, key: str) -> list[list]:
    """One prompt's rows across steps and versions: a held-out prompt's answer by each evaluated version, or a
    training prompt's samples at each step it was drawn. An unknown key has no rows."""
    if key.startswith(HELD_OUT_KEY):
        held = getattr(view, "held_out", None)
        index = key[len(HELD_OUT_KEY):]
        if held is None or not index.isdigit():
            return []
        rows = []
        for version in sorted(held.samples):
            score = held.scores.get(version)
            for s in held.samples[version]:
                if s["prompt_index"] == int(index):
                    rows.append(_sample_row({**s, "step": score.step if score else "-"}, f"{version} (held-out)"))
        return rows
    matching = [s for s in view.samples if isinstance(s.get("prompt"), str) and prompt_key(s["prompt"]) == key]
    matching.sort(key=lambda s: s.get("step") if isinstance(s.get("step"), (int, float)) else -1)
    return [_sample_row(s, s.get("policy_version") if s.get("policy_version") is not None else "-")
            for s in matching]


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
