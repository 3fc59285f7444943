"""The samples table of the dashboard: what the policy wrote at a step (prompt, completion, rewards, advantage,
length), or one prompt followed across steps and held-out versions; the steps and prompts its pickers offer."""

import hashlib

SAMPLE_STEPS = 100         # the sample step picker offers the newest steps

SAMPLE_HEADERS = ["step", "version", "prompt", "completion", "rewards", "advantage", "length", "truncated"]


def sample_steps(view) -> list[int]:
    """The steps the trainer wrote samples of, newest first."""
    return sorted({int(s["step"]) for s in view.samples if isinstance(s.get("step"), (int, float))}, reverse=True)


HELD_OUT_KEY, TRAINING_KEY = "held-out:", "training:"
PROMPTS_FOLLOWED = 50      # prompts of each kind the follow picker offers


def prompt_key(prompt: str) -> str:
    """A training prompt's key in the follow picker (the text itself can be long)."""
    return TRAINING_KEY + hashlib.blake2b(prompt.encode(), digest_size=8).hexdigest()


def _head(text: str, chars: int = 60) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= chars else line[:chars - 1] + "…"


def sample_prompts(view, limit: int = PROMPTS_FOLLOWED) -> list[tuple[str, str]]:
    """(label, key) of the prompts the samples view can follow across steps and versions: the held-out prompts by
    their stable index (one row per evaluated version), and training prompts written at two steps or more."""
    held = getattr(view, "held_out", None)
    indices: dict[int, str] = {}
    for samples in (held.samples.values() if held is not None else ()):
        for s in samples:
            indices.setdefault(s["prompt_index"], str(s.get("prompt", "")))
    out = [(f"held-out #{i}: {_head(indices[i])}", f"{HELD_OUT_KEY}{i}") for i in sorted(indices)[:limit]]
    steps: dict[str, set] = {}
    for s in view.samples:
        if isinstance(s.get("prompt"), str):
            steps.setdefault(s["prompt"], set()).add(s.get("step"))
    repeated = [p for p, seen in steps.items() if len(seen) >= 2][:limit]
    return out + [(f"training: {_head(p)}", prompt_key(p)) for p in repeated]


def _sample_row(s: dict, version) -> list:
    rewards = " · ".join(f"{k.split('/', 1)[-1]} {v:.3g}" for k, v in (s.get("rewards") or {}).items()
                         if isinstance(v, (int, float)))
    advantage = s.get("advantage")
    return [s.get("step"), version, s.get("prompt", ""), s.get("completion", ""), rewards,
            "-" if not isinstance(advantage, (int, float)) else round(float(advantage), 3), s.get("length") or "-",
            {True: "yes", False: "no"}.get(s.get("truncated"), "-")]


def sample_rows(view, step: int | str | None = "latest", follow: str | None = None) -> list[list]:
    """What the policy wrote at `step` ("latest": the newest step with samples): prompt, completion, each
    reward, advantage, length in tokens and whether it hit the completion limit. With `follow` (a key of
    `sample_prompts`), one prompt across steps and versions instead, oldest first."""
    if follow:
        return followed_rows(view, str(follow))
    steps = sample_steps(view)
    if not steps:
        return []
    try:
        chosen = steps[0] if step in (None, "", "latest") else int(step)
    except (TypeError, ValueError):     # a value typed into the picker that is no step
        return []
    return [_sample_row(s, s.get("policy_version") if s.get("policy_version") is not None else "-")
            for s in view.samples if s.get("step") == chosen]


def followed_rows(view, key: str) -> list[list]:
    """One prompt's rows across steps and versions: a held-out prompt's answer by each evaluated version, or a
    training prompt's samples at each step it was drawn. An unknown key has no rows."""
    if key.startswith(HELD_OUT_KEY):
        held = getattr(view, "held_out", None)
        index = key[len(HELD_OUT_KEY):]
        if held is None or not index.isdigit():
            return []
        rows = []
        for version in sorted(held.samples):
            score = held.scores.get(version)
            for s in held.samples[version]:
                if s["prompt_index"] == int(index):
                    rows.append(_sample_row({**s, "step": score.step if score else "-"}, f"{version} (held-out)"))
        return rows
    matching = [s for s in view.samples if isinstance(s.get("prompt"), str) and prompt_key(s["prompt"]) == key]
    matching.sort(key=lambda s: s.get("step") if isinstance(s.get("step"), (int, float)) else -1)
    return [_sample_row(s, s.get("policy_version") if s.get("policy_version") is not None else "-")
            for s in matching]
