"""A run's display name, notes and tags: what its owner wants to call it and remember about it ("lr 5e-3 baseline",
"lr too high", tags `baseline`, `ablation`). The display name is shown in the runs list and the run's header in place
of the name it was launched with; the run's id stays its id (its folder, its jobs, its address).

Kept in the run's own folder (`runs/<id>/notes.json`), so they travel with the run and every panel on its bucket
sees them; written whole (a local folder renames a temporary file into place, a bucket upload replaces the file),
bounded in size. Who may write them is who may cancel the run (`Operations.set_notes`, `Operations.rename`). A
run's job can write its folder too, so a read takes only a well-formed name and tags and a bounded note."""

import json
import re
import threading
import time
import unicodedata
from dataclasses import dataclass, replace

from backend.runtime import layout
from backend.runtime.redact import redact_tokens

MAX_NOTE_CHARS = 4000
MAX_NAME_CHARS = 60     # the header shows it on one line beside the run's id
MAX_TAGS = 16
MAX_FILE_BYTES = 64 * 1024      # a larger notes.json is not the panel's: not read
TAG_RE = re.compile(r"^[A-Za-z0-9_.:+-]{1,32}$")
READ_AGAIN_S = 300.0      # another panel's edit shows here within this long; this panel's own at once


class NotesError(ValueError):
    """Notes or tags that cannot be saved; the message says what to change."""


@dataclass(frozen=True)
class RunNotes:
    text: str = ""
    tags: tuple[str, ...] = ()
    name: str = ""      # the display name ("": the name the run was launched with)


def parse_tags(typed: str) -> tuple[str, ...]:
    """'baseline, #lr-sweep ablation' -> ('baseline', 'lr-sweep', 'ablation'): split on commas and spaces, a leading
    '#' dropped, repeats (in any case) once. Raises NotesError naming a tag that cannot be one."""
    tags, seen = [], set()
    for word in re.split(r"[,\s]+", typed or ""):
        tag = word.strip().lstrip("#")
        if not tag or tag.lower() in seen:
            continue
        if not TAG_RE.match(tag):
            raise NotesError(f"Tag {tag[:40]!r}: use 1 to 32 letters, digits or _ . : + - (no spaces).")
        tags.append(tag)
        seen.add(tag.lower())
    if len(tags) > MAX_TAGS:
        raise NotesError(f"{len(tags)} tags: a run takes at most {MAX_TAGS}.")
    return tuple(tags)


def checked_notes(text: str, typed_tags: str) -> RunNotes:
    """The notes to save, or NotesError: a note of at most MAX_NOTE_CHARS holding no token, and valid tags."""
    text = (text or "").strip()
    if len(text) > MAX_NOTE_CHARS:
        raise NotesError(f"The note is {len(text):,} characters long: keep it to {MAX_NOTE_CHARS:,}.")
    if redact_tokens(text) != text:
        raise NotesError("The note holds what looks like a token: remove it (notes are stored in the run's folder).")
    return RunNotes(text, parse_tags(typed_tags))


def checked_name(typed: str) -> str:
    """The display name to save ("" clears it), or NotesError saying what to change: one line of plain text of at
    most MAX_NAME_CHARS, without control or invisible characters (a line break, a tab, a zero-width or bidi mark
    could hide or reorder what the list shows), HTML's angle brackets or a token."""
    name = (typed or "").strip()
    if len(name) > MAX_NAME_CHARS:
        raise NotesError(f"The name is {len(name):,} characters long: keep it to {MAX_NAME_CHARS}.")
    if any(unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp") for c in name):
        raise NotesError("The name holds a control or invisible character (a line break, a tab, a zero-width or "
                         "direction mark): type it as one line of plain text.")
    if "<" in name or ">" in name:
        raise NotesError("The name holds '<' or '>': a run's name is plain text, not HTML. Leave them out.")
    if redact_tokens(name) != name:
        raise NotesError("The name holds what looks like a token: remove it (the name is stored in the run's folder).")
    return name


def _kept_name(value) -> str:
    """A name read from a file, kept only if it could have been saved (`checked_name`)."""
    if not isinstance(value, str):
        return ""
    try:
        return checked_name(value)
    except NotesError:
        return ""


def notes_path(run_id: str) -> str:
    return f"{layout.run_prefix(run_id)}/{layout.NOTES_FILE}"


def parse_notes(data: bytes) -> RunNotes:
    """The notes a file holds; what is malformed or oversized is left out (the file may not be the panel's)."""
    try:
        record = json.loads(data)
    except ValueError:
        return RunNotes()
    if not isinstance(record, dict):
        return RunNotes()
    text = record.get("text") if isinstance(record.get("text"), str) else ""
    tags = record.get("tags") if isinstance(record.get("tags"), list) else []
    kept = tuple(t for t in tags if isinstance(t, str) and TAG_RE.match(t))[:MAX_TAGS]
    return RunNotes(redact_tokens(text[:MAX_NOTE_CHARS]), kept, _kept_name(record.get("name")))


class NotesBook:
    """The notes of the runs this panel shows, read from their folders at most every READ_AGAIN_S (the runs list
    asks at each tick), written through."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self._kept: dict[tuple[str, str], tuple[float, RunNotes]] = {}
        self._lock = threading.Lock()

    def read(self, store, bucket: str, run_id: str, fresh: bool = False) -> RunNotes:
        """The run's notes, as kept here for READ_AGAIN_S. `fresh`: read from the folder now, failing where it
        cannot be read (a write that keeps the other fields, `rewritten`, must not build on a guess)."""
        key = (bucket or "", run_id)
        with self._lock:
            kept = self._kept.get(key)
        if kept and self.clock() < kept[0] and not fresh:
            return kept[1]
        if fresh:
            notes = self._read_now(store, run_id)
        else:
            try:
                notes = self._read_now(store, run_id)
            except (OSError, KeyError):
                notes = RunNotes()      # none written, or the bucket failing: no notes shown, asked again later
            except Exception:           # a Hub client error: the runs list must not break over a note
                notes = kept[1] if kept else RunNotes()
        with self._lock:
            self._kept[key] = (self.clock() + READ_AGAIN_S, notes)
        return notes

    @staticmethod
    def _read_now(store, run_id: str) -> RunNotes:
        # Asked for its size first: the file is rewritten in place (a bucket store would serve its old copy) and
        # may be any size (a run's job can write it).
        path = notes_path(run_id)
        size = store.sizes([path]).get(path)
        return parse_notes(store.read_bytes(path)) if size is not None and size <= MAX_FILE_BYTES else RunNotes()

    def rewritten(self, store, bucket: str, run_id: str, **change) -> RunNotes:
        """Write the run's notes with `change` (text and tags, or name) and the rest as its folder holds them now:
        a rename keeps the notes, a note keeps the name. Returns what was written."""
        notes = replace(self.read(store, bucket, run_id, fresh=True), **change)
        self.write(store, bucket, run_id, notes)
        return notes

    def write(self, store, bucket: str, run_id: str, notes: RunNotes) -> None:
        record = {"text": notes.text, "tags": list(notes.tags), "name": notes.name, "updated_at": time.time()}
        store.write_bytes(notes_path(run_id), json.dumps(record, indent=1).encode())
        with self._lock:
            self._kept[(bucket or "", run_id)] = (self.clock() + READ_AGAIN_S, notes)
