"""The idle check's stamp endpoint (`tick_stamp`, panel/tick.py) as a caller other than the page reaches it, through
a real panel process behind its login (`GRPO_PANEL_AUTH`): refused without the login, learning nothing; with it, an
answer about the caller's own view only, whatever session or run id the call names; a malformed call a clear 4xx,
no traceback in the panel's log. The browser's side of the same paths is tests/test_idle_paths.py."""

import os

import httpx
import pytest

from panel.tick import STAMP_API
from tests.browser_helpers import ROOT, running_panel

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_hub_login")]

LOGIN = ("ann", "s3cret-panel-pw")


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    """A panel behind a login, over a home holding one finished run: (url, home, run id)."""
    import sys

    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from idle_page import NO_TOKENS, finished_run

    home = tmp_path_factory.mktemp("guarded")
    run_id = finished_run(str(home), 5)
    with running_panel(os.path.join(ROOT, "app.py"), {"GRPO_PANEL_AUTH": ":".join(LOGIN)}, home,
                       unset=NO_TOKENS) as url:
        yield url, home, run_id


def stamp_call(client: httpx.Client, body) -> httpx.Response:
    return client.post(f"/gradio_api/run/{STAMP_API}", json=body)


def test_a_stamp_call_without_the_panels_login_is_refused_and_learns_nothing(guarded):
    url, _, run_id = guarded
    with httpx.Client(base_url=url, timeout=60) as stranger:
        for body in ({"data": [run_id]}, {"data": [""]}, {"data": [run_id], "session_hash": "a-page-session"}):
            answer = stamp_call(stranger, body)
            assert answer.status_code == 401, (body, answer.status_code, answer.text)
            assert run_id not in answer.text and "data" not in answer.json(), answer.text
        for route in ("api", "call"):       # Gradio's other routes by API name
            answer = stranger.post(f"/gradio_api/{route}/{STAMP_API}", json={"data": [run_id]})
            assert answer.status_code == 401, (route, answer.status_code, answer.text)


def test_a_signed_in_caller_learns_its_own_stamp_only_and_a_malformed_call_gets_a_clear_4xx(guarded):
    url, home, run_id = guarded
    with httpx.Client(base_url=url, timeout=60) as client:
        login = client.post("/login", data={"username": LOGIN[0], "password": LOGIN[1]})
        assert login.status_code == 200, login.text

        def stamp(body) -> str:
            answer = stamp_call(client, body)
            assert answer.status_code == 200, (body, answer.status_code, answer.text)
            return answer.json()["data"][0]

        own, nothing = stamp({"data": [run_id]}), stamp({"data": [""]})
        assert own != nothing, "the open run is not in its stamp"
        # Another page's session named: the answer is still the caller's own view (the visitor is the login's).
        assert stamp({"data": [run_id], "session_hash": "someone-elses-session"}) == own
        # A run id the caller does not reach (none, or a path) stamps as no run: it tells nothing.
        for unknown in ("no-such-run", "../../etc", run_id + "x", None):
            assert stamp({"data": [unknown]}) == nothing, unknown
        malformed = [{"data": []}, {"data": [run_id, run_id]}, {"data": [["a"]]}, {"data": [{"run": run_id}]},
                     {"data": [7]}, {"data": run_id}, {}, [run_id], {"data": [run_id], "session_hash": 5}]
        for body in malformed:
            answer = stamp_call(client, body)
            assert answer.status_code == 400 and "idle check's stamp takes" in answer.text, \
                (body, answer.status_code, answer.text[:300])
        answer = client.post(f"/gradio_api/run/{STAMP_API}", content=b"{not json",
                             headers={"Content-Type": "application/json"})
        assert answer.status_code == 400 and "not JSON" in answer.text, (answer.status_code, answer.text)
        answer = stamp_call(client, {"data": ["x" * 10000]})
        assert answer.status_code == 413, (answer.status_code, answer.text[:200])
        assert stamp({"data": [run_id]}) == own, "a malformed call changed what the caller is answered"
    with open(os.path.join(str(home), "app.log"), errors="replace") as f:
        log = f.read()
    assert "Traceback" not in log, log[-3000:]
