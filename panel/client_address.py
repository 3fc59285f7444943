"""Which address a request came from, for what the panel counts per visitor who is not signed in (Try it's places,
uploads).

Gradio's `request.client.host` is the TCP peer as uvicorn sees it (uvicorn rewrites it from `X-Forwarded-For` only
for a peer in `FORWARDED_ALLOW_IPS`, 127.0.0.1 by default). On a Space the peer is the Space's own proxy, an address
of Hugging Face's internal network (10.x) that every visitor shares, and the visitor's address is in
`X-Forwarded-For`. Its leftmost entries are whatever the client sent (anyone can write `X-Forwarded-For: 1.2.3.4`);
each proxy on the way appends the address it received the request from. So on a Space the panel takes the rightmost
entry that is not a private or internal address (the one Hugging Face's edge appended: the client as the edge saw it),
the rightmost entry where all are internal, and the peer where the header is missing. Elsewhere (a local panel, or one
listening beyond loopback with no proxy of ours in front) the header is the client's own words, so the peer is used.
"""

import ipaddress

UNKNOWN = "unknown"


def forwarded_client(forwarded_for: str, peer: str | None) -> str:
    """The client's address from a Space's `X-Forwarded-For` (see the module's docstring), else `peer`."""
    entries = [entry.strip() for entry in (forwarded_for or "").split(",") if entry.strip()]
    for entry in reversed(entries):
        try:
            address = ipaddress.ip_address(entry)
        except ValueError:
            continue
        if address.is_global:
            return str(address)
    return entries[-1] if entries else (peer or UNKNOWN)


def client_address(headers, peer: str | None, on_space: bool) -> str:
    """The address a request came from: a Space's forwarded client, else the TCP peer. `headers` maps lower-case
    names to values (Gradio's request headers, or an ASGI scope's decoded)."""
    if on_space:
        return forwarded_client(_header(headers, "x-forwarded-for"), peer)
    return peer or UNKNOWN


def request_address(request, on_space: bool) -> str:
    """`client_address` of a Gradio request (None: a handler called without one, as unit tests do)."""
    if request is None:
        return UNKNOWN
    client = getattr(request, "client", None)
    peer = getattr(client, "host", None) if client is not None else None
    try:
        headers = getattr(request, "headers", None) or {}
    except Exception:   # a request without headers (built by hand)
        headers = {}
    return client_address(headers, peer, on_space)


def scope_address(scope, on_space: bool) -> str:
    """`client_address` of an ASGI request scope (the upload middleware's)."""
    headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope.get("headers") or []}
    peer = (scope.get("client") or (None,))[0]
    return client_address(headers, peer, on_space)


def _header(headers, name: str) -> str:
    try:
        value = headers.get(name) or headers.get(name.title())
    except AttributeError:
        value = None
    return str(value or "")
