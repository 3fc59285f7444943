"""The CPU "Try it" line (`backend.outcome.try_line.TryLine`): order, one place per visitor (a signed-in one by name,
one who is not by address, capped), places kept for signed-in visitors, leaving, the bound.
Time is a stand-in clock; a waiter is its real `wait` generator, advanced as Gradio advances a try's."""

import threading

import pytest

from backend.outcome.try_line import LineRefused, TryLine, ordinal

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock()


def line(clock, waiting=3, cap_s=100.0, stale_s=30.0) -> TryLine:
    return TryLine(waiting=waiting, cap_s=cap_s, stale_s=stale_s, tick_s=0.01, clock=clock)


def turn(queue: TryLine, ticket) -> None:
    """Claim the ticket's turn (its wait ends at once)."""
    assert list(queue.wait(ticket)) == [], "it was not its turn"


def test_tries_run_one_at_a_time_in_the_order_asked_and_each_waiter_sees_its_place(clock):
    queue = line(clock)
    alice, bob, carol = queue.join("alice"), queue.join("bob"), queue.join("carol")
    turn(queue, alice)
    clock.now += 10
    bob_waits, carol_waits = queue.wait(bob), queue.wait(carol)
    # No try has finished yet: a quarter of the cap is the guess for one; alice's has run 10 s of it.
    assert next(bob_waits) == ("1st in line for this panel's CPU, about 15 s (one try at a time, each stopped at "
                               "100 s; one place per signed-in visitor)")
    assert next(carol_waits).startswith("2nd in line for this panel's CPU, about 40 s")
    assert [queue.place(t) for t in (alice, bob, carol)] == [0, 1, 2]
    clock.now += 30
    queue.leave(alice)        # 40 s: now the typical try
    with pytest.raises(StopIteration):
        next(bob_waits)       # bob's turn
    assert next(carol_waits).startswith("1st in line for this panel's CPU, about 40 s")
    queue.leave(bob)
    with pytest.raises(StopIteration):
        next(carol_waits)
    assert queue.place(carol) == 0 and queue.place(alice) is None


def test_a_waiter_blocked_in_a_thread_gets_its_turn_when_the_one_ahead_leaves(clock):
    queue = TryLine(waiting=3, cap_s=100.0, tick_s=5.0, clock=clock)     # a long tick: woken by the leave itself
    alice, bob = queue.join("alice"), queue.join("bob")
    turn(queue, alice)
    seen, done = [], threading.Event()

    def bob_try():
        seen.extend(queue.wait(bob))
        done.set()

    thread = threading.Thread(target=bob_try)
    thread.start()
    queue.leave(alice)
    assert done.wait(30), "bob never got his turn"
    thread.join()
    assert queue.place(bob) == 0 and all(s.startswith("1st in line") for s in seen)


def test_one_try_at_a_time_per_visitor(clock):
    queue = line(clock)
    alice = queue.join("user:alice")
    with pytest.raises(LineRefused, match="you have a try waiting or running on this panel already"):
        queue.join("user:alice")                 # running
    bob = queue.join("user:bob")
    with pytest.raises(LineRefused, match="one try at a time per visitor"):
        queue.join("user:bob")                   # waiting
    turn(queue, alice)
    queue.leave(alice)
    assert queue.join("user:alice") is not None, "her try ended: she may ask again"
    assert queue.place(bob) == 0


def test_the_line_is_bounded_and_a_full_line_refuses_with_the_bound(clock):
    queue = line(clock, waiting=2)
    turn(queue, queue.join("a"))
    b = queue.join("b")
    queue.join("c")
    with pytest.raises(LineRefused, match=r"2 tries are waiting for this panel's CPU already; try again in a few "
                                          r"minutes \(each try is stopped at 100 s\)"):
        queue.join("d")
    queue.leave(b)
    assert queue.join("d") is not None, "a place came free"


def test_a_visitor_who_leaves_gives_up_their_place(clock):
    queue = line(clock)
    alice, bob, carol = queue.join("alice"), queue.join("bob"), queue.join("carol")
    turn(queue, alice)
    bob_waits, carol_waits = queue.wait(bob), queue.wait(carol)
    next(bob_waits), next(carol_waits)
    bob_waits.close()          # his try's generator closed (cancelled, tab closed): its `finally` leaves
    queue.leave(bob)
    assert next(carol_waits).startswith("1st in line")
    queue.leave(alice)
    with pytest.raises(StopIteration):
        next(carol_waits)


def test_a_waiter_that_stopped_asking_is_dropped_and_a_turn_ends_at_the_cap(clock):
    """Whatever a caller fails to do: a suspended waiter (its page gone, never closed) and a turn never ended
    hold no one up past `stale_s` and `cap_s`."""
    queue = line(clock, cap_s=100.0, stale_s=30.0)
    alice, bob, carol = queue.join("alice"), queue.join("bob"), queue.join("carol")
    turn(queue, alice)
    bob_waits, carol_waits = queue.wait(bob), queue.wait(carol)
    next(bob_waits), next(carol_waits)
    clock.now += 20
    next(carol_waits)          # carol still asks; bob's generator is left suspended
    clock.now += 20
    assert next(carol_waits).startswith("1st in line"), "bob, silent for 40 s, lost his place"
    with pytest.raises(LineRefused, match="your place in line was given up"):
        next(bob_waits)
    for _ in range(2):
        clock.now += 20
        assert next(carol_waits).startswith("1st in line")
    clock.now += 21            # alice's turn began 101 s ago: past the cap, though she never left
    with pytest.raises(StopIteration):
        next(carol_waits)
    assert queue.place(alice) is None and queue.left_s(carol) == 100.0
    queue.leave(alice)         # her late leave changes nothing
    assert queue.place(carol) == 0


def test_ordinals():
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st", "111th"]


def test_six_anonymous_sessions_from_one_address_hold_at_most_their_cap_and_a_signed_in_visitor_still_gets_a_place(
        clock):
    """One person opening six sessions (six session keys, one address) holds at most `per_address` places; visitors
    who are not signed in hold at most the places not kept for signed-in ones; a signed-in visitor is never starved.
    Each waiter is told its place and the cap that applies to it."""
    queue = TryLine(waiting=4, cap_s=100.0, tick_s=0.01, clock=clock, per_address=2, kept=1)
    held, refused = [], []
    for n in range(6):
        try:
            held.append(queue.join(f"session:{n}", "203.0.113.7"))
        except LineRefused as exc:
            refused.append(str(exc))
    assert len(held) == 2 and len(refused) == 4, refused
    assert all("at most 2 place(s) an address" in r and "203.0.113.7" in r and "Sign in" in r for r in refused)
    turn(queue, held[0])
    assert next(queue.wait(held[1])).endswith(
        "; at most 2 place(s) per address for visitors who are not signed in, 3 of the 4 places in line)")
    # Others who are not signed in, each from an address of their own, take the places open to them, and no more.
    others = [queue.join(f"session:o{n}", f"198.51.100.{n}") for n in range(2)]
    with pytest.raises(LineRefused, match="3 place\\(s\\) in line open to visitors who are not signed in are taken"):
        queue.join("session:late", "198.51.100.9")
    signed_in = queue.join("user:carol")
    assert next(queue.wait(signed_in)).startswith("4th in line") and queue.place(signed_in) == 4
    with pytest.raises(LineRefused, match="4 tries are waiting"):
        queue.join("user:dave")         # the line's bound still holds for everyone
    for ticket in (held[0], *others):
        queue.leave(ticket)
    assert queue.join("session:6", "203.0.113.7").address == "203.0.113.7", "a place given back is taken again"


def test_the_address_of_a_visitor_on_a_space_is_the_one_hugging_faces_edge_saw():
    """Behind a Space's proxy the TCP peer is an internal address every visitor shares; the client's address is the
    rightmost public entry of X-Forwarded-For (entries a client writes itself stand to its left). Off a Space the
    header is the client's own word: the peer is used."""
    from panel.client_address import client_address, forwarded_client

    forged = {"x-forwarded-for": "1.2.3.4, 93.184.216.34, 10.16.3.80"}      # forged, the edge's, an internal hop
    assert client_address(forged, "10.16.3.1", on_space=True) == "93.184.216.34"
    assert client_address(forged, "192.0.2.5", on_space=False) == "192.0.2.5"
    assert forwarded_client("10.0.0.1, 10.16.3.80", "10.16.3.1") == "10.16.3.80", "all internal: the nearest"
    assert client_address({}, "10.16.3.1", on_space=True) == "10.16.3.1"
