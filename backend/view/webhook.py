"""The alert webhook: where a panel may send a run's alerts, and the one POST it makes there.

A webhook URL is typed by a visitor, and the panel's own process sends to it: on a panel that serves others (a
Space, a shared machine) that would let any visitor make the panel reach what only it can reach (its own port,
loopback services, the cloud's metadata address, the private network). So there (`public_only`):

- the URL must be https, with a host and no user name or password in it;
- the host is resolved once and every address it resolves to must be public: loopback, private, shared,
  link-local, multicast, reserved and unspecified ranges are refused, IPv4 written inside IPv6 (mapped,
  compatible, 6to4, Teredo, NAT64) as the IPv4 address it carries, and a number written as a host
  (`http://2130706433`, `0x7f.1`) as the address the resolver makes of it;
- the POST connects to the address that was checked (TLS still verifies the certificate for the host name), so a
  name that resolves elsewhere a second later (DNS rebinding) changes nothing; and a redirect is never followed.

A panel only its own user reaches (`public_only=False`) may post to any http(s) address, loopback included.
The URL is checked when the form is previewed and launched, and again (resolved afresh) before each POST.
"""

import http.client
import ipaddress
import json
import socket
import ssl
import urllib.parse
from dataclasses import dataclass

from backend.runtime.redact import looks_like_token, redact_record

WEBHOOK_TIMEOUT_S = 10.0
PUBLIC_ONLY = "this panel serves others and sends only to public addresses"
EXAMPLE = "https://hooks.slack.com/services/… or a Discord webhook URL"
# IPv6 ranges that carry an IPv4 address in their last 32 bits (NAT64's well-known prefix; IPv4-compatible ::/96).
_V4_IN_LAST_32 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("::/96"))


class WebhookRefused(ValueError):
    """The URL may not be a webhook of this panel; the message says why and what would do."""


@dataclass(frozen=True)
class WebhookTarget:
    """A checked webhook URL: where to connect (`address`, resolved and checked) and what to ask for there."""

    scheme: str
    host: str          # the name as written: the Host header and the name TLS verifies
    port: int
    path: str          # path and query
    address: str       # the checked IP address the POST connects to


def webhook_problem(url: str, public_only: bool) -> str | None:
    """Why `url` cannot be an alert webhook of this panel (None when it can)."""
    try:
        webhook_target(url, public_only)
    except WebhookRefused as exc:
        return str(exc)
    return None


def webhook_target(url: str, public_only: bool) -> WebhookTarget:
    """`url` parsed, its host resolved once and every address checked; raises WebhookRefused."""
    url = (url or "").strip()
    if looks_like_token(url):
        raise WebhookRefused("this looks like a Hugging Face token; never type a token into the form")
    try:
        parsed = urllib.parse.urlsplit(url)
        port = parsed.port
    except ValueError:
        raise WebhookRefused(f"not a URL; use one such as {EXAMPLE}") from None
    schemes = ("https",) if public_only else ("http", "https")
    if parsed.scheme not in schemes or not parsed.hostname or any(c.isspace() for c in url):
        need = "an https URL (this panel serves others)" if public_only else "an http(s) URL"
        raise WebhookRefused(f"must be {need} such as {EXAMPLE}")
    if parsed.username is not None or parsed.password is not None:
        raise WebhookRefused("must not hold a user name or password before the host")
    host = parsed.hostname
    port = port or (443 if parsed.scheme == "https" else 80)
    if public_only and (host.rstrip(".") == "localhost" or host.rstrip(".").endswith(".localhost")):
        raise WebhookRefused(f"{host} is this machine: {PUBLIC_ONLY}")
    addresses = _resolve(host, port)
    for address in addresses if public_only else ():
        problem = address_problem(address)
        if problem:
            where = f"{host} is" if host.strip("[]") == address else f"{host} resolves to {address},"
            raise WebhookRefused(f"{where} {problem}: {PUBLIC_ONLY}")
    path = parsed.path or "/"
    return WebhookTarget(parsed.scheme, host, port, path + (f"?{parsed.query}" if parsed.query else ""),
                         addresses[0])


def _resolve(host: str, port: int) -> list[str]:
    """Every address `host` resolves to (an IP literal or a number such as 2130706433 included, as the system's
    resolver reads it)."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        raise WebhookRefused(f"the host {host} cannot be resolved from this panel") from None
    addresses = list(dict.fromkeys(info[4][0].split("%")[0] for info in found))
    if not addresses:
        raise WebhookRefused(f"the host {host} cannot be resolved from this panel")
    return addresses


def address_problem(address: str) -> str | None:
    """What makes `address` not a public one (None when it is public), reading IPv4 carried inside IPv6 as itself."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address):
        carried = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if carried is None and any(ip in net for net in _V4_IN_LAST_32) and int(ip) > 1:
            carried = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if carried is not None:
            return address_problem(str(carried))
    for kind, flag in (("loopback", ip.is_loopback), ("unspecified", ip.is_unspecified),
                       ("link-local", ip.is_link_local), ("multicast", ip.is_multicast),
                       ("private", ip.is_private), ("reserved", ip.is_reserved)):
        if flag:
            return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} address"
    if not ip.is_global:
        return "not a public address"
    return None


def post_webhook(url: str, text: str, alert, public_only: bool) -> int:
    """A Slack- and Discord-compatible JSON POST (Slack reads `text`, Discord reads `content`) to the address the
    URL's host was checked at just now; the HTTP status. A redirect is an error, never followed."""
    target = webhook_target(url, public_only)
    body = json.dumps(redact_record({"text": text, "content": text, "alert": {
        "kind": alert.kind, "key": alert.key, "message": alert.message}})).encode()
    connection = _connection(target)
    try:
        netloc = target.host if ":" not in target.host else f"[{target.host}]"
        default = 443 if target.scheme == "https" else 80
        connection.request("POST", target.path, body=body, headers={
            "Host": netloc if target.port == default else f"{netloc}:{target.port}",
            "Content-Type": "application/json", "User-Agent": "grpo-panel-alerts"})
        response = connection.getresponse()
        response.read()
    finally:
        connection.close()
    if 300 <= response.status < 400:
        raise WebhookRefused(f"the webhook answered a redirect ({response.status}), which is not followed")
    if response.status >= 400:
        raise OSError(f"the webhook answered HTTP {response.status}")
    return response.status


def _connection(target: WebhookTarget) -> http.client.HTTPConnection:
    """A connection to the checked address; over TLS, one that verifies the certificate for the host name."""
    if target.scheme == "http":
        return http.client.HTTPConnection(target.address, target.port, timeout=WEBHOOK_TIMEOUT_S)
    return _PinnedHTTPS(target, ssl.create_default_context())


class _PinnedHTTPS(http.client.HTTPSConnection):
    """HTTPS to a fixed IP address, with SNI and certificate checks for the URL's host name."""

    def __init__(self, target: WebhookTarget, context: ssl.SSLContext):
        super().__init__(target.address, target.port, timeout=WEBHOOK_TIMEOUT_S, context=context)
        self._server_name = target.host
        self._tls = context

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), self.timeout)
        self.sock = self._tls.wrap_socket(sock, server_hostname=self._server_name)
