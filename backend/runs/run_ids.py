"""One run id, one run: the panel's record of which run each id it launched names, and how an id is resolved.

A run's jobs carry its id as a label, and its folder is `runs/<id>/` in its bucket; nothing on the Hub stops two
namespaces (or two buckets) from holding runs under one id, and a visitor who reaches both would have every action on
the id (status, download, push, cancel) land on whichever the panel found first. So:

- every launch through this panel claims its id first, once for the whole panel (`<home>/run-ids/<id>.json`, made
  with O_EXCL: two launches racing for one id cannot both win), whatever namespace, bucket or executor it goes to;
  a preview or launch under an id already claimed, listed or in the bucket is refused, naming the field;
- an action resolves a run by its owner's namespace and its id (`pick_owner`): where a visitor reaches the id in
  more than one namespace (a run made outside the panel under a reused id), the run in their own namespace, else the
  one this panel launched under that id; else nothing, with a message that says why.
"""

import json
import os
import re
import time

from backend.runs.launch import RunIdTaken

RUN_ID_FIELD = "run_id"
_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


def id_taken_message(run_id: str) -> str:
    return (f"run id {run_id} already names a run on this panel (each run id names one run, in every namespace and "
            "bucket the panel serves). Leave the run id empty, or preview again and launch with the id the new "
            "preview gives. Nothing was launched.")


class RunIdBook:
    """Which (executor, namespace, bucket) each run id this panel launched belongs to, one small file an id."""

    def __init__(self, home: str):
        self.folder = os.path.join(home, "run-ids")

    def _path(self, run_id: str) -> str:
        if not _SAFE.fullmatch(run_id or ""):
            raise RunIdTaken(f"run id {run_id!r} is not a valid run id (letters, digits, '-', '_', '.')")
        return os.path.join(self.folder, f"{run_id}.json")

    def claim(self, run_id: str, executor: str, namespace: str | None, bucket: str) -> None:
        """Record `run_id` as this run's, or RunIdTaken where any run holds it already: one record an id, made
        atomically, so of two launches under one id (also by two visitors into one namespace and bucket) one wins."""
        path = self._path(run_id)
        os.makedirs(self.folder, exist_ok=True)
        record = {"run_id": run_id, "executor": executor, "namespace": namespace, "bucket": bucket,
                  "claimed": time.time()}
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise RunIdTaken(id_taken_message(run_id)) from None
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)

    def release(self, run_id: str, executor: str, namespace: str | None) -> None:
        """Give the id back after a launch that submitted nothing (only the claimant's own record)."""
        held = self.owner(run_id)
        if held is not None and held.get("executor") == executor and held.get("namespace") == namespace:
            try:
                os.unlink(self._path(run_id))
            except OSError:
                pass

    def owner(self, run_id: str) -> dict | None:
        """The record of the run this panel launched under `run_id` (executor, namespace, bucket), or None."""
        try:
            with open(self._path(run_id)) as f:
                record = json.load(f)
        except (OSError, ValueError, RunIdTaken):     # none recorded, or an id that could not be
            return None
        return record if isinstance(record, dict) else None


def where_label(registry) -> str:
    """Whose run, in words: 'acme on Hugging Face Jobs', or 'local processes' (no namespace)."""
    label = registry.engine.label
    return f"{registry.namespace} on {label}" if registry.namespace else label


def pick_owner(run_id: str, found: list, visitor_name: str | None, launched: dict | None):
    """Of the registries through which a visitor reaches `run_id` (one per namespace), the run's owner: the only one;
    else the one of the visitor's own namespace; else the one this panel launched the id in (`launched`, the book's
    record); else None (ambiguous: the caller refuses, naming the namespaces)."""
    if len(found) == 1:
        return found[0]
    own = [r for r in found if visitor_name and r.namespace == visitor_name]
    if len(own) == 1:
        return own[0]
    if launched is not None:
        ours = [r for r in found if r.executor.name == launched.get("executor")
                and r.namespace == launched.get("namespace")]
        if len(ours) == 1:
            return ours[0]
    return None
