"""How often the page's timer ticks: every TICK_S while anything it shows can change (a live run in the runs list
or open), every IDLE_TICK_S while nothing can.

Why slow down rather than stop: a run launched from another tab, another browser or an agent (MCP) appears in this
session's runs list only on a tick, so an idle page still ticks, IDLE_TICK_S apart: such a run is listed within
IDLE_TICK_S plus one tick's time. What this session does itself wakes the timer at once (`wake`: a launch, a resume,
picking a live run). Each tick costs the browser a pass of Gradio's front end over every component that ever had a
loading status, however little it sends (docs/measurements.md, "Idle page in the browser"), so an idle page's
ticks are its cost; a live run's page keeps its tick and its written -> drawn latency.
"""

import gradio as gr

from panel.runs_list import RUNS_HEADERS, status_badge

TICK_S = 2.0
IDLE_TICK_S = 10.0
STATUS = RUNS_HEADERS.index("status")
LIVE_BADGES = (status_badge("RUNNING"), status_badge("SCHEDULING"))


def listed_live(rows: list[list]) -> bool:
    """Whether a runs list's rows hold a live (running or scheduling) run."""
    return any(str(row[STATUS]).startswith(LIVE_BADGES) for row in rows)


def cadence(live: bool, interval) -> dict:
    """The timer's update for a session whose timer ticks every `interval` s: none when that is already right."""
    wanted = TICK_S if live else IDLE_TICK_S
    return {} if interval == wanted else {"timer": gr.update(value=wanted)}


def wake() -> dict:
    """The timer back to TICK_S: this session has just made something live."""
    return {"timer": gr.update(value=TICK_S)}
