"""Whose adapter a name is, for a proxy in front of replicas that several sweep members share.

A lone run's proxy owns its replicas (`own` None): every adapter name is its own, and it routes, pauses and relays
exactly as before (none of the counting below runs for it). A sweep member's proxy (`own` its tag,
`layout.spec_member`) shares the fleet with the other members' proxies, each in front of the same replicas: it
loads, unloads, reconciles and routes only its member's versions (`trl-policy-<tag>-v<N>`), and refuses another
member's, so a member's rollouts never come from another member's policy and a reconciling proxy never unloads a
neighbour's adapter. Its /pause holds back its own member's new generations at the proxy instead of pausing the
shared engines (which would stall every other member's rollouts).

Per member (the tag in the request's model name; the base model's generations count as the proxy's own member's),
it counts the generations in flight (at most `cap` at once, 0: no cap, so one member cannot take every replica's
batch), their peak, and the tokens the replicas generated (`usage.completion_tokens` of each JSON answer; streamed
answers carry none), which split a shared fleet's cost between its members.
"""

import asyncio
import contextlib
import json
from dataclasses import dataclass

from ..layout import adapter_member

MAX_COUNTED_BODY = 16 * 1024 * 1024   # an answer longer than this is relayed but its tokens are not counted


@dataclass
class MemberTraffic:
    in_flight: int = 0
    peak_in_flight: int = 0
    generations: int = 0
    generated_tokens: int = 0

    def snapshot(self) -> dict:
        return {"in_flight": self.in_flight, "peak_in_flight": self.peak_in_flight, "generations": self.generations,
                "generated_tokens": self.generated_tokens}


class Members:
    """One proxy's view of the sweep members whose generations pass through it."""

    def __init__(self, own: str | None = None, cap: int = 0):
        self.own, self.cap = own, cap
        self.traffic: dict[str, MemberTraffic] = {}
        self._slots: dict[str, asyncio.Semaphore] = {}
        self._open: asyncio.Event | None = None     # made on the proxy's loop: cleared while its member is paused

    @property
    def shared(self) -> bool:
        """Whether the replicas are shared with other members' proxies."""
        return self.own is not None

    def owns(self, name: str) -> bool:
        """Whether this proxy may load, unload or reconcile adapter `name`."""
        return not self.shared or adapter_member(name) == self.own

    def foreign(self, model) -> str | None:
        """Why a generation for `model` is refused here (another member's version), or None."""
        member = adapter_member(model) if isinstance(model, str) else None
        if not self.shared or member is None or member == self.own:
            return None
        return (f"this proxy serves sweep member {self.own!r}: {model!r} is another run's adapter version, which a "
                f"member never samples from")

    def member_of(self, model) -> str:
        """The member a generation for `model` is counted under ("" for a lone run's and the base model's, or, in a
        sweep member's proxy, that member)."""
        member = adapter_member(model) if isinstance(model, str) else None
        return member if member else (self.own or "")

    # ---- this member's pause (a sweep member's proxy only)
    def _gate(self) -> asyncio.Event:
        if self._open is None:
            self._open = asyncio.Event()
            self._open.set()
        return self._open

    def pause(self) -> None:
        self._gate().clear()

    def resume(self) -> None:
        self._gate().set()

    @property
    def paused(self) -> bool:
        return not self._gate().is_set()

    @contextlib.asynccontextmanager
    async def slot(self, member: str):
        """Hold one of `member`'s in-flight places for a generation (waiting while it is paused or at its cap)."""
        await self._gate().wait()
        traffic = self.traffic.setdefault(member, MemberTraffic())
        slots = self._slots.setdefault(member, asyncio.Semaphore(self.cap)) if self.cap > 0 else None
        if slots is not None:
            await slots.acquire()
        traffic.in_flight += 1
        traffic.peak_in_flight = max(traffic.peak_in_flight, traffic.in_flight)
        try:
            yield traffic
        finally:
            traffic.in_flight -= 1
            if slots is not None:
                slots.release()

    @staticmethod
    def count(traffic: MemberTraffic, body: bytes | None) -> None:
        """One generation answered; its generated tokens where the answer says them."""
        traffic.generations += 1
        if not body:
            return
        try:
            usage = json.loads(body).get("usage") or {}
        except (ValueError, AttributeError):
            return
        tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
        if type(tokens) is int and tokens >= 0:
            traffic.generated_tokens += tokens

    def snapshot(self) -> dict:
        return {member: t.snapshot() for member, t in sorted(self.traffic.items())}
