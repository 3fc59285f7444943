"""The page's timer, in two stages: while anything shown can change (a live run in the runs list or open) the timer
(`timer`) runs the full update every TICK_S; while nothing can, it is off and a second timer (`idle_timer`) asks only
whether anything changed, every IDLE_TICK_S, and runs the full update only when it did.

Why two stages: every Gradio event costs the browser a pass of Gradio's front end over every component that ever had
a loading status and a copy of their states, however little it sends (docs/measurements.md, "Idle page in the
browser"), so an idle page's events are its cost. The idle check is no Gradio event: the idle timer's event runs a
script in the browser alone (`CHECK`), which posts the open run's id (from the page's address) to the panel's
`tick_stamp` endpoint (`/gradio_api/run/tick_stamp`, off the queue: no tick waits behind a long event) and compares
the answer, `stamp()`, with the stamp the page's last full update drew (`tick_seen`); only when they differ does it
click the hidden `tick_full` button, whose event is the full update (the same one the timer runs). `stamp()` reads
nothing of its own: the open run's shared view (refreshed at most once a second, a finished run every
SETTLED_RECHECK_S, for every session alike) gives its version, the runs list and its hint come from the registries'
shared listings; so a check costs the panel Gradio's request path and a hash (1.4 ms here, the stamp a tenth of it:
docs/measurements.md), never a read of a bucket.

A live page keeps the one-stage tick: a live run changes nearly every tick, and a check first would only delay its
charts by a round trip (a two-stage tick that did so was measured later to draw, and costlier per session).

Why slow down rather than stop: a run launched from another tab, another browser or an agent (MCP) appears in this
session's runs list only on a tick, so an idle page still checks, IDLE_TICK_S apart: such a run is listed within
IDLE_TICK_S plus the listing's age and one tick's time, and the full update it brings switches back to the fast timer.
What this session does itself wakes the fast timer at once (`wake`: a launch, a resume, picking a live run).
"""

import hashlib
import json

import gradio as gr
from starlette.responses import PlainTextResponse

from panel import live
from panel.runs_list import RUNS_HEADERS, status_badge

TICK_S = 2.0
IDLE_TICK_S = 10.0
STATUS = RUNS_HEADERS.index("status")
LIVE_BADGES = (status_badge("RUNNING"), status_badge("SCHEDULING"))
STAMP_API = "tick_stamp"
# Gradio's routes that call an endpoint by its API name (under any root path the app is mounted at).
STAMP_ROUTES = tuple(f"/gradio_api/{route}/{STAMP_API}" for route in ("run", "api", "call"))
MAX_STAMP_BODY = 4096       # bytes: a run id and a session hash
STAMP_BODY = ('the idle check\'s stamp takes a JSON object {"data": [<run id, or "">], "session_hash": <this page\'s '
              'session>}')
FULL_ID = "tick-full"
SEEN_ID = "tick-seen"
# The idle timer's event, in the browser alone: the panel's stamp for what this page shows, the full update (a click
# on the hidden button) only when it differs from the stamp of what the page last drew (`tick_seen`, which each full
# update sets from the stamp it took before drawing). A click Gradio drops (the full update already pending: its
# trigger mode) leaves that stamp behind, so the next check clicks again: no change is lost to a dropped click, and
# the page's first check updates once. A check refused or failed (a proxy that blocks the route, the login gone, a
# stamp that raised) clicks too: the page falls back to the full update every IDLE_TICK_S, never stops updating in
# silence. The page's own Gradio session is named: without one, Gradio builds a new session's state of the whole page
# for each call (28 ms of CPU here, against 2).
CHECK = """async () => {
    const root = ((window.gradio_config && window.gradio_config.root) || '').replace(/\\/+$/, '');
    const run = new URL(window.location.href).searchParams.get('run') || '';
    try {
        const answer = await fetch(root + '/gradio_api/run/STAMP_API', {method: 'POST',
            headers: {'Content-Type': 'application/json'},
            body: JSON.stringify({data: [run], session_hash: window.__gradio_session_hash__})});
        if (answer.ok) {
            const stamp = (await answer.json()).data[0];
            const seen = document.querySelector('#SEEN_ID textarea, #SEEN_ID input');
            if (seen && stamp === seen.value) { return []; }
        }
    } catch (e) { /* the panel not answering: the full update says so, as a tick would */ }
    const full = document.querySelector('#FULL_ID');
    if (full) { full.click(); }
    return [];
}""".replace("STAMP_API", STAMP_API).replace("FULL_ID", FULL_ID).replace("SEEN_ID", SEEN_ID)


def build(page) -> None:
    """The timers and the idle check's hidden parts, added to `page`."""
    page.add(timer=gr.Timer(TICK_S), idle_timer=gr.Timer(IDLE_TICK_S, active=False),
             tick_full=gr.Button("Update", elem_id=FULL_ID, visible="hidden"),
             tick_stamp=gr.Textbox(visible=False),
             tick_seen=gr.Textbox(elem_id=SEEN_ID, visible="hidden", interactive=False, container=False))


def listed_live(rows: list[list]) -> bool:
    """Whether a runs list's rows hold a live (running or scheduling) run."""
    return any(str(row[STATUS]).startswith(LIVE_BADGES) for row in rows)


def cadence(live: bool, interval) -> dict:
    """The timers' update for a session whose fast timer's period is `interval` (TICK_S: it runs; IDLE_TICK_S: it is
    off and the idle check runs): none when that is already right."""
    wanted = TICK_S if live else IDLE_TICK_S
    if interval == wanted:
        return {}
    return wake() if live else {"timer": gr.update(value=IDLE_TICK_S, active=False),
                                "idle_timer": gr.update(active=True)}


def wake() -> dict:
    """The fast timer back at TICK_S, the idle check off: this session has just made something live."""
    return {"timer": gr.update(value=TICK_S, active=True), "idle_timer": gr.update(active=False)}


def stamp(panel, visitor, run_id: str | None) -> str:
    """What tells whether a session's full update would send anything: the open run's view's version and title, the
    visitor's runs list (unfiltered: a filtered list changes only where it does) and its hint. Equal stamps, nothing to
    send; a run this visitor does not reach stamps as no run (its id tells nothing)."""
    run = None
    if run_id:
        try:
            view = live.refreshed_view(panel, run_id, visitor)
            run = (run_id, view.version, panel.run_title(run_id, visitor, view), bool(view.final_files))
        except KeyError:
            run = None
    seen = (run, panel.runs_table(visitor), panel.runs_hint(visitor))
    return hashlib.blake2b(repr(seen).encode(), digest_size=12).hexdigest()


def seen(panel, visitor, run_id: str | None, shown: str | None) -> dict:
    """`tick_seen`'s update for a full update about to draw: the stamp of what it draws (taken before it draws, so a
    change while it draws makes the next check differ), none when the page already holds it."""
    now = stamp(panel, visitor, run_id)
    return {} if now == shown else {"tick_seen": now}


def on_stamp(panel, visitor, run_id) -> dict:
    return {"tick_stamp": stamp(panel, visitor, run_id)}


class StampRequests:
    """ASGI middleware: a call of the stamp endpoint whose body is not the idle check's own (`CHECK`) is refused with
    400 and a line saying what it takes, before Gradio reads it (Gradio answers some, a missing or a list-valued run
    id, with 500, its internals and a traceback in the log). What a well-formed call learns is `stamp()`'s: the
    caller's own view, whoever's session it names (the visitor is the request's own sign-in, never the session's)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") != "POST" or not is_stamp_call(scope):
            await self.app(scope, receive, send)
            return
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] != "http.request":      # the client went away: nothing to answer
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > MAX_STAMP_BODY:
                await PlainTextResponse(f"{STAMP_BODY}: this one is over {MAX_STAMP_BODY} bytes.",
                                        status_code=413)(scope, receive, send)
                return
        problem = stamp_body_problem(body)
        if problem:
            await PlainTextResponse(f"{STAMP_BODY}: {problem}.", status_code=400)(scope, receive, send)
            return
        sent = False

        async def replay():
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


def is_stamp_call(scope) -> bool:
    return scope.get("path", "").rstrip("/").endswith(STAMP_ROUTES)


def stamp_body_problem(body: bytes) -> str | None:
    """What is wrong with a stamp call's body, or None."""
    try:
        call = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return "this one is not JSON"
    if not isinstance(call, dict):
        return "this one is not an object"
    data = call.get("data")
    if not isinstance(data, list) or len(data) != 1:
        return "its data must be a list of one run id"
    if not (data[0] is None or isinstance(data[0], str)):
        return f"its run id must be text, not {type(data[0]).__name__}"
    if not isinstance(call.get("session_hash", ""), (str, type(None))):
        return "its session_hash must be text"
    return None
