"""Which adapter version a download, a push or "try it" means, and changing the rule that names the best one.

`choose` turns what a visitor picked ("best", "final", "trl-policy-v7") into the files of that adapter and a
sentence saying which version it is and why, read from the run's held-out evaluation (`held_out.HeldOut`); a name the
run never published is refused. `change_best_by` ranks a run's versions again under a new rule and republishes
`best/`.
"""

import json
import os
import posixpath
import secrets
import tempfile
from dataclasses import dataclass

from backend.outcome.hacking_sign import hacking_sign
from backend.outcome.held_out import HeldOutScore
from backend.runtime import layout, records
from backend.runtime.best_rule import (
    BEST_BY_WRITER,
    EPSILON,
    TIE_RULE,
    best_by_problem,
    best_json,
    parse_best_by,
    pick_best,
    rule_score,
    rule_text,
)
from backend.runtime.user_code import reward_function_names
from backend.storage.adapters import adapter_folder_files
from backend.storage.store import StoredFile

FINAL, BEST = "final", "best"
CHOICES_SHOWN = 50              # versions offered in a picker besides best and final (the newest)
OLDER_WAIT_S = 30.0             # how long a change of rule waits for a long run's older records (being read)


class ChoiceError(ValueError):
    """The picked version cannot be used; the message says why and what can be."""


def metric_name(spec: dict) -> str:
    """What the held-out score is: the weighted sum of the run's rewards (weight 0: watched, not scored)."""
    weights = spec.get("reward_weights") or {}
    names = [*(spec.get("rewards") or [])]
    parts = [f"{n} x{float(weights.get(n, 1.0)):g}" for n in names if float(weights.get(n, 1.0)) != 0]
    return "weighted held-out reward" + (f": {' + '.join(parts)}" if parts else "")



@dataclass(frozen=True)
class ChosenAdapter:
    """One adapter of a run, as a visitor picked it: its files and what the card says about it."""

    choice: str                    # "best", "final" or "trl-policy-v<N>"
    name: str                      # the version's own name where known ("trl-policy-v7"), else "final"
    version: int | None
    step: int | None
    files: list[StoredFile]
    why: str                       # which version it is and why it was chosen, its standing, the alert, if any
    score: HeldOutScore | None = None
    metric: str = ""
    rule: str = ""                 # the run's best-by rule in words
    rule_score: str = "-"          # the version's held-out score under it (`HeldOut.score_text`)
    baseline: float | None = None  # the base model's score under it (None: not evaluated)
    alert: str = ""                # the reward-hacking alert of the run, where one fired


def published(view, version: int):
    """The run's adapter version `version` (an AdapterVersion), None if it published none."""
    find = getattr(view, "find_adapter", None)      # a RunView's: it also looks while older events are read
    return find(version) if find is not None else view.adapters.get(version)


def _version_step(view, version: int | None) -> int | None:
    if version is None:
        return None
    known = published(view, version)
    if known is not None and known.step is not None:
        return known.step
    score = view.held_out.scores.get(version)
    return score.step if score is not None else view.first_step.get(version)


def _complete(files: list[StoredFile]) -> list[StoredFile]:
    names = {posixpath.basename(f.path) for f in files}
    return files if all(n in names for n in layout.ADAPTER_FILES) else []


def _final_version(view) -> int | None:
    end = view.trainer_end
    return end.get("version") if end.get("event") == records.FINISHED and type(end.get("version")) is int else None


def default_choice(view) -> str | None:
    """The best version when an evaluation exists and its adapter is there, else final/, else None; None also when
    versions were evaluated and none beats the base model: nothing is picked for a download or a push then (final/
    would be the most trained, perhaps the most gamed, version)."""
    held = view.held_out
    if held.best_version is not None and (held.best_files or held.best_version in view.adapters):
        return BEST
    if held.none_beats_base:
        return None
    return FINAL if view.final_files else None


def version_choices(view, shown: int = CHOICES_SHOWN) -> list[tuple[str, str]]:
    """(label, value) for a picker: the best version, final/, then the newest versions with their held-out scores
    under the run's rule (`HeldOut.score_text`: the number the header and the adapters table show)."""
    held, out = view.held_out, []
    best = held.best_version
    if best is not None and (held.best_files or best in view.adapters):
        out.append((f"best: {_name(view, best)} (held-out {held.score_text(best)})", BEST))
    if view.final_files:
        version = _final_version(view)
        label = f"final/ ({_name(view, version)})" if version is not None else "final/"
        if version is not None and version in held.scores:
            label += f" · held-out {held.score_text(version)}"
        out.append((label, FINAL))
    for v in view.newest_adapters(shown):
        label = v.name + (f" · step {v.step}" if v.step is not None else "")
        out.append((label + (f" · held-out {held.score_text(v.version)}" if v.version in held.scores else ""), v.name))
    return out


NOTHING_PICKED = ("no version beats the base model by {rule}, so none is picked for you: pick final/ or a version "
                  "by hand, knowing that")


def choose(view, choice: str | None) -> ChosenAdapter:
    """The adapter `choice` names (None or "": the default), with its files; ChoiceError when there is none (also
    for the default where no version beats the base model: `default_choice`)."""
    held, metric = view.held_out, metric_name(view.spec)
    choice = (choice or "").strip() or default_choice(view)
    if not choice:
        if held.none_beats_base:
            raise ChoiceError(NOTHING_PICKED.format(rule=rule_text(held.rule)))
        choice = FINAL
    best = held.best_version
    if choice == FINAL:
        if not view.final_files:
            raise ChoiceError(f"run {view.run_id} has no final adapter yet: final/ is written when training ends")
        version = _final_version(view)
        step = view.trainer_end.get("step") if type(view.trainer_end.get("step")) is int else None
        why = "final/: the last adapter, written when training ended" + (f" at step {step}" if step else "")
        name = _name(view, version) if version is not None else FINAL
        return _chosen(view, FINAL, name, version, step, view.final_files, why)
    if choice == BEST:
        if best is None:
            what = ("no version beats the base model by " + rule_text(held.rule) if held.none_beats_base
                    else "no held-out evaluation yet")
            raise ChoiceError(f"run {view.run_id} has {what}, so no best version: pick final/ or a version")
        why = f"the best version, {_name(view, best)} at step {_version_step(view, best)}: {held.why(metric)}"
        return _chosen(view, BEST, _name(view, best), best, _version_step(view, best), _version_files(view, best), why)
    version = layout.adapter_version(choice, layout.spec_member(view.spec))
    if version is None or published(view, version) is None:
        raise ChoiceError(f"version: run {view.run_id} published no adapter {choice[:80]!r}; pick best, final/ or one "
                          "of the versions listed in the adapters table")
    why = f"{choice} at step {_version_step(view, version)}, picked by hand"
    after = ""
    if best is not None and best != version and version in held.scores:
        after = f"; the best is {_name(view, best)} ({held.score_text(best)})"
    elif best == version:
        after = f"; it is the best version ({held.why(metric)})"
    return _chosen(view, choice, choice, version, _version_step(view, version), _version_files(view, version), why,
                   after, ": ")


def _chosen(view, choice: str, name: str, version: int | None, step: int | None, files: list[StoredFile],
            why: str, after: str = "", sep: str = "; ") -> ChosenAdapter:
    """The chosen adapter with its standing: its held-out score under the run's rule beside the base model's, and
    the reward-hacking alert where one fired (the version line, the zip's and the push's card say them all)."""
    held, metric = view.held_out, metric_name(view.spec)
    rule = rule_text(held.rule)
    score = held.scores.get(version) if version is not None else None
    shown = held.score_text(version) if score is not None else "-"
    if score is not None:
        why += f"{sep}held-out score {shown} (best by {rule})"
        if held.baseline is not None:
            verdict = ("above" if (held.rule_score(version) or 0) > held.baseline + EPSILON else "not above")
            why += f", {verdict} the base model's {held.baseline:.3f}"
    elif held.baseline is not None:
        why += f"{sep}not evaluated (the base model's held-out score, best by {rule}: {held.baseline:.3f})"
    why += after
    if held.none_beats_base:
        why += f". No version beats the base model by {rule}"
    sign = hacking_sign(held) if held.scores else None
    alert = sign.message if sign is not None else ""
    if alert:
        why += f". ▲ {alert[0].upper()}{alert[1:]}"
    return ChosenAdapter(choice, name, version, step, files, why.rstrip(".") + ".", score, metric, rule, shown,
                         held.baseline, alert)


def _name(view, version: int) -> str:
    """Version `version`'s name in the view's run (a sweep member's carries its tag)."""
    return layout.run_adapter_name(view.spec, version)

def _version_files(view, version: int) -> list[StoredFile]:
    """A version's own folder, or best/ when that is this version and its serving copy was pruned."""
    known = published(view, version)
    files = _complete(adapter_folder_files(view.store, known.path)) if known is not None else []
    if files:
        return files
    held = view.held_out
    if held.best_version == version and held.best_files:
        return held.best_files
    raise ChoiceError(f"{_name(view, version)}'s files are gone from the bucket (TRL keeps only the newest "
                      "serving copies): pick best or final/, which are kept")


class BestByRefused(ValueError):
    """A "best by" the run cannot rank by; the message names the field and says what it can be."""


def held_out_reward_names(view) -> list[str]:
    """Every reward the run scores on its held-out set: its records' (the newest), else its spec's."""
    held = view.held_out
    if held.scores:
        return list(held.scores[held.span[1]].rewards)
    spec = view.spec
    return [*(spec.get("rewards") or []), *reward_function_names(spec.get("reward_code") or ""),
            *(spec.get("monitor_rewards") or [])]


def change_best_by(view, text: str) -> str:
    """Change which held-out score decides the run's best version, on a running or finished run: ranked again
    from the evaluation records (no re-run), best/ republished with the new best version's adapter (removed when
    none beats the base model), the change recorded as a best_by_changed event (which a running trainer reads back
    before its next evaluation). Returns what it did, in words; BestByRefused or ChoiceError when it cannot."""
    view.refresh()
    if view.held_out.older_pending and hasattr(view, "wait_for_history"):
        view.wait_for_history(OLDER_WAIT_S)     # ranked over every record, not a first look's newest
    if view.held_out.older_pending:
        raise BestByRefused("best_by: this long run's older held-out records are still being read; change it again "
                            "in a moment (nothing was changed)")
    if view.spec.get("eval_source", "none") == "none" and not view.held_out.scores:
        raise BestByRefused("best_by: this run has no held-out set, so no best version to choose")
    try:
        rule = parse_best_by(text)
    except ValueError as error:
        raise BestByRefused(f"best_by: {error}") from None
    problem = best_by_problem(rule, held_out_reward_names(view))
    if problem:
        raise BestByRefused(f"best_by: {problem}")
    held, previous = view.held_out, dict(view.held_out.rule)
    ranked = {v: {"score": s.score, "rewards": s.rewards} for v, s in held.scores.items()}
    best, baseline = pick_best(ranked, rule)
    prefix = f"{held.prefix}/{layout.BEST_DIR}"
    if best is not None:
        files = _version_files(view, best)      # ChoiceError when its files are gone: nothing written
        _republish(view.store, prefix, files, best_json(
            {"policy_version": best, "step": held.scores[best].step, **ranked[best]}, rule, baseline,
            held.evaluated, metric_name(view.spec)))
    elif held.best_json or held._best_files:
        view.store.delete_folder(prefix)        # none beats the base model: no best/ to download or push
    writer = f"{BEST_BY_WRITER}.{secrets.token_hex(4)}"
    event = records.event_record(records.BEST_BY_CHANGED, best_by=rule, previous=previous, version=best,
                                 rule=rule_text(rule))
    view.store.write_bytes(f"{held.prefix}/{layout.EVENTS_DIR}/{layout.fragment_name(writer, 0)}",
                           (json.dumps(event) + "\n").encode())
    if hasattr(view, "expect_event_writer"):
        view.expect_event_writer(writer)
    view.refresh()          # the event: the view's rule is the new one
    held.reread_best()      # and best/ as republished
    if best is None:
        what = ("no version beats the base model" if baseline is not None and held.evaluated
                else "no version is evaluated yet")
        return f"Best version now by {rule_text(rule)} ({TIE_RULE}): {what}; best/ holds none."
    return (f"Best version now by {rule_text(rule)} ({TIE_RULE}): **{_name(view, best)}** "
            f"({rule_score(ranked[best], rule):.3f}"
            + (f", base model {baseline:.3f}" if baseline is not None else "") + "); best/ republished.")


def _republish(store, prefix: str, files: list[StoredFile], best: dict) -> None:
    """best/ replaced by `files` (a version's adapter), best.json written last: a reader that finds best.json naming
    the version finds its files."""
    with tempfile.TemporaryDirectory() as tmp:
        for f in files:
            name = posixpath.basename(f.path)
            if name in (*layout.ADAPTER_FILES, layout.ADAPTER_META_FILE):
                with open(os.path.join(tmp, name), "wb") as out:
                    out.write(store.read_bytes(f.path))
        store.upload_folder(tmp, prefix)
    store.write_bytes(f"{prefix}/{layout.BEST_FILE}", json.dumps(best).encode())
