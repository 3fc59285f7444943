"""`/server_info`, answered once per server and kept: the first contact between a trainer and its servers.

TRL's async trainer asks `/server_info` once, with no retry, to choose adapter-only sync. A fresh vLLM server's first
answer collects its environment (vLLM's `collect_env`): 21.7 and 25.5 s at load 21 on the 2-core machine, and each
of several trainers asking one fleet at once (a sweep's members, each behind its own proxy) paid it again, past
the proxy's 30 s, so every member failed on a 503 (issue: "one slow first answer kills every sweep member").
What a server answers there does not change while it runs, so:
- the proxy asks each server once, the first callers waiting on that one request (`ServerInfoCache`), with a long
  timeout, and a slow answer never marks a server down (health checks decide that);
- the trainer asks through its proxy with backoff until its start deadline before TRL does (`await_server_info`),
  so TRL's one question is answered from the proxy's copy;
- a replica job asks each of its servers once as soon as it is healthy (`warm`), so vLLM's own cache is filled
  before the trainers come.
"""

import asyncio
import json
import time
import urllib.error
import urllib.request

ANSWER_TIMEOUT_S = 180.0     # one /server_info request: far past the 25 s seen at load 21
PATH = "/server_info"


class ServerInfoCache:
    """Each server's /server_info answer by query, fetched once: concurrent first callers share one request."""

    def __init__(self):
        self._answers: dict[tuple[str, str], object] = {}
        self._pending: dict[tuple[str, str], asyncio.Task] = {}

    def forget(self, url: str) -> None:
        """A server that went down may come back another process (its job ran again): ask it anew."""
        for key in [k for k in self._answers if k[0] == url]:
            del self._answers[key]

    async def get(self, url: str, query: str, fetch):
        """The answer of server `url` to /server_info?`query`; `fetch()` asks it (its exceptions propagate to every
        caller waiting on that request; a failed request is not kept)."""
        key = (url, query)
        if key in self._answers:
            return self._answers[key]
        task = self._pending.get(key)
        if task is None:
            task = self._pending[key] = asyncio.ensure_future(fetch())
            task.add_done_callback(lambda done: self._settle(key, done))
        return await asyncio.shield(task)

    def _settle(self, key, done: asyncio.Task) -> None:
        self._pending.pop(key, None)
        if not done.cancelled() and done.exception() is None and done.result().status == 200:
            self._answers[key] = done.result()


def await_server_info(base_url: str, deadline: float, headers: dict | None = None, say=print) -> float:
    """Ask `base_url`/server_info (TRL's form) until it answers 200, backing off 1, 2, 4 ... 30 s, until `deadline`
    (time.monotonic()); the seconds it took. Raises TimeoutError naming the last answer."""
    started, wait, last = time.monotonic(), 1.0, "no answer"
    request = urllib.request.Request(f"{base_url}{PATH}?config_format=json", headers=headers or {})
    while True:
        left = deadline - time.monotonic()
        try:
            with urllib.request.urlopen(request, timeout=max(1.0, min(ANSWER_TIMEOUT_S, left))) as response:
                json.load(response)
            return time.monotonic() - started
        except urllib.error.HTTPError as error:
            last = f"{error.code} {error.read()[:200].decode(errors='replace')}"
        except (OSError, ValueError) as error:
            last = f"{type(error).__name__}: {error}"
        if time.monotonic() + wait >= deadline:
            raise TimeoutError(f"no vLLM server answered {PATH} within the start deadline "
                               f"({time.monotonic() - started:.0f} s of trying; last: {last})")
        say(f"{PATH} not answered yet ({last}); asking again in {wait:.0f} s", flush=True)
        time.sleep(wait)
        wait = min(wait * 2, 30.0)


def warm(url: str, headers: dict | None = None, deadline_s: float = 1800.0, say=print) -> None:
    """Once server `url` answers /health, ask its /server_info once (see the module docstring); gives up silently
    at `deadline_s` (the server's own start failing is said elsewhere)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=5).close()
            break
        except OSError:
            time.sleep(1.0)
    else:
        return
    try:
        took = await_server_info(url, deadline, headers, say=lambda *a, **k: None)
        say(f"{url}{PATH} answered in {took:.1f} s (asked once, before any trainer)", flush=True)
    except TimeoutError as error:
        say(f"{url}: {error}", flush=True)
