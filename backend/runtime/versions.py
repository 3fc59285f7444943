"""Adapter version numbers across attempts: a version name is published once, also across resumes.

vLLM keys its prefix cache, and TRL its staleness, by the name `trl-policy-v{N}` (`layout.adapter_name`):
republishing a name with other weights serves the wrong policy. So a resumed trainer numbers past the highest
version *ever* published, which is the highest of
- the `adapter_published` events the trainers record (they stay when TRL deletes old serving copies), and
- the complete version folders (both adapter files) in `adapters/` and `.vllm_lora/`; a half-written folder (a
  copy cut off, only its config) counts for nothing.
Versions published after the checkpoint a run resumed from belong to a discarded branch: an `adapters_superseded`
event names them, so the panel can mark them.
"""

import json
import os

from .layout import (
    ADAPTER_FILES,
    ADAPTER_META_FILE,
    ADAPTERS_DIR,
    EVENTS_DIR,
    FRAGMENT_RE,
    TRAINER_WRITER,
    VLLM_LORA_DIR,
    adapter_version,
    fragment_records,
)
from .records import ADAPTER_PUBLISHED, ADAPTERS_SUPERSEDED, write_event


def trainer_events(run_dir: str) -> list[dict]:
    """The trainer's events in order; lines that are not event objects are skipped."""
    folder = os.path.join(run_dir, EVENTS_DIR)
    names = sorted(n for n in os.listdir(folder) if FRAGMENT_RE.match(n)) if os.path.isdir(folder) else []
    events = []
    for name in names:
        if FRAGMENT_RE.match(name).group("writer") != TRAINER_WRITER:
            continue
        with open(os.path.join(folder, name), "rb") as f:
            records, _ = fragment_records(f.read())
        events += [e for e in records if e is not None and isinstance(e.get("event"), str)]
    return events


def published_versions(run_dir: str) -> dict[int, dict]:
    """Every version ever published in the run folder: number -> {"name", "step"} (step None where unknown)."""
    found: dict[int, dict] = {}
    for sub in (ADAPTERS_DIR, VLLM_LORA_DIR):
        folder = os.path.join(run_dir, sub)
        for name in os.listdir(folder) if os.path.isdir(folder) else []:
            version = adapter_version(name)
            if version is not None and all(os.path.isfile(os.path.join(folder, name, f)) for f in ADAPTER_FILES):
                found[version] = {"name": name, "step": _meta_step(os.path.join(folder, name))}
    for event in trainer_events(run_dir):
        version = adapter_version(event.get("name")) if event["event"] == ADAPTER_PUBLISHED else None
        if version is not None:
            step = event.get("step") if isinstance(event.get("step"), int) else None
            found.setdefault(version, {"name": event["name"], "step": step})
    return found


def _meta_step(folder: str) -> int | None:
    try:
        with open(os.path.join(folder, ADAPTER_META_FILE)) as f:
            step = json.load(f).get("step")
    except (OSError, ValueError, AttributeError):
        return None
    return step if isinstance(step, int) else None


def highest_published(run_dir: str) -> int:
    """The highest version number ever published (0 if none): the next one is this plus one."""
    return max(published_versions(run_dir), default=0)


def superseded_names(run_dir: str) -> set[str]:
    names: set[str] = set()
    for event in trainer_events(run_dir):
        if event["event"] == ADAPTERS_SUPERSEDED and isinstance(event.get("names"), list):
            names.update(str(n) for n in event["names"])
    return names


def mark_superseded(run_dir: str, versions: list[int], resumed_from_step: int) -> list[str]:
    """Record that `versions` belong to a branch the run discarded when it resumed from `resumed_from_step`."""
    already = superseded_names(run_dir)
    published = published_versions(run_dir)
    names = [published[v]["name"] for v in sorted(versions) if v in published and published[v]["name"] not in already]
    if names:
        write_event(run_dir, TRAINER_WRITER, ADAPTERS_SUPERSEDED, names=names, resumed_from_step=resumed_from_step)
    return names
