"""An idle page draws no frames: a script at the top of every page the panel serves (an ASGI middleware puts it
there) keeps Gradio's status tracker from asking the browser for a frame 60 times a second when no tracker shows.

Why: Gradio 6.31's `StatusTracker` starts a `requestAnimationFrame` loop (its elapsed-time counter) when its status
becomes "pending" and stops it only when the status changes while it is mounted; nothing stops it when the tracker
is taken off the page. The page-wide tracker that shows "Loading..." while the app loads is taken off the page as
soon as the app is ready, pending, so its loop runs for as long as the page is open (and a component's tracker that
goes while pending leaks one the same way). Each iteration asks for the next frame, so chromium renders 60 frames a
second of a page where nothing moves: a Gradio page of one Markdown and no events cost 1.28 renderer CPU-s per 30 s
against trackio's dashboard's 0.61 (docs/measurements.md, "Idle page in the browser"); a CPU profile of it shows
that loop (`statustracker` chunk, `run`) as the only script that runs.

The loop cannot be reached from outside (a closure), and the tracker's chunk keeps its own reference to
`window.requestAnimationFrame`, taken when it loads: so the script must run before Gradio's modules, which no
Gradio setting allows (`head`/`js` are added by the front end once it has loaded), hence the middleware. The
script wraps `requestAnimationFrame`: a frame asked for from the status tracker's code while no tracker on the
page shows a pending event is given a timer of TRACKER_IDLE_MS instead (the timestamp it is passed is the same
clock). A visible pending tracker's counter and loader keep their frames; anything else the tracker's chunk
schedules (an autoscroll, a toast's start) runs at most TRACKER_IDLE_MS later; everything else is untouched.
What identifies the tracker's code is its chunk's name in the stack (`statustracker-<hash>.js`): a Gradio that
renames it brings the frames back, which tests/test_idle_page.py catches. Written up to be filed upstream:
docs/upstream/gradio-statustracker-frames.md.
"""

TRACKER_IDLE_MS = 250
STOP_LEAKED_FRAMES = """<script>
(() => {
    const frame = window.requestAnimationFrame.bind(window);
    const showing = '[data-testid="status-tracker"]:not(.hide) .progress-text';
    window.requestAnimationFrame = function (callback) {
        if (!document.querySelector(showing) && (new Error().stack || '').includes('/statustracker-')) {
            window.setTimeout(() => callback(performance.now()), TRACKER_IDLE_MS);
            return 0;     // the tracker keeps no frame's id (nothing of its to cancel)
        }
        return frame(callback);
    };
})();
</script>""".replace("TRACKER_IDLE_MS", str(TRACKER_IDLE_MS))
HEAD = b"<head>"


class StopLeakedFrames:
    """ASGI middleware: STOP_LEAKED_FRAMES right after `<head>` in every HTML page the app answers (Gradio serves
    one: the page). Other answers pass through as they come; a compressed or unparsable page is left as it is."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") != "GET":
            return await self.app(scope, receive, send)
        start, body = None, []

        async def hold(message):
            nonlocal start
            if message["type"] == "http.response.start":
                headers = dict(message.get("headers") or [])
                if (headers.get(b"content-type", b"").startswith(b"text/html")
                        and b"content-encoding" not in headers):
                    start = message
                    return None
            elif message["type"] == "http.response.body" and start is not None:
                body.append(message.get("body", b""))
                if message.get("more_body"):
                    return None
                page = with_script(b"".join(body))
                headers = [(k, v) for k, v in start.get("headers", []) if k != b"content-length"]
                await send({**start, "headers": [*headers, (b"content-length", str(len(page)).encode())]})
                return await send({"type": "http.response.body", "body": page})
            return await send(message)

        return await self.app(scope, receive, hold)


def with_script(page: bytes) -> bytes:
    at = page.find(HEAD)
    if at < 0:
        return page
    at += len(HEAD)
    return page[:at] + STOP_LEAKED_FRAMES.encode() + page[at:]
