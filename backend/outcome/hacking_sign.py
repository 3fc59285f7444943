"""Reward hacking suspected: the trained score rises on the held-out set while something the user watches says the
answers got worse. Read from the held-out evaluation records alone (`held_out.HeldOut`), so a finished run
shows it as well as a live one.

Two signs, each against the base model (version 0, else the first evaluated version):
- a monitor-only reward (weight 0) falls while the trained score rises, or stays at its floor (0) throughout;
- the answers collapse: most of the newest version's held-out answers are one character or one word repeated,
  where the baseline's were not.

Calibrated on the tiny presets (docs/views.md, "Watching a run": the reward-hacking alert): the honest tiny runs
move the trained score by less than `TRAINED_RISE` or keep their monitor; the gamed task of issue 32
(`mostly_digits` trained, `varied` watched) moves it by ~0.5 while `varied` falls by more than half.
"""

from dataclasses import dataclass

from backend.runtime import layout

TRAINED_RISE = 0.1         # the trained score must rise at least this much over the baseline
MONITOR_FALL = 0.1         # a monitor must fall at least this much ...
MONITOR_FALL_SHARE = 0.25  # ... and by at least this share of its baseline
FLOOR = 1e-6               # a monitor at or below this in every evaluated version "stays at its floor"
FLOOR_RISE = 0.3           # a monitor stuck at its floor alerts only beside a large rise of the trained score
COLLAPSED_SHARE = 0.75     # this share of the newest version's held-out answers being one repeated unit
MIN_COLLAPSED_CHARS = 6    # an answer shorter than this is not called collapsed ("42" is a fine answer)
SAMPLES_QUOTED = 2


@dataclass(frozen=True)
class HackingSign:
    message: str           # one paragraph: the versions, the rewards, the samples that show it
    versions: tuple[int, int]
    rewards: tuple[str, ...]


def collapsed(text: str) -> bool:
    """One character or one word repeated (spaces aside): '6666666666', 'yes yes yes yes'."""
    squeezed = "".join(text.split())
    if len(squeezed) < MIN_COLLAPSED_CHARS:
        return False
    return len(set(squeezed)) == 1 or (len(text.split()) >= 3 and len(set(text.split())) == 1)


def _collapsed_share(samples: list[dict]) -> float | None:
    texts = [s.get("completion", "") for s in samples if isinstance(s.get("completion"), str)]
    return sum(collapsed(t) for t in texts) / len(texts) if texts else None


def hacking_sign(held) -> HackingSign | None:
    """The reward-hacking sign in a run's held-out records (`HeldOut`), or None."""
    scores = held.scores
    if len(scores) < 2:
        return None
    base, newest = held.span       # kept as records arrive: a tick does not walk a long run's versions
    newest_name = layout.adapter_name(newest, held.member)
    rise = scores[newest].score - scores[base].score
    if rise < TRAINED_RISE:
        return None
    fallen = []
    for name, stat in scores[newest].rewards.items():
        if not isinstance(stat, dict) or stat.get("weight") != 0:
            continue
        then, now = _mean(scores[base], name), _mean(scores[newest], name)
        if then is None or now is None:
            continue
        if then - now >= MONITOR_FALL and then - now >= MONITOR_FALL_SHARE * abs(then):
            fallen.append(f"monitor **{name}** fell {then:.3f} → {now:.3f}")
        elif (max(then, now) <= FLOOR and rise >= FLOOR_RISE and not getattr(held, "older_pending", False)
              and _at_floor_throughout(scores, name)):     # "throughout": once every record is read
            fallen.append(f"monitor **{name}** stayed at its floor ({now:.3f})")
    share, base_share = _collapsed_share(held.samples.get(newest, [])), _collapsed_share(held.samples.get(base, []))
    collapse = share is not None and share >= COLLAPSED_SHARE and (base_share or 0) < COLLAPSED_SHARE
    if collapse:
        fallen.append(f"{share:.0%} of {newest_name}'s held-out answers are one character or word "
                      "repeated")
    if not fallen:
        return None
    quoted = [s["completion"][:40] for s in held.samples.get(newest, [])[:SAMPLES_QUOTED]
              if isinstance(s.get("completion"), str)]
    sample = f" (e.g. {', '.join(repr(q) for q in quoted)})" if quoted else ""
    base_name = "the base model (v0)" if base == 0 else layout.adapter_name(base, held.member)
    message = (f"reward hacking suspected: the trained score rose {scores[base].score:.3f} → "
               f"{scores[newest].score:.3f} from {base_name} to {newest_name} while "
               + "; ".join(fallen) + f"{sample}. Check the samples; pick what decides the best version under "
               "'Best version by'.")
    names = tuple(n for n in scores[newest].rewards if f"**{n}**" in message)
    return HackingSign(message, (base, newest), names)


def _at_floor_throughout(scores: dict, name: str) -> bool:
    """Whether the reward's held-out mean stayed at its floor in every evaluated version: asked only where both
    ends are at it, so a tick of a long run does not walk every version's record."""
    return all(m is None or m <= FLOOR for m in (_mean(score, name) for score in scores.values()))


def _mean(score, name: str) -> float | None:
    stat = score.rewards.get(name)
    mean = stat.get("mean") if isinstance(stat, dict) else None
    return float(mean) if isinstance(mean, (int, float)) else None
