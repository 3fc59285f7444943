"""What every part of the fake shares: the replies, the recorded requests, the users and the Hub's timestamps."""

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

DEFAULT_TOKEN = "hf_" + "fakeHubTokenOfAliceForTestsOnly0"
# One token of every shape the Hub has issued (user/org, OAuth, legacy API and org API with '_' or '-'): a test of a
# place that shows text plants all of them.
TOKEN_SHAPES = ("hf_" + "ShApEuSeRtOkEn0123456789abcdefghij", "hf_oauth_" + "ShApEoAuThToKeN0123456789ab",
                "api_" + "ShApElEgAcYaPiToKeN012345678", "api-" + "ShApElEgAcYdAsHtOkEn01234567",
                "api_org_" + "ShApEoRgApIuNdErScOrE0123456", "api-org-" + "ShApEoRgApIdAsHeS0123456789a")


def utc_stamp(at: float | None = None) -> str:
    """A Hub timestamp: ISO 8601, milliseconds, ending in Z."""
    moment = datetime.fromtimestamp(time.time() if at is None else at, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def wait_until(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02,
               what: str = "condition") -> Any:
    """Poll `predicate` until it returns something truthy; fail the test after `timeout` seconds, naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"{what} not met within {timeout}s")


@dataclass
class FakeUser:
    name: str
    orgs: dict[str, str] = field(default_factory=dict)   # org name -> roleInOrg ("admin", "write", "read")


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str                   # decoded, without the query string
    query: dict[str, list[str]]
    json: Any                   # parsed JSON body, or None
    headers: dict[str, str]     # lower-case names, Authorization removed
    user: str | None            # whose token it carried


@dataclass
class Reply:
    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)


def hex_id(seed: str) -> str:
    return hashlib.sha1(seed.encode()).hexdigest()[:24]


def bearer(header: str) -> str | None:
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def parse_json(raw: bytes, content_type: str) -> Any:
    if not raw:
        return None
    if "ndjson" in content_type:
        return [json.loads(line) for line in raw.splitlines() if line.strip()]
    try:
        return json.loads(raw)
    except ValueError:
        return None


def write_local(path: str, data: bytes) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
