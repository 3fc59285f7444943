"""The alert webhook as an attacker would aim it: at the panel's own machine, its loopback services, the private
network or the cloud's metadata address, through numbers, names and redirects. A panel that serves others refuses
every such URL when the form is previewed (naming the field) and never sends it a byte; a local panel may post to
loopback but follows no redirect. Loopback servers in this process record every request they get."""

import contextlib
import http.server
import socket
import threading

import pytest

from backend.view.diagnose import Alert
from backend.view.webhook import WebhookRefused, post_webhook, webhook_problem
from panel.presets import TINY_DEMO, preset_values
from tests.helpers import panel_factory

pytestmark = pytest.mark.unit

ALERT = Alert(kind="stall", key="stall", message="no step for 10 min")


class Recorder(http.server.ThreadingHTTPServer):
    """A loopback HTTP server that records each request; `redirect_to`, if set, answers 302 to it."""

    daemon_threads = True
    redirect_to: str | None = None

    def __init__(self, host: str = "127.0.0.1"):
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.seen: list[tuple[str, str, str]] = []      # (method, path, Host header)
        super().__init__((host, 0), _Handler)

    @property
    def port(self) -> int:
        return self.server_address[1]


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_any(self):
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.server.seen.append((self.command, self.path, self.headers.get("Host", "")))
        if self.server.redirect_to:
            self.send_response(302)
            self.send_header("Location", self.server.redirect_to)
        else:
            self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = do_HEAD = do_any

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def recording(host: str = "127.0.0.1"):
    server = Recorder(host)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def loopback_name() -> str:
    """A name the system's resolver (/etc/hosts here) maps to loopback: this machine's own host name where it is
    one, else `localhost`."""
    name = socket.gethostname()
    try:
        if {info[4][0] for info in socket.getaddrinfo(name, 80)} <= {"127.0.0.1", "::1", "127.0.1.1"}:
            return name
    except OSError:
        pass
    return "localhost"


def hostile_urls(port: int) -> list[str]:
    """Webhook URLs that reach this machine or a private network, each written a way an attacker would write it."""
    return [
        f"https://127.0.0.1:{port}/hook", f"http://127.0.0.1:{port}/hook", f"https://[::1]:{port}/hook",
        f"https://2130706433:{port}/hook", f"https://0x7f000001:{port}/hook", f"https://017700000001:{port}/hook",
        f"https://127.1:{port}/hook", f"https://localhost:{port}/hook", f"https://localhost.:{port}/hook",
        f"https://{loopback_name()}:{port}/hook", f"https://[::ffff:127.0.0.1]:{port}/hook",
        f"https://[::ffff:7f00:1]:{port}/hook", f"https://[2002:7f00:1::]:{port}/hook",
        f"https://10.1.2.3:{port}/hook", f"https://172.16.0.5:{port}/hook", f"https://192.168.1.10:{port}/hook",
        f"https://169.254.169.254:{port}/latest/meta-data", f"https://[fe80::1]:{port}/hook",
        f"https://[fc00::1]:{port}/hook", f"https://100.64.0.1:{port}/hook", f"https://224.0.0.1:{port}/hook",
        f"https://0.0.0.0:{port}/hook", f"https://240.0.0.1:{port}/hook",
        f"https://user:pw@127.0.0.1:{port}/hook", "https://8.8.8.8/hook\nHost: 127.0.0.1",
    ]


def test_every_way_of_writing_this_machine_or_a_private_network_is_refused_and_never_requested():
    with recording() as server:
        for url in hostile_urls(server.port):
            assert webhook_problem(url, public_only=True), url
            with pytest.raises(WebhookRefused):
                post_webhook(url, "alert", ALERT, public_only=True)
        assert server.seen == [], "a refused webhook was requested"


@pytest.mark.parametrize("url", ["https://8.8.8.8/hook", "https://[2606:4700:4700::1111]/services/T0/B0/x"])
def test_a_public_https_address_is_accepted(url):
    assert webhook_problem(url, public_only=True) is None


def test_a_panel_that_serves_others_wants_https():
    problem = webhook_problem("http://8.8.8.8/hook", public_only=True)
    assert problem and "https" in problem


def test_a_local_panel_posts_to_loopback_by_the_checked_address_with_the_name_as_host():
    with recording() as server:
        url = f"http://{loopback_name()}:{server.port}/hook?x=1"
        assert webhook_problem(url, public_only=False) is None
        assert post_webhook(url, "alert", ALERT, public_only=False) == 200
        assert server.seen == [("POST", "/hook?x=1", f"{loopback_name()}:{server.port}")]


def test_a_redirect_is_never_followed():
    """A local panel may post to loopback: a webhook there that redirects elsewhere gets one POST, and the place it
    redirects to gets nothing."""
    with recording() as target, recording() as redirector:
        redirector.redirect_to = f"http://127.0.0.1:{target.port}/internal"
        with pytest.raises(WebhookRefused, match="redirect"):
            post_webhook(f"http://127.0.0.1:{redirector.port}/hook", "alert", ALERT, public_only=False)
        assert [method for method, _, _ in redirector.seen] == ["POST"]
        assert target.seen == [], "the redirect was followed"


@pytest.fixture
def make_panel(tmp_path):
    with panel_factory(str(tmp_path / "home")) as make:
        yield make


def test_a_shared_panel_refuses_each_hostile_webhook_at_preview_naming_the_field(make_panel):
    """A panel reachable from other machines (0.0.0.0) serves others: the preview refuses the webhook as a field
    of the form (with the others that are wrong), and the recorder behind it hears nothing."""
    panel = make_panel(host="0.0.0.0", allow_host_token=True)
    panel.field_labels = {"webhook": "Alert webhook URL (optional)"}
    form = preset_values(TINY_DEMO)
    with recording() as server:
        for url in hostile_urls(server.port):
            shown = panel.preview(form, webhook=url)
            assert shown.fingerprint is None and "webhook" in shown.fields, (url, shown.markdown)
            assert "Alert webhook URL (optional)" in shown.markdown, shown.markdown
            launched = panel.launch(form, webhook=url)
            assert launched.run_id is None and "webhook" in launched.fields, launched.message
        assert server.seen == []
    assert panel.preview(form, webhook="https://8.8.8.8/hook").fingerprint, "a public https webhook is fine"


def test_a_local_panel_accepts_a_loopback_webhook(make_panel):
    panel = make_panel()
    with recording() as server:
        shown = panel.preview(preset_values(TINY_DEMO), webhook=f"http://127.0.0.1:{server.port}/hook")
        assert shown.fingerprint and "webhook" not in shown.fields, shown.markdown
