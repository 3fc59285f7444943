"""The runs list's table: the visitor's runs across their registries, newest first, a sweep's members together,
filtered by status and text; rows built once for an ended run and kept between ticks. Part of `Panel`
(panel/actions.py)."""

import heapq
import logging
import time
from dataclasses import dataclass

from backend.plan.jobspec import TERMINAL_STAGES
from backend.runs.access import Visitor
from backend.runs.notes import RunNotes
from panel.runs_list import RUN_FILTERS, name_cell, progress_bar, run_badge
from panel.spend_view import cost_cell
from panel.visitors import as_visitor

log = logging.getLogger(__name__)

ENDED_ROW_S = 60.0         # an ended run's row in the runs list is built again this often (its last steps may arrive)
RUNS_PAGE = 50             # the runs list shows the newest runs; older ones are opened by id
KEPT_TABLES = 64           # runs tables (by visitor's registries, filter and query) kept between listings


@dataclass(frozen=True)
class KeptTable:
    """A runs table as built from its registries' listings: while they are the same lists (a registry lists again
    every few seconds) and no kept row has expired, a tick rebuilds only the rows of live runs (None here)."""

    listings: tuple
    rows: list                  # (run, registry, row or None) in the order shown
    until: float                # time.monotonic() when the first kept row expires

    def serves(self, listings: tuple) -> bool:
        return (len(listings) == len(self.listings) and all(a is b for a, b in zip(listings, self.listings))
                and time.monotonic() < self.until)


class RunsTable:
    """The runs list's part of `Panel`: the table of the visitor's runs, newest first, each ended run's row and each
    listing's rows kept between ticks. Reads the panel's `runs`, `spend` and `operations`."""

    def runs_table(self, visitor: Visitor | str | None = None, with_cost: bool = True,
                   limit: int = RUNS_PAGE, query: str = "", status: str = "all") -> list[list]:
        """The newest `limit` runs (RUNS_HEADERS), optionally only those whose id or name contains `query` and
        whose status is `status` (a RUN_FILTERS key)."""
        visitor = as_visitor(visitor)
        registries = self.runs.registries(visitor)
        listings = self.runs.listings(visitor, registries)
        key = (tuple(id(r) for r in registries), with_cost, limit, (query or "").strip().lower(), status)
        kept = self._tables.get(key)
        if kept is not None and kept.serves(listings):
            # The same listings: the same runs are shown, and only the live ones' rows can have changed.
            return [self._run_row(run, registry, with_cost)[2] if row is None else row
                    for run, registry, row in kept.rows]
        shown = self._shown_runs(registries, listings, with_cost, limit, key[3], status)
        self._tables[key] = self._kept_table(listings, shown, with_cost)
        while len(self._tables) > KEPT_TABLES:      # visitors' queries must not grow it without end
            self._tables.pop(next(iter(self._tables)))
        return [row for _run, _registry, row in shown]

    def _shown_runs(self, registries, listings, with_cost: bool, limit: int, q: str, status: str) -> list[tuple]:
        """(run, registry, row) of the runs the table shows, newest first."""
        # Each registry lists its runs newest first: merged lazily, a listing reads the runs it shows (and those
        # the filter skips), not every run ever made.
        runs = heapq.merge(*(((run, registry) for run in listing) for registry, listing in zip(registries, listings)),
                           key=lambda pair: -pair[0].created_at)
        wanted = RUN_FILTERS.get(status) or ()
        shown, sweeps = [], []
        for run, registry in runs:
            if wanted and run.stage not in wanted:
                continue
            name, sweep, row = self._run_row(run, registry, with_cost)
            if q and q not in run.run_id.lower() and q not in name.lower():
                continue
            shown.append((run, registry, row))
            sweeps.append(sweep or f"run:{len(shown)}")
            if len(shown) == limit:
                break
        return grouped(shown, sweeps)

    def _kept_table(self, listings: tuple, shown: list[tuple], with_cost: bool) -> KeptTable:
        """`shown` kept for the next ticks: an ended run's row as built (until the first one expires), a live run's
        as None (built at each tick)."""
        until, rows = time.monotonic() + ENDED_ROW_S, []
        for run, registry, row in shown:
            kept = self._rows.get((id(registry), run.run_id, with_cost))
            rows.append((run, registry, row if kept is not None else None))
            if kept is not None:
                until = min(until, kept[1])
        return KeptTable(listings, rows, until)

    def _run_row(self, run, registry, with_cost: bool) -> tuple[str, str, list]:
        """(the run's name cell, the sweep it is a member of or "", its row). An ended run's row is kept for
        ENDED_ROW_S (its last steps and cost may still be read meanwhile): a tick builds the rows of live runs, not
        the same rows of every ended one again."""
        key = (id(registry), run.run_id, with_cost)
        signature = (tuple(sorted(run.stages.items())), run.timed_out, run.unreadable, run.launch_failed)
        kept = self._rows.get(key)
        if kept and kept[0] == signature and time.monotonic() < kept[1]:
            return kept[2]
        spec, cost = {}, ""
        if with_cost:
            try:
                # A view open or watched already supplies the steps: no second reader of the run's metrics.
                run_cost, spec = self.spend.cost(registry, run.run_id, registry.watched_view(run.run_id))
                cost = cost_cell(run_cost, float(spec.get("budget_usd") or 0.0))
            except Exception as exc:   # a failing price list or bucket must not break the runs list
                log.debug("no cost for run %s: %s", run.run_id, exc)
                cost = "-"
        sweep = str(spec.get("sweep_id") or "")
        notes = self._run_notes(registry, run)
        name = name_cell(notes.name or str(spec.get("name") or ""), notes.tags, sweep)
        glance = self.spend.glance(registry, run.run_id, registry.watched_view(run.run_id)) if with_cost else None
        latest, best = (glance.latest, glance.best.text) if glance is not None else ({}, "")
        reward = latest.get("reward")
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(run.created_at))
        row = [run.run_id, name, run_badge(run), progress_bar(latest.get("step"), spec.get("max_steps")),
               f"{reward:.3f}" if isinstance(reward, (int, float)) else "", best, cost,
               str(spec.get("mode") or ""), registry.executor.name, created]
        if run.stages and all(stage in TERMINAL_STAGES for stage in run.stages.values()):
            self._rows[key] = (signature, time.monotonic() + ENDED_ROW_S, (name, sweep, row))
        else:
            self._rows.pop(key, None)
        return name, sweep, row

    def _run_notes(self, registry, run) -> RunNotes:
        """The run's notes as kept in its folder (none where its bucket is unknown)."""
        if not run.bucket:
            return RunNotes()
        return self.operations.notes.read(registry.store_for(run.bucket), run.bucket, run.run_id)

    def _forget_rows(self, run_id: str) -> None:
        """The runs list shows the run's new name and tags at its next tick, not its kept row."""
        for key in [k for k in self._rows if k[1] == run_id]:
            self._rows.pop(key, None)
        self._tables.clear()


def grouped(shown: list, groups: list[str]) -> list:
    """`shown` with the members of one sweep together, where its first (newest) member stands; each group's own
    order kept, and a lone run a group of its own."""
    order: dict[str, list] = {}
    for each, group in zip(shown, groups):
        order.setdefault(group, []).append(each)
    return [each for members in order.values() for each in members]
