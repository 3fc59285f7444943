"""The Sweep tab's handlers on a real Panel over a sweep of synthetic live members (tests/helpers.synthetic_sweep:
each member's jobs a process of its own running the trainer's real stop-order poll, so a stop is seen ending exactly
one): the stated successive halving ordered rung by rung and recorded by the member that obeyed, a stop by hand,
and on a Space only the owner's stop goes through."""

import json
import os
import time

import pytest

from backend.runs.access import Visitor
from backend.runtime import layout
from backend.runtime.records import FINISHED, SWEEP_STOP
from backend.runtime.trainer.sweep_stops import orders_dir
from panel import sweep_view
from tests.fakehub import FakeUser, wait_until
from tests.helpers import synthetic_sweep

pytestmark = pytest.mark.integration

ALICE = "hf_" + "oauth_aliceToken000000000000"
CAROL = "hf_" + "oauth_carolToken0000000000"


def alive(member) -> bool:
    return member.pid is not None and os.path.exists(f"/proc/{member.pid}") and \
        "sweep_member_stub" in open(f"/proc/{member.pid}/cmdline").read()


def stop_events(home: str, member) -> list[dict]:
    folder = os.path.join(home, "buckets", "local", "bench", layout.run_prefix(member.run_id), layout.EVENTS_DIR)
    found = []
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name)) as f:
            found += [r for line in f if (r := json.loads(line)).get("event") == SWEEP_STOP]
    return found


def all_events(home: str, member) -> list[dict]:
    folder = os.path.join(home, "buckets", "local", "bench", layout.run_prefix(member.run_id), layout.EVENTS_DIR)
    return [json.loads(line) for name in sorted(os.listdir(folder)) for line in open(os.path.join(folder, name))]


def orders_folder(home: str, sweep_id: str = "sweep-20260101-000000-abcdef") -> str:
    return os.path.join(home, "buckets", "local", "bench", orders_dir(sweep_id))


def read_all(folder: str) -> list[str]:
    texts = []
    for where, _, names in os.walk(folder):
        for name in names:
            with open(os.path.join(where, name), "rb") as f:
                texts.append(f.read().decode(errors="replace"))
    return texts


def ranked_tags(out: dict) -> list[str]:
    return [row[1] for row in out["sweep_rank"]]


def test_successive_halving_stops_the_worse_half_rung_by_rung_and_records_why(panel):
    home = panel.settings.home
    scores = {"m0": 0.5, "m1": 0.7, "m2": 0.3, "m3": 0.9}
    # 40 steps: 2 versions each; m3 failed (the best score, but it has ended: it takes no part)
    with synthetic_sweep(home, scores, rows=40, failed=("m3",), early_stop_after=2) as members:
        out = sweep_view.on_sweep_show(panel, Visitor(), members["m0"].run_id, None)
        assert ranked_tags(out) == ["m3", "m1", "m0", "m2"]
        assert "Rung 1 due: stopped m2" in out["sweep_note"], out["sweep_note"]
        wait_until(lambda: not alive(members["m2"]), timeout=10)
        assert alive(members["m0"]) and alive(members["m1"]), "only the worse half of those still training"
        [event] = stop_events(home, members["m2"])
        assert event["rung"] == 1 and event["member"] == "m2" and "successive halving" in event["rule"]
        assert event["scores"] == pytest.approx(scores) and event["cancelled"] == [], "it stopped itself"
        assert isinstance(event["ordered_at"], float)

        out = sweep_view.on_sweep_tick(panel, Visitor(), members["m0"].run_id, None)
        assert "rung 2 waits for 4 versions each: m0 (2/4), m1 (2/4)" in out["sweep_note"], out["sweep_note"]
        assert "■ *Stopped:* m2 (successive halving, rung 1" in out["sweep_note"]
        assert stop_events(home, members["m0"]) == [] and alive(members["m0"]), "nothing more before rung 2"

        for tag in ("m0", "m1"):
            members[tag].run.grow(40)          # 4 versions each: rung 2 is due
        for tag in ("m0", "m1"):
            panel.view(members[tag].run_id).expire()
        out = sweep_view.on_sweep_tick(panel, Visitor(), members["m0"].run_id, None)
        assert "Rung 2 due: stopped m0" in out["sweep_note"], out["sweep_note"]
        wait_until(lambda: not alive(members["m0"]), timeout=10)
        assert alive(members["m1"]), "the last member still training is never stopped"
        assert stop_events(home, members["m0"])[0]["rung"] == 2


def test_stop_this_member_stops_only_it_and_records_the_scores_then(panel):
    home = panel.settings.home
    with synthetic_sweep(home, {"m0": 0.5, "m1": 0.7, "m2": 0.3}) as members:
        out = sweep_view.on_sweep_show(panel, Visitor(), members["m1"].run_id, None)
        assert "by hand only" in out["sweep_note"]
        pick = out["sweep_stop_pick"]["value"]
        assert pick.startswith("m2 "), "the worst still training is picked by default"
        assert out["sweep_timer"]["active"] is True, "the tab ticks while a member trains"
        out = sweep_view.on_sweep_stop(panel, Visitor(), members["m1"].run_id, pick, None)
        assert out["sweep_stop_msg"].startswith("Stopped m2"), out["sweep_stop_msg"]
        wait_until(lambda: not alive(members["m2"]), timeout=10)
        assert alive(members["m0"]) and alive(members["m1"])
        [event] = stop_events(home, members["m2"])
        assert event["rule"] == "by hand" and "rung" not in event and event["scores"]["m1"] == pytest.approx(0.7)
        out = sweep_view.on_sweep_show(panel, Visitor(), members["m1"].run_id, None)
        assert [c for c in out["sweep_stop_pick"]["choices"] if c.startswith("m2")] == [], "stopped: not offered"
        assert "Best: **m1**" in out["sweep_best_msg"] and out["sweep_best_file"]["interactive"] is True


def test_the_sweep_tabs_timer_ticks_only_while_a_shown_sweep_has_a_member_training(panel):
    assert sweep_view.on_sweep_show(panel, Visitor(), "", None)["sweep_timer"]["active"] is False, "nothing shown"
    with synthetic_sweep(panel.settings.home, {"m0": 0.5, "m1": 0.7}, failed=("m0", "m1")) as members:
        out = sweep_view.on_sweep_show(panel, Visitor(), members["m0"].run_id, None)
        assert "0 still training" in out["sweep_note"], out["sweep_note"]
        assert out["sweep_timer"]["active"] is False, "every member ended: nothing for a tick to draw"


def test_a_visitor_cannot_stop_a_member_by_naming_another_sweeps_member(panel):
    with synthetic_sweep(panel.settings.home, {"m0": 0.5, "m1": 0.7}) as members:
        out = sweep_view.on_sweep_stop(panel, Visitor(), members["m0"].run_id, "m7 · whatever", None)
        assert "not a member of sweep" in out["sweep_stop_msg"]
        assert alive(members["m0"]) and alive(members["m1"])


@pytest.mark.fake_hub(users={ALICE: FakeUser("alice", {"acme": "write"}), CAROL: FakeUser("carol", {})})
def test_on_a_space_only_the_runs_owner_may_stop_its_members(hub, make_panel):
    panel = make_panel(on_space=True, local_runs="owner", space_owner="acme")
    with synthetic_sweep(panel.settings.home, {"m0": 0.5, "m1": 0.7}) as members:
        for visitor in (Visitor(CAROL, "carol"), Visitor()):
            out = sweep_view.on_sweep_stop(panel, visitor, members["m0"].run_id, f"m0 · {members['m0'].run_id}", None)
            assert out["sweep_stop_msg"].startswith("**Not stopped.**"), out["sweep_stop_msg"]
            shown = sweep_view.on_sweep_show(panel, visitor, members["m0"].run_id, None)
            assert "No sweep to show" in shown["sweep_note"], "an outsider does not even see the sweep"
        assert alive(members["m0"]) and stop_events(panel.settings.home, members["m0"]) == []
        assert not os.path.exists(orders_folder(panel.settings.home)), "a refused stop writes no order"
        out = sweep_view.on_sweep_stop(panel, Visitor(ALICE, "alice"), members["m0"].run_id,
                                 f"m0 · {members['m0'].run_id}", None)
        assert out["sweep_stop_msg"].startswith("Stopped m0"), out["sweep_stop_msg"]
        wait_until(lambda: not alive(members["m0"]), timeout=10)
        assert alive(members["m1"])


def test_a_tick_keeps_the_visitors_stop_pick_while_that_member_trains(panel):
    with synthetic_sweep(panel.settings.home, {"m0": 0.5, "m1": 0.7, "m2": 0.3}) as members:
        mine = f"m0 · {members['m0'].run_id}"
        out = sweep_view.on_sweep_tick(panel, Visitor(), members["m1"].run_id, None, mine)
        assert out["sweep_stop_pick"]["value"] == mine, "a tick must not move the pick to another member"
        out = sweep_view.on_sweep_tick(panel, Visitor(), members["m1"].run_id, None, "m9 · gone")
        assert out["sweep_stop_pick"]["value"].startswith("m2 "), "a pick no longer training: the worst again"


def test_a_local_panels_background_watch_carries_out_the_stated_rule_with_no_page_open(panel):
    home = panel.settings.home
    with synthetic_sweep(home, {"m0": 0.5, "m1": 0.7, "m2": 0.3}, rows=40, early_stop_after=2) as members:
        panel.watch.check()          # the watch's pass (every budget_check_s), no Sweep tab drawn
        wait_until(lambda: not alive(members["m2"]), timeout=10, what="the worst member stopped by the watch")
        assert alive(members["m0"]) and alive(members["m1"]), "only the worse half"
        [event] = stop_events(home, members["m2"])
        assert event["rung"] == 1 and "successive halving" in event["rule"], event
        panel.watch.check()
        assert [len(stop_events(home, members[t])) for t in ("m0", "m1", "m2")] == [0, 0, 1], "a rung only once"


@pytest.mark.fake_hub(users={ALICE: FakeUser("alice", {"acme": "write"})})
def test_on_a_space_the_background_watch_writes_no_order_with_no_sign_in(hub, make_panel):
    panel = make_panel(on_space=True, local_runs="owner", space_owner="acme")
    with synthetic_sweep(panel.settings.home, {"m0": 0.5, "m1": 0.7, "m2": 0.3}, rows=40,
                         early_stop_after=2) as members:     # members that only obey: the panel is all that decides
        panel.watch.check()
        time.sleep(2)           # four polls of every member
        assert all(alive(m) for m in members.values()), "the watch acted with no visitor's sign-in"
        assert stop_events(panel.settings.home, members["m2"]) == []
        assert not os.path.exists(orders_folder(panel.settings.home))


@pytest.mark.fake_hub(users={ALICE: FakeUser("alice", {"acme": "write"})})
def test_on_a_space_the_members_halve_themselves_with_every_page_closed(hub, make_panel):
    """Issue 47's Space case: a signed-in visitor's sweep on a Space, its Sweep tab shown once before rung 1 is due;
    then the page is closed and the panel itself stops (a Space restarting: no session, no token left in it). The
    members' own trainers (the real stop-order code, deciding as a trainer does) order and stop the worst once each
    has its versions, and the one stopped ends itself; the panel started again after that finds it stopped."""
    panel = make_panel(on_space=True, local_runs="owner", space_owner="acme")
    home = panel.settings.home
    with synthetic_sweep(home, {"m0": 0.5, "m1": 0.7, "m2": 0.3}, rows=20, early_stop_after=2,
                         members_decide=True) as members:
        out = sweep_view.on_sweep_show(panel, Visitor(ALICE, "alice"), members["m0"].run_id, None)
        assert "rung 1 waits for 2 versions each" in out["sweep_note"], out["sweep_note"]
        panel.shutdown()        # every page closed and the panel gone with whatever it held
        del panel
        time.sleep(2)
        assert all(alive(m) for m in members.values()) and not os.path.exists(orders_folder(home)), "not due yet"
        for member in members.values():
            member.run.grow(20)          # a second held-out version each: rung 1 is due
        wait_until(lambda: not alive(members["m2"]), timeout=30, what="the worst member stopping itself")
        panel = make_panel(on_space=True, local_runs="owner", space_owner="acme")     # the Space back, no session
        panel.watch.check()      # its background watch adds nothing
        time.sleep(2)
        assert alive(members["m0"]) and alive(members["m1"]), "only the worse half"
        [event] = stop_events(home, members["m2"])
        assert event["rung"] == 1 and event["cancelled"] == [] and event["scores"]["m2"] == pytest.approx(0.3)
        with open(os.path.join(orders_folder(home), "m2.json")) as f:
            order = json.load(f)
        assert order["by"] == "m0" and order["time"] == event["ordered_at"], \
            "decided by the first member still training, not by a page"
        assert sorted(os.listdir(orders_folder(home))) == ["m2.json"], "one rung, one member"
        exit_files = [os.path.join(home, "jobs", j, "exit.json") for j in members["m2"].run.job_ids.values()]
        assert all(json.load(open(p))["stage"] == "COMPLETED" for p in exit_files), "it ended, not cancelled"
        finished = [e for e in all_events(home, members["m2"]) if e["event"] == FINISHED]
        assert finished and finished[0]["time"] >= event["time"], "its end recorded after obeying"
        assert ALICE not in "".join(read_all(os.path.join(home, "buckets"))), "no token in the bucket"
        shown = sweep_view.on_sweep_show(panel, Visitor(ALICE, "alice"), members["m0"].run_id, None)
        assert "■ *Stopped:* m2 (successive halving, rung 1" in shown["sweep_note"], shown["sweep_note"]
