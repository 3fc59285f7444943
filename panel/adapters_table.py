"""The adapters table of the dashboard: each published version with its held-out score (the best starred), step, time,
size, the replicas serving it and each held-out reward; the base model (version 0) last, as the baseline."""

import time

from panel.replicas_table import registered_adapters

ADAPTER_PAGE = 50          # the adapters table shows the newest versions; the count of all is in the header


# The held-out score (★ on the best) stands next to the version's name: on a phone's width the table shows its first
# two columns, and the star must be among them.
ADAPTER_HEADERS = ["adapter", "held-out score", "step", "published", "size (MB)", "on replicas", "note"]
BEST_MARK = "★ best"
DECIDES = " ◆"      # marks the held-out column(s) that decide the best version


def held_out_names(view) -> list[str]:
    """Every reward scored on the held-out set, trained ones first, as the newest record lists them."""
    held = getattr(view, "held_out", None)
    if held is None or not held.scores:
        return []
    newest = held.scores[held.span[1]]
    return sorted(newest.rewards, key=lambda n: (newest.rewards[n].get("weight") == 0, list(newest.rewards).index(n)))


def adapter_headers(view) -> list[str]:
    """The adapters table's columns: a version's name and held-out score, its facts, then each held-out reward
    (trained ×weight, or monitor-only); the column(s) that decide the best version marked ◆."""
    held = getattr(view, "held_out", None)
    rule = held.rule if held is not None else {}
    # The held-out score column is the score under the rule in force: it decides, whatever the rule.
    heads = [ADAPTER_HEADERS[0], ADAPTER_HEADERS[1] + DECIDES, *ADAPTER_HEADERS[2:-1]]
    heads += [ADAPTER_HEADERS[-1]] if _notes_shown(view) else []
    newest = held.scores[held.span[1]].rewards if held is not None and held.scores else {}
    for name in held_out_names(view):
        weight = newest[name].get("weight")
        kind = "monitor" if weight == 0 else f"×{weight:g}" if isinstance(weight, (int, float)) else "trained"
        heads.append(f"{name} ({kind})" + (DECIDES if name in rule else ""))
    return heads


def adapter_table(view, page: int = ADAPTER_PAGE) -> dict:
    """The adapters table as Gradio's Dataframe takes it: its headers (they name the run's rewards) and rows."""
    return {"headers": adapter_headers(view), "data": adapter_rows(view, page)}


def adapter_rows(view, page: int = ADAPTER_PAGE) -> list[list]:
    """The newest `page` versions: version, held-out score (the best's starred first, so a narrow table shows the
    star), step, published at, size (MB), registered on replicas, note (superseded by a resume), each held-out
    reward's mean; last, the base model (version 0) where it was evaluated: the baseline."""
    registered = registered_adapters(view)
    first_step = view.first_step
    held = getattr(view, "held_out", None)
    scores, best = (held.scores, held.best_version) if held is not None else ({}, None)
    names = held_out_names(view)
    rows = []
    notes = _notes_shown(view)
    for v in view.newest_adapters(page):
        on = ", ".join(r for r, names_on in registered.items() if v.name in names_on) or "-"
        step = v.step if v.step is not None else first_step.get(v.version, "-")
        note = (f"superseded: the run resumed from step {view.superseded[v.name]}"
                if v.name in view.superseded else "")
        score = (f"{BEST_MARK} " if v.version == best else "") + held_score(held, v.version)
        rows.append([v.name, score, step, time.strftime("%H:%M:%S", time.localtime(v.time)),
                     round(v.size_bytes / 1e6, 3), on, *([note] if notes else []),
                     *_reward_cells(scores.get(v.version), names)])
    if 0 in scores:
        name = "base model (v0)" + (": no version beats it" if held.none_beats_base else "")
        rows.append([name, held_score(held, 0), 0, "-", "-", "-", *(["the baseline"] if notes else []),
                     *_reward_cells(scores[0], names)])
    return rows


def _notes_shown(view) -> bool:
    """Whether the table has a note column: only a resumed run's superseded versions have notes, and an empty
    column would take a fifth of the width from the held-out reward columns at 1440 px."""
    return bool(getattr(view, "superseded", None))


def held_score(held, version: int) -> str:
    """A version's held-out score in the table: under the run's rule, as the header and the picker say it."""
    return held.score_text(version) if held is not None and version in held.scores else "-"


def _reward_cells(score, names: list[str]) -> list:
    out = []
    for name in names:
        stat = score.rewards.get(name) if score is not None else None
        mean = stat.get("mean") if isinstance(stat, dict) else None
        out.append(round(float(mean), 3) if isinstance(mean, (int, float)) else "-")
    return out
