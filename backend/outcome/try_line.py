"""The line for this panel's CPU "Try it": one try runs at a time (the machine has few cores), visitors wait in the
order they asked and see their place, one place per visitor, and the line has a bound.

Why a line and not a refusal: a refused visitor can only click again and hope; a place they can see, with a wait that
is bounded (at most `waiting` tries ahead, each stopped at `cap_s`), is fair. A second try by a visitor who already
has one waiting or running is refused rather than put in place of the first: replacing would kill an answer they are
watching (in another tab) or let one visitor churn the line; refusing keeps their place and is what they can predict.

Places are per person: a signed-in visitor is known by their name (all their tabs are one visitor); a visitor who is
not signed in by the address they come from (`panel/client_address.py`: one person opening many sessions is still one
address), with at most `per_address` places an address. So that nobody can be starved by people who are not signed in,
`kept` of the waiting places are only for signed-in visitors: anonymous ones hold at most `waiting - kept` of them.

Who has left gives up their place: the try closes its generator (Gradio closes it when the visitor cancels or goes),
and a waiter whose generator stopped asking (`stale_s`) is dropped in case it never is closed. The one whose turn it
is holds it at most `cap_s` (the worker is stopped at that time anyway), whatever its caller does afterwards.
"""

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass


class LineRefused(ValueError):
    """No place in the line: the message says why and what to do."""


@dataclass(eq=False)
class Ticket:
    """One visitor's place."""

    who: str
    seen: float                          # when its waiter last asked where it stands
    started: float | None = None         # when its turn began (None: still waiting)
    address: str | None = None           # where a visitor who is not signed in comes from (None: signed in)


def ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


class TryLine:
    """A FIFO line with one try running at a time: `join`, then `wait` (yields where the ticket stands until its
    turn), then `leave` (always, in a `finally`)."""

    def __init__(self, waiting: int, cap_s: float, stale_s: float = 30.0, tick_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic, per_address: int = 2, kept: int = 1):
        self.waiting, self.cap_s, self.stale_s, self.tick_s, self.clock = waiting, cap_s, stale_s, tick_s, clock
        self.per_address = per_address      # places (waiting or running) a visitor who is not signed in may hold
        self.kept = min(kept, waiting)      # waiting places only signed-in visitors may take
        self._line: list[Ticket] = []        # [0] has the turn once it has started
        self._recent: deque = deque(maxlen=5)   # how long the last tries took, for "about N s"
        self._changed = threading.Condition()

    def join(self, who: str, address: str | None = None) -> Ticket:
        """A place at the end of the line, or LineRefused: `who` already has one, the line is full, or (a visitor
        who is not signed in, from `address`) their address holds its places already, or every place open to
        visitors who are not signed in is taken."""
        with self._changed:
            self._drop_gone()
            if any(t.who == who for t in self._line):
                raise LineRefused("you have a try waiting or running on this panel already (in another tab?): "
                                  "its answer comes first; one try at a time per visitor")
            waiting = [t for t in self._line if t.started is None]
            if address is not None:
                mine = sum(t.address == address for t in self._line)
                if mine >= self.per_address:
                    raise LineRefused(f"{mine} tries from your address ({address}) are in line or running already: "
                                      f"visitors who are not signed in get at most {self.per_address} place(s) an "
                                      "address. Sign in for a place of your own, or try again when one has ended")
                open_places = self.waiting - self.kept
                if sum(t.address is not None for t in waiting) >= open_places:
                    raise LineRefused(f"the {open_places} place(s) in line open to visitors who are not signed in "
                                      f"are taken ({self.kept} of the {self.waiting} are kept for signed-in "
                                      "visitors). Sign in, or try again in a few minutes")
            if len(waiting) >= self.waiting:
                raise LineRefused(f"{self.waiting} tries are waiting for this panel's CPU already; try again in a "
                                  f"few minutes (each try is stopped at {self.cap_s:.0f} s)")
            ticket = Ticket(who, self.clock(), address=address)
            self._line.append(ticket)
            return ticket

    def wait(self, ticket: Ticket) -> Iterator[str]:
        """Where `ticket` stands ("2nd in line, about 80 s"), each time it moves and every tick; returns when its turn
        has come. LineRefused when it was dropped meanwhile."""
        while True:
            with self._changed:
                self._drop_gone()
                if ticket not in self._line:
                    raise LineRefused("your place in line was given up (the page stopped asking); try again")
                ticket.seen = self.clock()
                if self._line[0] is ticket:
                    ticket.started = self.clock()
                    return
                where = self._where(ticket)
            yield where
            with self._changed:
                self._changed.wait(self.tick_s)

    def leave(self, ticket: Ticket) -> None:
        """Give up the place (or end the turn); the next one's turn comes. Leaving twice is harmless."""
        with self._changed:
            if ticket in self._line:
                self._line.remove(ticket)
                if ticket.started is not None:
                    self._recent.append(self.clock() - ticket.started)
            self._changed.notify_all()

    def left_s(self, ticket: Ticket) -> float:
        """How long the ticket's turn may still last (its worker is stopped then)."""
        return max(self.cap_s - (self.clock() - ticket.started), 0.0) if ticket.started is not None else self.cap_s

    def place(self, ticket: Ticket) -> int | None:
        """0: its turn; n: n-th in line; None: not in line."""
        with self._changed:
            return self._line.index(ticket) if ticket in self._line else None

    def _where(self, ticket: Ticket) -> str:
        place = self._line.index(ticket)
        typical = sum(self._recent) / len(self._recent) if self._recent else self.cap_s / 4   # a guess, at first
        head = self._line[0]
        ahead_s = max(typical - (self.clock() - head.started), 0.0) if head.started is not None else typical
        about = ahead_s + (place - 1) * typical
        return (f"{ordinal(place)} in line for this panel's CPU, about {about:.0f} s "
                f"(one try at a time, each stopped at {self.cap_s:.0f} s; {self.cap_text(ticket)})")

    def cap_text(self, ticket: Ticket) -> str:
        """The cap that applies to the ticket's holder, in words."""
        if ticket.address is None:
            return "one place per signed-in visitor"
        return (f"at most {self.per_address} place(s) per address for visitors who are not signed in, "
                f"{self.waiting - self.kept} of the {self.waiting} places in line")

    def _drop_gone(self) -> None:
        """Drop a waiter that stopped asking and a turn past its cap (caller holds the lock)."""
        now = self.clock()
        gone = [t for t in self._line if (now - t.started > self.cap_s if t.started is not None
                                          else now - t.seen > self.stale_s)]
        for ticket in gone:
            self._line.remove(ticket)
        if gone:
            self._changed.notify_all()
