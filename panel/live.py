"""One browser session's dashboard tick, as a plain function: what changed since this session last drew.

The Gradio timer handler in `panel/ui.py` is a thin wrapper over `dashboard_update`; benchmarks and tests call
it directly with a dict standing for the session's state.
"""

from dataclasses import dataclass, field

from panel import dashboard

DASH_KEYS = ("status", "reward", "staleness", "utilisation", "memory", "kl", "length", "ratio", "adapters",
             "replicas")


@dataclass
class DashboardUpdate:
    """The values to send; a key absent from `values` means "unchanged, send nothing"."""

    values: dict = field(default_factory=dict)

    def outputs(self) -> list:
        return [self.values.get(k) for k in (*DASH_KEYS, "log")]


def dashboard_update(panel, run_id: str, state: dict, visitor=None, role: str = "trainer",
                     query: str = "") -> DashboardUpdate:
    """Refresh the run's shared view and return what this session has not drawn yet. `state["drawn"]` holds
    (run id, view version) of the session's last draw."""
    view = panel.view(run_id, visitor)
    view.refresh()
    if state.get("drawn") == (run_id, view.version):
        return DashboardUpdate()
    frame = dashboard.build_frame(view)
    state["drawn"] = (run_id, view.version)
    values = {key: getattr(frame, key) for key in DASH_KEYS}
    values["log"] = dashboard.log_text(view, role, query)
    return DashboardUpdate(values)
