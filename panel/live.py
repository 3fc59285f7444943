"""One browser session's dashboard tick, as a plain function: what changed since this session last drew.

The Gradio handlers in `panel/dashboard_view.py` are thin wrappers over `run_update`; benchmarks and tests call
`dashboard_update` directly with a dict standing for the session's state. The run's view is refreshed at most
once a second whatever the number of sessions, its frame is built once per version and chart options for all of
them, and each session is sent only the components whose key differs from what it drew last (`send_changed`:
the one rule for every component of the dashboard, the frame's, the log, the samples, the cost and the final
adapter alike).
"""

from collections.abc import Callable
from dataclasses import dataclass, field

from backend.outcome.best_version import ChoiceError, choose
from backend.runtime.redact import redact_tokens
from backend.view.axes import run_start
from panel import chart_parts, dashboard, run_header, samples_table, spend_view
from panel.markdown import masked

LOG_KEY = "log"
# Sent with a session's first draw of a run and then only when the session asks (a picker's choices, when it is
# opened: `dashboard_view.on_steps`, `on_versions`, `try_view.on_picks`), not with each tick: a live run has new
# sample steps every tick and a new adapter version every few, and each choices update costs Gradio a component
# rebuild per session.
ON_REQUEST = ("sample_steps", "version_pick", "try_picks")


@dataclass
class DashboardUpdate:
    """The values to send; a component absent from `values` is unchanged for this session."""

    values: dict = field(default_factory=dict)

    def outputs(self, names: tuple[str, ...] = (*dashboard.PLOTS, "status", "adapters", "replicas", LOG_KEY)) -> list:
        return [self.values.get(name) for name in names]


def send_changed(drawn: dict, parts: dict[str, tuple]) -> dict:
    """Of `parts` (name -> (key, value)), the values whose key differs from the key this session drew last
    (`drawn`: name -> key, updated to what is sent). The key is a digest or a version, whatever tells two values
    apart; a value may be a function of nothing, called only when its component is sent."""
    values = {}
    for name, (key, value) in parts.items():
        if name not in drawn or drawn[name] != key:
            values[name] = value() if callable(value) else value
            drawn[name] = key
    return values


def refreshed_view(panel, run_id: str, visitor=None):
    """The run's shared view, refreshed if due (at most once a second for every session), its alerts checked on
    what the refresh read. KeyError: not a run this visitor reaches."""
    view = panel.view(run_id, visitor)
    if view.refresh_if_due() and hasattr(panel, "watch"):
        panel.watch.alerts(view)
    return view


def dashboard_update(panel, run_id: str, state: dict, visitor=None, role: str = "trainer", query: str = "",
                     x: str = "step", smoothing: float = 0.0, dollars: tuple | None = None, pick="latest",
                     extra: Callable[[object], dict] | None = None, follow: str | None = None,
                     shown: str | None = None, title: Callable[[object], str] | None = None) -> DashboardUpdate:
    """Refresh the run's shared view if due and return what this session has not drawn yet. `state` is the
    session's own: the run it drew and the key of each component it has. `x` is "step", "time" or "dollars";
    `dollars` the run's spend corners (None for a run that costs nothing: wall time then); `pick` the step whose
    samples are shown, or `follow` the prompt followed across steps and versions (`samples_table.sample_prompts`);
    `extra(view)` more parts (name -> (key, value)) that the view alone does not give; `shown` the version the
    session's picker shows now (None: not known); `title(view)` the run's name that heads its header (renamed at any
    time: read each tick, cheap)."""
    view = refreshed_view(panel, run_id, visitor)
    if state.get("run_id") != run_id:
        state.clear()
        state["run_id"] = run_id
    note = ""
    if x == "dollars" and dollars is None:
        x, note = "time", "local runs cost nothing"
    options = chart_parts.ChartOptions(x=x, smoothing=round(float(smoothing or 0), 2), t0=run_start(view),
                                       dollars=tuple(dollars or ()), x_note=note)
    frame = dashboard.shared_frame(view, options)
    drawn = state.setdefault("drawn", {})
    parts = {name: (drawn[name] if name in ON_REQUEST and name in drawn else frame.digests[name], value)
             for name, value in frame.values.items()}
    # The version picker follows the run's default as it moves (final/ written, a first version evaluated): its
    # choices are sent again, with the default picked, only then, and not over a version the visitor picked by hand
    # (the picker shows another than the default it was sent last).
    default = frame.values["version_pick"]["value"]
    key = parts["version_pick"][0]
    by_hand = isinstance(key, tuple) and bool(shown) and shown != key[1]
    parts["version_pick"] = (key if isinstance(key, tuple) and (key[1] == default or by_hand)
                             else (frame.digests["version_pick"], default), frame.values["version_pick"])
    if title is not None:
        name = title(view)
        parts["status"] = ((parts["status"][0], name), run_header.titled(frame.values["status"], name))
    parts[LOG_KEY] = ((role, query, _log_version(view, role)), lambda: dashboard.log_text(view, role, query))
    rows = dashboard.shared_value(view, ("samples", pick, follow), lambda: _with_digest(
        samples_table.sample_rows(view, pick, follow)))
    parts["samples"] = rows
    parts.update(extra(view) if extra else {})
    return DashboardUpdate(send_changed(drawn, parts))


def run_update(panel, run_id: str, state: dict, visitor=None, role: str = "trainer", query: str = "",
               x: str = "step", smoothing: float = 0.0, pick="latest", follow: str | None = None,
               shown: str | None = None) -> DashboardUpdate:
    """`dashboard_update` as the Runs tab draws it: `x` as its radio says it ("wall time" for time), the dollars
    axis's spend corners, and the run's cost line and final adapter, which change without new records."""
    axis = {"wall time": "time"}.get(x, x)
    corners = spend_view.spend_corners(panel, run_id, visitor) if axis == "dollars" else None

    def extra(view) -> dict:
        # Time passes: the start-up stage's elapsed time, the spend and the ETA change without new records.
        cost = "\n\n".join(filter(None, (run_header.start_up_line(view), spend_view.cost_line(panel, run_id,
                                                                                          visitor, view))))
        final = panel.final_adapter(run_id, visitor) if view.final_files else None
        return {"cost": (cost, cost), "final": (final, final), "version_msg": version_line(view, shown)}

    return dashboard_update(panel, run_id, state, visitor, role, query, x=axis, smoothing=smoothing,
                            dollars=corners, pick=pick, extra=extra, follow=follow, shown=shown,
                            title=lambda view: panel.run_title(run_id, visitor, view))


def version_line(view, shown: str | None) -> tuple:
    """(key, value) of the line under the version picker: which version the picked one is, its held-out score by
    the run's rule beside the base model's, and the alert if one fired. Said again whenever the held-out scores
    move, so its counts and comparisons are the current ones, not those of the moment it was picked."""
    held = view.held_out
    key = (shown, held.evaluated, held.best_version, held.baseline, tuple(sorted(held.rule.items())),
           bool(view.final_files), len(view.adapters))
    if not shown:
        return key, ""

    def text() -> str:
        try:
            return redact_tokens(choose(view, shown).why)
        except ChoiceError as exc:
            return f"**No download.** {masked(str(exc))}"
        except OSError:     # the bucket not answering now: the line is said again on the next change
            return ""

    return key, text


def _with_digest(value) -> tuple:
    return dashboard.digest(value), value


def _log_version(view, role: str) -> tuple:
    job = view.jobs.get(role) or view.jobs.get("trainer")
    return (job.job_id, job.log_version) if job else ()
