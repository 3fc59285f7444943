"""A sweep's stops, carried out by its members' own trainers: no page open, no token in the panel.

The decision lives in the bucket, beside the sweep's record (`sweeps/<sweep_id>.json`): one stop order per stopped
member, `sweeps/<sweep_id>.stops/<member>.json` (`order_path`), written once by whatever decided it:
- the sweep's stated rule (successive halving, `halving.py`) is decided by the members' trainers themselves: at each
  poll, the first member still training (by its place in the sweep) reads every member's held-out records from the
  bucket and writes the orders of the rung that is due (`SweepStops.apply_rule`). Every engine's trainers have the
  bucket mounted read-write and their owner's token, so this needs no page and no panel;
- the Sweep tab (a stop by hand, for the run's owner only; or the rule, while a page shows the sweep) and a local
  panel's background watch write the same orders (`backend/runs/sweep_control.py`, `Operations.stop_member`).
A member's trainer reads its own order at each poll (`SweepStops.check`) and ends training as at its last step: its
versions stay published, the last ones are evaluated, its final adapter is written, and it records a `sweep_stop`
event with the order's rule and scores (the panel's Sweep tab and its rungs read those events).

Trust: the folder is in the visitor's own bucket, which anything holding write access to it can write. A trainer
obeys only an order at its own sweep's path whose `sweep_id`, `member` and `run_id` are its own (an order copied
from another sweep, or naming another run, is refused, and said once in the log); a sweep id or tag that is not one
is never made into a path. Orders are written once: a second writer (two trainers, or a trainer and a page, deciding
the same rung) finds the first's order and keeps it, and a rung already ordered is not decided again.

Standard library only: it runs in jobs.
"""

import contextlib
import json
import math
import os
import re
import tempfile
import time
from dataclasses import dataclass

from ..best_rule import best_of, newest_best_by, rule_score
from ..job.heartbeat import HeartbeatWatch
from ..layout import EVALS_DIR, FRAGMENT_RE, MEMBER_RE, RUNS_DIR, fragment_records, sweep_record_path
from ..records import FAILED, SWEEP_STOP, TRAINER_ENDS, TRAINER_STAGES
from ..spec_file import read_spec
from ..versions import trainer_events
from .halving import Halving, Stop

POLL_S = 15.0           # how often a trainer looks at its orders (and, the deciding one, at the rule)
POLL_ENV = "GRPO_SWEEP_POLL_S"   # another period, in seconds (a test whose members train a step in seconds)
RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")     # RunSpec's run ids: never a path of its own
BY_HAND = "by hand"


def orders_dir(sweep_id: str) -> str:
    """The sweep's stop orders' folder, relative to the bucket root (ValueError for a sweep id that is not one)."""
    return sweep_record_path(sweep_id).removesuffix(".json") + ".stops"


def order_path(sweep_id: str, member: str) -> str:
    """Member `member`'s stop order, relative to the bucket root (ValueError for a tag that is not one)."""
    if not isinstance(member, str) or not MEMBER_RE.match(member):
        raise ValueError(f"not a sweep member's tag: {member!r:.40}")
    return f"{orders_dir(sweep_id)}/{member}.json"


def stop_order(sweep_id: str, member: str, run_id: str, rule: str, scores: dict, rung: int | None = None,
               by: str = "") -> dict:
    """One member's stop order: whose it is (the sweep, the tag, the run), why (the rule in words, the rung, every
    member's best held-out score then) and who decided it (`by`: a member's tag, or "panel")."""
    order = {"sweep_id": sweep_id, "member": member, "run_id": run_id, "rule": rule, "scores": dict(scores),
             "time": time.time(), "by": by}
    return {**order, "rung": rung} if rung else order


def order_problem(order, sweep_id: str, member: str, run_id: str) -> str | None:
    """Why `order` is not an order this member obeys (None: it is): it must be an object naming this very sweep,
    tag and run."""
    if not isinstance(order, dict):
        return "it is not a JSON object"
    for key, mine in (("sweep_id", sweep_id), ("member", member), ("run_id", run_id)):
        if order.get(key) != mine:
            return f"its {key} is {order.get(key)!r:.80}, not this member's {mine!r}"
    if not isinstance(order.get("rule"), str):
        return "it states no rule"
    return None


def bucket_root(run_dir: str) -> str:
    """The bucket's root as a job mounts it, from a run's folder (<root>/runs/<run_id>)."""
    parent = os.path.dirname(os.path.abspath(run_dir))
    if os.path.basename(parent) != RUNS_DIR:
        raise ValueError(f"{run_dir} is not a run folder of a bucket (<bucket>/{RUNS_DIR}/<run_id>)")
    return os.path.dirname(parent)


def obeyed(run_dir: str, order: dict) -> bool:
    """Whether the member's trainer already obeyed `order` (its `sweep_stop` event names the order's time): a member
    resumed by hand since trains on, and a later order may take the old one's place."""
    return any(e["event"] == SWEEP_STOP and e.get("ordered_at") == order.get("time") for e in trainer_events(run_dir))


def _standing(path: str, root: str) -> bool:
    """Whether an order stands at `path`: one is there, not yet obeyed."""
    try:
        with open(path, "rb") as f:
            order = json.loads(f.read())
    except FileNotFoundError:
        return False
    except (OSError, ValueError):
        return True         # unreadable: left alone (never rewritten over what may be a decision)
    run_id = order.get("run_id") if isinstance(order, dict) else None
    return not (isinstance(run_id, str) and RUN_ID_RE.fullmatch(run_id)     # a run id, never a path of its own
                and os.path.isdir(os.path.join(root, RUNS_DIR, run_id))
                and obeyed(os.path.join(root, RUNS_DIR, run_id), order))


def write_order(root: str, order: dict) -> bool:
    """Write `order` at its path under the bucket root `root`, unless an order not yet obeyed is there (it is kept:
    the first decision stands); whether it was written. Whole or nothing: written aside, then linked into place,
    which fails where the name exists (an obeyed order is replaced by a rename, as on a mount that cannot link)."""
    path = os.path.join(root, order_path(order["sweep_id"], order["member"]))
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    if _standing(path, root):
        return False
    fd, tmp = tempfile.mkstemp(prefix="_tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(json.dumps(order).encode())
        try:
            os.link(tmp, path)
        except OSError:     # there already (an obeyed order: replaced), or no hard links on this mount
            if _standing(path, root):
                return False
            os.replace(tmp, path)
        return True
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def read_orders(root: str, sweep_id: str, record: dict | None = None) -> dict[str, dict]:
    """The sweep's stop orders by member tag: those at a member's own path that name this sweep, that tag and (where
    the sweep's `record` is given) that member's run id. Unreadable or foreign files are skipped."""
    folder = os.path.join(root, orders_dir(sweep_id))
    found = {}
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        tag = name.removesuffix(".json")
        if not name.endswith(".json") or not MEMBER_RE.match(tag):
            continue
        try:
            with open(os.path.join(folder, name), "rb") as f:
                order = json.loads(f.read())
        except (OSError, ValueError):
            continue
        run_id = (record or {}).get("members", {}).get(tag) if record else (order or {}).get("run_id")
        if order_problem(order, sweep_id, tag, run_id) is None:
            found[tag] = order
    return found


def done_rungs(orders: dict[str, dict]) -> int:
    """The highest halving rung already ordered."""
    return max((o["rung"] for o in orders.values() if type(o.get("rung")) is int), default=0)


@dataclass(frozen=True)
class MemberState:
    """One member as the rule reads it from the bucket (the fields `halving.py` needs)."""

    tag: str
    run_id: str
    live: bool
    versions: int
    best_score: float | None
    order: int


def held_out_records(run_dir: str, seen: dict | None = None) -> dict[int, dict]:
    """The run's held-out evaluation records by version (runtime/trainer/evaluate.py writes them in evals/), only what
    ranking needs of each (its score and reward means, not its samples). `seen`: fragments read before, by path
    (they are write-once: each is read once per process)."""
    folder = os.path.join(run_dir, EVALS_DIR)
    seen = {} if seen is None else seen
    out = {}
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        path = os.path.join(folder, name)
        if not FRAGMENT_RE.match(name):
            continue
        if path not in seen:
            with open(path, "rb") as f:
                records, _ = fragment_records(f.read())
            seen[path] = {r["policy_version"]: {k: r.get(k) for k in ("score", "rewards")}
                          for r in records if r and type(r.get("policy_version")) is int}
        out.update(seen[path])
    return out


def best_held_out(records: dict[int, dict], best_by: dict) -> tuple[int, float | None]:
    """(versions evaluated beyond the base model, the best one's score), as the Sweep tab ranks a member: the run's
    best version where one beats the base model, else its highest-scoring version."""
    scored = {v: s for v, r in records.items() if v >= 1 and (s := rule_score(r, best_by)) is not None}
    best, _ = best_of({**scored, **({0: rule_score(records[0], best_by)} if 0 in records else {})})
    if best is None and scored:
        best = min(scored, key=lambda v: (-scored[v], v))
    return len(scored), scored.get(best) if best is not None else None


def ended(run_dir: str) -> bool:
    """Whether the member's trainer has ended: its newest start or end is an end."""
    stages = [e for e in trainer_events(run_dir) if e["event"] in TRAINER_STAGES]
    last = max(stages, key=lambda e: e.get("time", 0), default=None)
    if last is None or last["event"] not in TRAINER_ENDS:
        return False
    # A failure a retry may fix starts the job again: its heartbeat, not this event, says whether it is gone.
    return not (last["event"] == FAILED and last.get("retry") is not False)


def poll_period() -> float:
    """POLL_S, or the seconds POLL_ENV gives; anything but a positive finite number is refused by name (ValueError)."""
    text = os.environ.get(POLL_ENV, "").strip()
    if not text:
        return POLL_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{POLL_ENV}={text!r}: give a positive number of seconds (how often a sweep member's trainer "
                         f"looks at its stop orders), or unset it for {POLL_S:.0f}")
    return value


class SweepStops:
    """A member's trainer's side of its sweep's stops: its own order, and (while it is the first member still
    training) the stated rule carried out for every member. `check()` at every training step; it reads the bucket
    at most every `poll_s`."""

    def __init__(self, run_dir: str, spec: dict, poll_s: float | None = None, clock=time.monotonic, log=print,
                 decide: bool = True):
        self.run_dir, self.clock, self.log = run_dir, clock, log
        self.poll_s = poll_period() if poll_s is None else poll_s
        self.decide = decide        # False: obey orders only (a test of the panel's own orders)
        self.sweep_id = spec.get("sweep_id") or ""
        self.member = spec.get("sweep_member") or ""
        self.run_id = spec.get("run_id") or os.path.basename(run_dir.rstrip("/"))
        self.root = bucket_root(run_dir) if self.sweep_id and self.member else ""
        self.last: float | None = None
        self.said: set[str] = set()
        self.heartbeats: dict[str, HeartbeatWatch] = {}
        self.best_by: dict[str, dict] = {}
        self.evals_seen: dict[str, dict] = {}      # evals fragments read, by path (write-once: read once)

    @property
    def active(self) -> bool:
        return bool(self.root)

    def check(self) -> dict | None:
        """This member's order, where it has one to obey now; None otherwise (not yet due, or none)."""
        now = self.clock()
        if not self.active or (self.last is not None and now - self.last < self.poll_s):
            return None
        self.last = now
        try:
            if self.decide:
                self.apply_rule()
        except (OSError, ValueError, KeyError, TypeError) as error:
            self._say(f"the sweep's early-stop rule could not be checked ({error}): trying again at the next poll")
        return self.mine()

    def mine(self) -> dict | None:
        """This member's own order, where the bucket holds one it obeys (see the module: only its own)."""
        try:
            path = os.path.join(self.root, order_path(self.sweep_id, self.member))
            with open(path, "rb") as f:
                order = json.loads(f.read())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as error:
            self._say(f"this member's stop order cannot be read ({error}): training on")
            return None
        problem = order_problem(order, self.sweep_id, self.member, self.run_id)
        if problem:
            self._say(f"a stop order at {path} is not this member's ({problem}): not obeyed, training on")
            return None
        if obeyed(self.run_dir, order):
            self._say(f"this member's stop order ({order['rule']}) was obeyed before it was resumed: training on")
            return None
        return order

    def record(self) -> dict:
        with open(os.path.join(self.root, sweep_record_path(self.sweep_id)), "rb") as f:
            record = json.loads(f.read())
        if record.get("sweep_id") != self.sweep_id or record.get("members", {}).get(self.member) != self.run_id:
            raise ValueError(f"the sweep's record does not name this run as member {self.member}")
        return record

    def apply_rule(self) -> Stop | None:
        """Where this member is the first still training and the next rung is due: the orders of the members it
        stops, written once; the decision (None where nothing was ordered)."""
        record = self.record()
        after = (record.get("early_stop") or {}).get("after_versions")
        if not isinstance(after, int) or isinstance(after, bool) or after <= 0:
            return None
        orders = read_orders(self.root, self.sweep_id, record)
        members = record["members"]
        if not all(isinstance(r, str) and RUN_ID_RE.fullmatch(r) and ".." not in r and MEMBER_RE.match(t)
                   for t, r in members.items()):
            raise ValueError("the sweep's record names a member that is not a sweep member's tag and run id")
        states = [self.state(tag, run_id, orders) for tag, run_id in members.items()]
        live = sorted((s for s in states if s.live), key=lambda s: s.order)
        if not live or live[0].tag != self.member:
            return None         # another member decides (the first still training), or this one is stopping
        decision = Halving(after).decide(states, done_rungs(orders))
        if decision is None:
            return None
        by_tag = {s.tag: s for s in states}
        for tag in decision.stopped:
            order = stop_order(self.sweep_id, tag, by_tag[tag].run_id, decision.rule, decision.scores,
                               decision.rung, by=self.member)
            if write_order(self.root, order):
                self.log(f"sweep {self.sweep_id}: {decision.rule}: ordered {tag} to stop", flush=True)
        return decision

    def state(self, tag: str, run_id: str, orders: dict) -> MemberState:
        run_dir = os.path.join(self.root, RUNS_DIR, run_id)
        if tag not in self.best_by:
            try:
                self.best_by[tag] = dict(read_spec(run_dir).get("best_by") or {})
            except (OSError, ValueError):
                self.best_by[tag] = {}
        rule = newest_best_by(run_dir)
        records = held_out_records(run_dir, self.evals_seen)
        versions, score = best_held_out(records, self.best_by[tag] if rule is None else rule)
        standing = tag in orders and not obeyed(run_dir, orders[tag])
        if tag == self.member:
            live = not standing
        else:
            beat = self.heartbeats.setdefault(tag, HeartbeatWatch(run_dir))
            live = not standing and not ended(run_dir) and not beat.gone()
        return MemberState(tag, run_id, live, versions, score, int(tag[1:]) if tag[1:].isdigit() else 10**6)

    def _say(self, text: str) -> None:
        if text not in self.said:
            self.said.add(text)
            self.log(text, flush=True)


def stop_event_fields(order: dict) -> dict:
    """The `sweep_stop` event a member records when it obeys `order` (nothing was cancelled: it stopped itself)."""
    fields = {"sweep_id": order["sweep_id"], "member": order["member"], "rule": order["rule"],
              "scores": order.get("scores") if isinstance(order.get("scores"), dict) else {}, "cancelled": [],
              "ordered_at": order.get("time")}
    return {**fields, "rung": order["rung"]} if type(order.get("rung")) is int else fields

