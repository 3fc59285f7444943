"""One dashboard frame from a RunView: status text, figures, tables. No Gradio here. The header is
`run_header.py`, the tables `adapters_table.py`, `replicas_table.py` and `samples_table.py`, the figures
`charts.py` and `resource_charts.py`; here the frame that holds them all, shared by every session, and the log box.

A frame is built once per (run, view version, chart options) and shared by every session watching the run:
each component carries its value serialised once and a digest, so a session sends only what changed since it
last drew, and a tick of ten sessions costs about one frame.
"""

import hashlib
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

from backend.outcome.best_version import default_choice, version_choices
from backend.outcome.try_it import try_choices
from backend.view import diagnose
from backend.view.axes import run_start
from backend.view.runview import reading
from panel import chart_parts, charts, resource_charts
from panel.adapters_table import adapter_table
from panel.replicas_table import replica_rows
from panel.run_header import status_markdown
from panel.samples_table import SAMPLE_STEPS, sample_prompts, sample_steps

LOG_TAIL = 400

def _usages(view) -> dict:
    return {role: job.usage for role, job in view.current_jobs.items()}


# Every chart of the dashboard, in the order the page shows them (two a row): name -> (element id, its figure from
# the view and the chart options). Learning first, then the questions of a slow or off run: off-policy health,
# trainer vs generation, queue, sync, resources. Adding a chart is one entry here (and its figure in charts.py or
# resource_charts.py).
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
    "utilisation": ("util-plot", lambda view, o: resource_charts.utilisation_figure(_usages(view), o)),
    "memory": ("memory-plot", lambda view, o: resource_charts.memory_figure(_usages(view), o)),
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


def build_frame(view, options: chart_parts.ChartOptions | None = None) -> Frame:
    """Every component of the dashboard for `view` (built from its bounded series: the cost does not grow with
    the run's length): the charts, the status, the adapter and replica tables, the verdict's change (None: no
    change to suggest), the steps with samples, the job roles (the log's picker) and the spec (once read)."""
    options = options or chart_parts.ChartOptions(t0=run_start(view))
    with reading(view):     # a refresh or a history join meanwhile would change the tables being drawn
        values = {name: chart_parts.plot_json(figure(view, options)) for name, (_, figure) in CHARTS.items()}
        values["bottleneck"] = bottleneck_chart(view, options)
        values.update(status=status_markdown(view), adapters=adapter_table(view), replicas=replica_rows(view),
                      change=diagnose.view_verdict(view).change,
                      sample_steps=sample_steps(view)[:SAMPLE_STEPS], sample_prompt=sample_prompts(view),
                      version_pick={"choices": version_choices(view), "value": default_choice(view)},
                      try_picks=try_choices(view), roles=sorted(view.jobs))
        if view.spec:       # before spec.json is read, the config shown stays as it was
            values["config"] = view.spec
    return Frame(values, {k: digest(v) for k, v in values.items()})


def bottleneck_chart(view, options: chart_parts.ChartOptions) -> str | None:
    """The chart of what bounds the run, titled with the verdict, for the key charts' row; None when nothing does
    (a colocated run, a healthy one, too few steps): the row then holds the reward and held-out charts alone."""
    name = BOTTLENECK_CHARTS.get(diagnose.view_verdict(view).kind)
    if name is None:
        return None
    fig = CHARTS[name][1](view, options)
    title = fig["layout"]["title"]["text"]     # its numbers are in the header's verdict: the chart's name will do
    fig["layout"]["title"]["text"] = f"Bottleneck: {title.split(' (', 1)[0]}"
    return chart_parts.plot_json(fig)


def digest(value) -> str:
    """A short digest of a component's value: equal values, equal digests."""
    return hashlib.blake2b(repr(value).encode(), digest_size=8).hexdigest()


_frames: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_frames_lock = threading.Lock()


def shared_frame(view, options: chart_parts.ChartOptions | None = None) -> Frame:
    """The frame of `view` at its current version, built once for every session that asks (thread-safe)."""
    options = options or chart_parts.ChartOptions(t0=run_start(view))
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
