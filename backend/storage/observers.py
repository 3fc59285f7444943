"""Incremental readers of what jobs write into the bucket. Each refresh reads only what is new.

Fragments are write-once JSONL files numbered per writer (`<writer>-000042.jsonl`): a fully read fragment is
never read again, and a fragment whose last line is torn (a writer that appends, or a copy in progress) is
re-read from the end of its last complete line on the next refresh. `FragmentReader` asks only for the next
few numbers of each writer it knows (one cheap `sizes` call), and lists the whole folder only now and then to
find new writers; that re-listing runs in a thread of its own and what it found is read on the next refresh, so no
refresh ever waits for a walk of the whole folder (on the Hub, a paginated HTTP walk), and a refresh costs what is
new, not what the folder holds. A complete line that is not a record (not JSON, not an object, or refused by the
caller's check) is skipped and counted per fragment. (Adapter folders: `adapters.py`.)
"""

import logging
import math
import posixpath
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from backend.runtime import layout
from backend.storage.store import BucketStore, StoredFile

log = logging.getLogger(__name__)


@dataclass
class FragmentCursor:
    """Which fragment files are done, and how far into each unfinished one we have read."""

    offsets: dict[str, int] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)
    bad: dict[str, int] = field(default_factory=dict)     # fragment path -> lines skipped as unreadable


def read_new_records(store: BucketStore, folder: str, cursor: FragmentCursor,
                     check: Callable[[dict], bool] | None = None) -> list[tuple[str, dict]]:
    """(writer, record) pairs added under `folder` since `cursor`, in fragment order. A line that is not a JSON
    object, or that `check` refuses, is skipped and counted in `cursor.bad`."""
    out = []
    for f in store.list_files(folder):
        match = layout.FRAGMENT_RE.match(posixpath.basename(f.path))
        if match and f.path not in cursor.done and cursor.offsets.get(f.path, 0) < f.size:
            out += _records(store, f.path, cursor.offsets.get(f.path, 0), f.size, cursor, match.group("writer"), check)
    return out


RESCAN_MIN_S, RESCAN_MAX_S = 2.0, 60.0
RESCAN_COST_FACTOR = 200     # list the folder at most once per this many times what one listing took
PROBE_AHEAD = 4              # next fragment numbers asked for, per writer, per call
BATCH_RECORDS = 5000         # records handed over at a time
PREFETCH_FILES = 500         # fragments asked of the store in one batch (one download on the Hub)
SEARCH_POINTS = 16           # fragment numbers asked for, per writer, per step of a first look's search
LIST_FIRST_BELOW = 1000      # a first look lists a folder whose searched writers hold fewer fragments than this


class FragmentReader:
    """The new records of one folder of fragments, read from a cursor: the one incremental reader of every folder of
    fragments (metrics, events, samples, and any folder a new writer adds).

    The first read lists a small folder. In a large one (its `defer` and `latest_only` writers hold LIST_FIRST_BELOW
    fragments or more) it reads only their newest fragments, found by searching their numbers, and the next read
    starts a listing in the background: the read after that listing sets the older fragments aside (`defer`) or
    skips them (`latest_only`) and reads what the other writers wrote. After that the reader probes each known
    writer's next fragment numbers (a writer it has read, and each one `defer` or `latest_only` names, written yet
    or not) and any fragment left torn, so a refresh with nothing new is one `sizes` call; a re-listing, which
    finds new writers (and fragments a probe cannot reach), is started at most every `rescan_s`, a time that grows
    with what a listing costs, in a thread of its own: its fragments are read by the first refresh after it ends,
    and only those past what the reader knew when it began, so that refresh costs what is new too."""

    def __init__(self, store: BucketStore, folder: str, check: Callable[[dict], bool] | None = None,
                 clock: Callable[[], float] = time.monotonic, latest_only: dict[str, int] | None = None,
                 defer: dict[str, int] | None = None, background: bool = True, list_below: int | None = None):
        """`latest_only` maps writers whose records are snapshots (each replaces the last) to how many of their
        newest fragments are worth reading: a first look skips the rest. `defer` maps writers whose history a
        first look may leave for later to how many of their newest fragments it reads now: the older ones are
        set aside in `deferred` (marked read here) for `read_deferred`, so a long run opens at once. `list_below`
        (LIST_FIRST_BELOW by default): how many fragments those writers hold before a first look stops listing.
        Without `background`, a due re-listing is done by the read itself (a one-off reader that is not on a
        timer)."""
        self.store, self.folder, self.check, self.clock = store, folder.rstrip("/"), check, clock
        self.latest_only = latest_only or {}
        self.defer = defer or {}
        self.background = background
        self.list_below = LIST_FIRST_BELOW if list_below is None else list_below
        self._window: dict[str, int] = {}        # writer -> the first fragment number a first look read of it
        self.deferred: list[StoredFile] = []     # older fragments a first look left for `read_deferred`
        self.cursor = FragmentCursor()
        self.next_seq: dict[str, int] = {}       # writer -> the first fragment number not read yet
        self.rescan_s = RESCAN_MIN_S
        self.listed_at = float("-inf")
        self._lister: threading.Thread | None = None
        self._listed: tuple[list[StoredFile], float] | None = None   # a background listing's news, its cost

    def expect(self, writer: str) -> None:
        """A writer this process knows has started (the panel's own): probe it from now on, not after a listing."""
        self.next_seq.setdefault(writer, 0)

    def read(self, full: bool = False) -> list[tuple[str, dict]]:
        """(writer, record) pairs written since the last read; `full` lists the folder whatever the schedule."""
        return [pair for batch in self.batches(full) for pair in batch]

    def batches(self, full: bool = False, size: int = BATCH_RECORDS) -> Iterator[list[tuple[str, dict]]]:
        """What `read` returns, a few thousand records at a time: a first look at a long run never holds its
        whole history as dicts at once."""
        first = self.listed_at == float("-inf")
        if first and not full and self.background and (self.defer or self.latest_only):
            newest = self._newest()
            if sum(seq + 1 for seq in newest.values()) >= self.list_below:
                yield from self._first_look(newest, size)
                return
        if full or first or (not self.background and self.clock() - self.listed_at >= self.rescan_s):
            self.wait_for_listing()
            self._listed = None
            yield from self._batches_of(self._list(), size)
            return
        listed, self._listed = self._listed, None
        if listed is not None:
            files, cost = listed
            self.rescan_s = min(max(RESCAN_COST_FACTOR * cost, RESCAN_MIN_S), RESCAN_MAX_S)
            yield from self._batches_of(files, size)
        elif self.clock() - self.listed_at >= self.rescan_s and not self.listing_pending:
            self.listed_at = self.clock()       # due: listed meanwhile, read by a later refresh
            self._start_listing()
        # The writers this reader was told of (`defer`, `latest_only`: the run's trainer, its proxy) are probed from
        # their first fragment even before they write: a trainer whose first step comes minutes after the first look
        # is read at the next read, not at the next listing (up to RESCAN_MAX_S later on a slow bucket).
        for writer in (*self.defer, *self.latest_only):
            self.next_seq.setdefault(writer, 0)
        yield from self._probed(size)

    def _start_listing(self) -> None:
        # A writer a first look read only the newest of: every fragment of it, the older ones too.
        known = {w: seq for w, seq in self.next_seq.items() if w not in self._window}
        self._lister = threading.Thread(target=self._list_in_background, args=(known,),
                                        name=f"list-{self.folder}", daemon=True)
        self._lister.start()

    @property
    def listing_pending(self) -> bool:
        return self._lister is not None and self._lister.is_alive()

    @property
    def looking_back(self) -> bool:
        """Whether a first look read only the newest fragments of some writers and the listing that finds the rest
        (their older fragments, the other writers) has not been read yet."""
        return bool(self._window)

    def _newest(self) -> dict[str, int]:
        """The newest fragment number of each `defer` and `latest_only` writer that has written (a writer numbers
        its fragments from 0 without gaps), from a few `sizes` calls: numbers growing as powers of two, then
        SEARCH_POINTS numbers between the last one there and the first one missing, until they meet."""
        there = {w: -1 for w in sorted({*self.defer, *self.latest_only})}     # the highest number seen there
        missing = {w: math.inf for w in there}                                # the lowest number seen missing
        while True:
            asks = {}
            for w, last in there.items():
                gap = missing[w] - last
                if gap <= 1:
                    continue
                if gap == math.inf:
                    asks[w] = [last + 2 ** k for k in range(SEARCH_POINTS)]
                else:
                    step = SEARCH_POINTS + 1
                    asks[w] = sorted({last + max(1, gap * k // step) for k in range(1, step)})
            if not asks:
                return {w: seq for w, seq in there.items() if seq >= 0}
            found = self.store.sizes([self._path(w, seq) for w, seqs in asks.items() for seq in seqs])
            for w, seqs in asks.items():
                first_missing = min((s for s in seqs if self._path(w, s) not in found), default=math.inf)
                there[w] = max([there[w], *(s for s in seqs if s < first_missing and self._path(w, s) in found)])
                missing[w] = min(missing[w], first_missing)

    def _first_look(self, newest: dict[str, int], size: int) -> Iterator[list[tuple[str, dict]]]:
        """Read the newest fragments of each writer in `newest` (writer -> its newest number); the next read lists
        the folder in the background for the rest."""
        for writer, seq in newest.items():
            keep = self.latest_only.get(writer) or self.defer[writer]
            self._window[writer] = max(0, seq + 1 - keep)
        paths = [self._path(w, seq) for w, low in self._window.items() for seq in range(low, newest[w] + 1)]
        sizes = self.store.sizes(paths)
        self.store.prefetch(sorted(sizes))
        out: list = []
        for path in sorted(sizes):
            self._read_fragment(path, sizes[path], out)
            if len(out) >= size:
                yield out
                out = []
        for writer, seq in newest.items():
            self.next_seq[writer] = max(self.next_seq.get(writer, 0), seq + 1)
        # The listing is due at the next read, not started now: it would contend with what this read is for,
        # drawing the newest rows.
        self.listed_at = self.clock() - self.rescan_s
        if out:
            yield out

    def wait_for_listing(self, timeout: float | None = None) -> bool:
        """Wait for a re-listing in progress (tests, and a full read); True once none is."""
        lister = self._lister
        if lister is not None:
            lister.join(timeout)
        return not self.listing_pending

    def _list(self) -> list[StoredFile]:
        began = self.clock()
        files = self.store.list_files(self.folder)
        cost = self.clock() - began
        self.listed_at = self.clock()
        self.rescan_s = min(max(RESCAN_COST_FACTOR * cost, RESCAN_MIN_S), RESCAN_MAX_S)
        return files

    def _list_in_background(self, known: dict[str, int]) -> None:
        """List the folder and keep, for the next read, the fragments past `known` (writer -> next number then):
        everything of a writer it did not know, the rest of the ones it did. Touches no cursor."""
        try:
            began = self.clock()
            files = self.store.list_files(self.folder)
            cost = self.clock() - began
            news = []
            for f in files:
                match = layout.FRAGMENT_RE.match(posixpath.basename(f.path))
                if match and int(match.group("seq")) >= known.get(match.group("writer"), 0):
                    news.append(f)
            self._listed = (news, cost)
        except Exception as exc:     # the bucket failing: probes go on, the next listing tries again
            log.warning("could not list %s: %s", self.folder, exc)

    def _probed(self, size: int) -> Iterator[list[tuple[str, dict]]]:
        while True:
            ahead = {w: [self._path(w, self.next_seq[w] + k) for k in range(PROBE_AHEAD)] for w in self.next_seq}
            probes = [*self._torn(), *(p for paths in ahead.values() for p in paths)]
            sizes = self.store.sizes(probes) if probes else {}
            self.store.prefetch([p for p in sizes if self._unread(p, sizes[p])])
            out: list = []
            for path in sorted(sizes):
                self._read_fragment(path, sizes[path], out)
            if out:
                yield out
            # Every number asked for a writer was there: there may be more of them, ask again.
            if not any(all(p in sizes for p in paths) for paths in ahead.values()):
                return

    def _batches_of(self, files: list[StoredFile], size: int) -> Iterator[list[tuple[str, dict]]]:
        """The unread records of `files` (a listing, or a background listing's news), oldest fragment first. Each
        name is parsed once: a first look at a folder of 100,000 fragments costs one pass over their names."""
        by_writer: dict[str, list[StoredFile]] = {}
        for f in files:
            match = layout.FRAGMENT_RE.match(f.path.rsplit("/", 1)[-1])
            if match:
                by_writer.setdefault(match.group("writer"), []).append(f)
        done = self.cursor.done
        window, self._window = self._window, {}     # a listing: what a first look left is found now
        for writer, frags in by_writer.items():
            frags.sort(key=lambda f: f.path)
            if writer in window:                 # the fragments before a first look's: the history, or stale
                older = [f for f in frags if _seq(f.path) < window[writer] and f.path not in done]
                if writer in self.defer and writer not in self.latest_only:
                    self.deferred += older
                done.update(f.path for f in older)
            if writer in self.latest_only:       # snapshots: nothing older than the newest few is still current
                old = [f for f in frags if f.path not in done][:-self.latest_only[writer]]
                done.update(f.path for f in old)
            if writer in self.defer and writer not in self.next_seq:    # a first look: the history waits
                later = frags[:-self.defer[writer]]
                self.deferred += later
                done.update(f.path for f in later)
        todo = sorted((f for frags in by_writer.values() for f in frags if self._unread(f.path, f.size)),
                      key=lambda f: f.path)
        out: list = []
        for i, f in enumerate(todo):
            if i % PREFETCH_FILES == 0:
                self.store.prefetch([g.path for g in todo[i:i + PREFETCH_FILES]])
            self._read_fragment(f.path, f.size, out)
            if len(out) >= size:
                yield out
                out = []
        if out:
            yield out

    def read_deferred(self, files: list[StoredFile], size: int = BATCH_RECORDS) -> Iterator[list[tuple[str, dict]]]:
        """The records of fragments a first look set aside, oldest first, a few thousand at a time. Safe to call
        from another thread: it keeps a cursor of its own and touches nothing of this reader's but the counts of
        unreadable lines (one dict update per bad fragment)."""
        cursor, out = FragmentCursor(bad=self.cursor.bad), []
        files = sorted(files, key=lambda f: f.path)
        for i, f in enumerate(files):
            if i % PREFETCH_FILES == 0:
                self.store.prefetch([g.path for g in files[i:i + PREFETCH_FILES]])
            match = layout.FRAGMENT_RE.match(posixpath.basename(f.path))
            out.extend(_records(self.store, f.path, 0, f.size, cursor, match.group("writer"), self.check))
            if len(out) >= size:
                yield out
                out = []
        if out:
            yield out

    def _read_fragment(self, path: str, size: int, out: list) -> bool:
        """Read `path` from its cursor into `out`; True if it was a fragment with anything new."""
        match = layout.FRAGMENT_RE.match(posixpath.basename(path))
        if not match or path in self.cursor.done:
            return False
        writer, seq = match.group("writer"), int(match.group("seq"))
        self.next_seq[writer] = max(self.next_seq.get(writer, 0), seq + 1)
        start = self.cursor.offsets.get(path, 0)
        if start >= size:
            return False
        out.extend(_records(self.store, path, start, size, self.cursor, writer, self.check))
        return True

    def _unread(self, path: str, size: int) -> bool:
        """Whether `path` is a fragment with bytes this reader has not read yet."""
        return (layout.FRAGMENT_RE.match(posixpath.basename(path)) is not None and path not in self.cursor.done
                and self.cursor.offsets.get(path, 0) < size)

    def _torn(self) -> list[str]:
        return [p for p in self.cursor.offsets if p not in self.cursor.done]

    def _path(self, writer: str, seq: int) -> str:
        return f"{self.folder}/{layout.fragment_name(writer, seq)}"


def _seq(path: str) -> int:
    return int(layout.FRAGMENT_RE.match(posixpath.basename(path)).group("seq"))


def _records(store: BucketStore, path: str, start: int, size: int, cursor: FragmentCursor, writer: str,
             check: Callable[[dict], bool] | None) -> list[tuple[str, dict]]:
    """The complete lines of `path` after `start` as (writer, record); moves the cursor past them."""
    decoded, end = layout.fragment_records(store.read_bytes(path, start))
    out = []
    for record in decoded:
        if record is None or (check is not None and not check(record)):
            cursor.bad[path] = cursor.bad.get(path, 0) + 1   # skipped, never fatal to the dashboard
            continue
        out.append((writer, record))
    cursor.offsets[path] = start + end
    if start + end == size and end > 0:
        cursor.done.add(path)
        cursor.offsets.pop(path, None)
    return out

