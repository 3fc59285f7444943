"""One browser session's dashboard tick, as a plain function: what changed since this session last drew.

The Gradio timer handler in `panel/ui.py` is a thin wrapper over `dashboard_update`; benchmarks and tests call
it directly with a dict standing for the session's state. The run's view is refreshed at most once a second
whatever the number of sessions, its frame is built once per version and chart options for all of them, and
each session is sent only the components whose digest differs from what it drew last.
"""

from dataclasses import dataclass, field

from backend.axes import run_start
from panel import charts, dashboard

LOG_KEY = "log"


@dataclass
class DashboardUpdate:
    """The values to send; a component absent from `values` is unchanged for this session."""

    values: dict = field(default_factory=dict)

    def outputs(self, names: tuple[str, ...] = (*dashboard.PLOTS, "status", "adapters", "replicas", LOG_KEY)) -> list:
        return [self.values.get(name) for name in names]


def dashboard_update(panel, run_id: str, state: dict, visitor=None, role: str = "trainer", query: str = "",
                     x: str = "step", smoothing: float = 0.0, dollars: tuple | None = None) -> DashboardUpdate:
    """Refresh the run's shared view if due and return what this session has not drawn yet. `state` is the
    session's own: the run it drew and the digest of each component it has. `x` is "step", "time" or "dollars";
    `dollars` the run's spend corners (None for a run that costs nothing: wall time then)."""
    view = panel.view(run_id, visitor)
    if view.refresh_if_due() and hasattr(panel, "watch"):
        panel.watch.alerts(view)
    if state.get("run_id") != run_id:
        state.clear()
        state["run_id"] = run_id
    note = ""
    if x == "dollars" and dollars is None:
        x, note = "time", "local runs cost nothing"
    options = charts.ChartOptions(x=x, smoothing=round(float(smoothing or 0), 2), t0=run_start(view),
                                  dollars=tuple(dollars or ()), x_note=note)
    frame = dashboard.shared_frame(view, options)
    drawn = state.setdefault("digests", {})
    values = {name: value for name, value in frame.values.items() if drawn.get(name) != frame.digests[name]}
    drawn.update({name: frame.digests[name] for name in values})
    log_key = (role, query, _log_version(view, role))
    if state.get(LOG_KEY) != log_key:
        values[LOG_KEY] = dashboard.log_text(view, role, query)
        state[LOG_KEY] = log_key
    return DashboardUpdate(values)


def _log_version(view, role: str) -> tuple:
    job = view.jobs.get(role) or view.jobs.get("trainer")
    return (job.job_id, job.log_version) if job else ()
