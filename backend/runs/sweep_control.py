"""A launched sweep's control: its record read from the bucket, a member's stop order (as the sweep's own rule gives
it, `runtime/trainer/sweep_stops.py`), the orders standing, and Cancel sweep."""

import json

from backend.runs.access import Visitor
from backend.runtime import layout, records
from backend.runtime.trainer import sweep_stops


class SweepControl:
    """Part of `Operations` (`operations.py`), whose state and other parts it uses: `runs`; who may, and Cancel
    run (`RunControl`)."""

    def sweep_members(self, run_id: str, visitor: Visitor) -> tuple[str, dict[str, str], str]:
        """The sweep `run_id` is a member of, its members' run ids by tag and its shared fleet's id ("" where each
        member started its own replicas), from the sweep's record in the bucket; KeyError where the run is not this
        visitor's or not a sweep member."""
        record = self.sweep_record(run_id, visitor)
        return record["sweep_id"], record["members"], record["fleet"]

    def sweep_record(self, run_id: str, visitor: Visitor) -> dict:
        """The record (`SweepSpec.record`) of the sweep `run_id` is a member of, its members as {tag: run id}; read
        only for a visitor who sees the run (KeyError otherwise, or where the run is not a sweep member)."""
        registry = self.runs.find(run_id, visitor)
        store = registry.store_for(registry.run_bucket(run_id))
        try:
            spec = json.loads(store.read_bytes(f"{layout.run_prefix(run_id)}/{layout.SPEC_FILE}"))
            sweep_id = spec.get("sweep_id") if isinstance(spec, dict) else None
        except Exception as exc:    # no spec.json yet, or unreadable
            raise KeyError(f"Run {run_id}'s spec.json cannot be read ({exc}): cancel its jobs with Cancel run.") \
                from None
        if not sweep_id:
            raise KeyError(f"Run {run_id} is not a member of a sweep: Cancel run stops it.")
        try:
            record = json.loads(store.read_bytes(layout.sweep_record_path(sweep_id)))
            members = {str(tag): str(member) for tag, member in record["members"].items()}
        except Exception as exc:
            raise KeyError(f"Sweep {sweep_id}'s record cannot be read ({exc}): cancel its members one by one.") \
                from None
        settings = record.get("settings") if isinstance(record.get("settings"), dict) else {}
        early = record.get("early_stop") if isinstance(record.get("early_stop"), dict) else {}
        after = early.get("after_versions")
        budget = record.get("budget_usd")
        return {"sweep_id": str(sweep_id), "members": members,
                "budget_usd": float(budget) if type(budget) in (int, float) and budget > 0 else 0.0,
                "fleet": record.get("fleet") if isinstance(record.get("fleet"), str) else "",
                "settings": {tag: s for tag, s in settings.items() if isinstance(s, dict)},
                "early_stop_after": after if isinstance(after, int) and not isinstance(after, bool) and after > 0
                else 0}

    def stop_member(self, run_id: str, visitor: Visitor, sweep_id: str, member: str, rule: str, scores: dict,
                    rung: int | None = None) -> bool:
        """Order one member of a sweep to stop (Cancel run's check: on a Space only the run's owner), as the sweep's
        own rule does with no page open: its stop order in the bucket (`runtime/trainer/sweep_stops.py`), which the
        member's trainer obeys at its next step, ending as at its last (versions published, final adapter written) and
        recording why as its `sweep_stop` event (the rule, every member's best held-out score then). Whether the
        order was written: False where one not yet obeyed stands (the first decision is kept). No job is cancelled
        and no token is written: Cancel run stops a member at once."""
        registry, _ = self._registry_for_control(run_id, visitor)
        record = self.sweep_record(run_id, visitor)
        if record["sweep_id"] != sweep_id or record["members"].get(member) != run_id:
            raise KeyError(f"Run {run_id} is not member {member} of sweep {sweep_id}.")
        store = registry.store_for(registry.run_bucket(run_id))
        path = sweep_stops.order_path(sweep_id, member)
        there = self.sweep_orders(run_id, visitor, record).get(member)
        if there is not None and not self._obeyed(store, run_id, there):
            return False        # one stands: the first decision is kept
        order = sweep_stops.stop_order(sweep_id, member, run_id, rule, scores, rung, by="panel")
        store.write_bytes(path, json.dumps(order).encode())
        return True

    def sweep_orders(self, run_id: str, visitor: Visitor, record: dict | None = None) -> dict[str, dict]:
        """The stop orders of the sweep `run_id` is a member of (obeyed or not), by member tag: only those at a
        member's own path naming that sweep, tag and run id (`sweep_stops.order_problem`)."""
        record = record or self.sweep_record(run_id, visitor)
        registry = self.runs.find(run_id, visitor)
        store = registry.store_for(registry.run_bucket(run_id))
        folder = sweep_stops.orders_dir(record["sweep_id"])
        there = {f.path.rsplit("/", 1)[-1] for f in store.list_files(folder + "/")}
        found = {}
        for tag, member_id in record["members"].items():
            if not layout.MEMBER_RE.match(tag) or f"{tag}.json" not in there:
                continue
            try:
                order = json.loads(store.read_bytes(f"{folder}/{tag}.json"))
            except ValueError:      # not JSON: not an order anyone obeys
                order = None
            if sweep_stops.order_problem(order, record["sweep_id"], tag, member_id) is None:
                found[tag] = order
        return found

    @staticmethod
    def _obeyed(store, run_id: str, order: dict) -> bool:
        """Whether the member's trainer recorded obeying `order` (a `sweep_stop` event naming its time)."""
        prefix = f"{layout.run_prefix(run_id)}/{layout.EVENTS_DIR}/"
        for stored in store.list_files(prefix):
            name = stored.path.rsplit("/", 1)[-1]
            match = layout.FRAGMENT_RE.match(name)
            if not match or match["writer"] != layout.TRAINER_WRITER:
                continue
            events, _ = layout.fragment_records(store.read_bytes(stored.path))
            if any(e and e.get("event") == records.SWEEP_STOP and e.get("ordered_at") == order.get("time")
                   for e in events):
                return True
        return False

    def cancel_sweep(self, run_id: str, visitor: Visitor) -> tuple[str, dict[str, list[str]], tuple | None]:
        """Cancel every member of the sweep `run_id` belongs to, each as Cancel run would (who may, which jobs), then
        its shared fleet (after its trainers, which record their end first): the sweep's id, the job ids stopped
        by member run id, and (the fleet's id, its job ids stopped) where the members shared one, else None."""
        sweep_id, members, fleet = self.sweep_members(run_id, visitor)
        stopped = {member: self.cancel(member, visitor) for member in members.values()}
        return sweep_id, stopped, ((fleet, self.cancel(fleet, visitor)) if fleet else None)
