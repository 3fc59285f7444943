"""Reward functions, with TRL's signature `f(completions, **kwargs) -> list[float]`: the builtin toy rewards,
TRL's reward library, and the run's own code (module `user_rewards`), each named as the panel plots it.

They are module-level so TRL's async rollout worker (a spawned process) can pickle them, and each scores
in [0, 1] as a *fraction* rather than pass/fail: the tiny random model starts low on every one of them, and
a graded score gives GRPO a reward spread within each group from the first step. Measured on the builtin
model with the default spec (2 CPU cores): digits 0.05 -> 0.95 in 100 steps; format 0.43 -> 0.99 and
length_target 0.15 -> 0.90 in 200. TRL names the metric `rewards/<function name>`.

Everything handed to a trainer pickles by reference (module-level functions, TRL's callable classes, and the
small classes below), because TRL's async rollout worker is a spawned process that receives them pickled.
"""

import importlib
import math
import numbers
import string

from .layout import USER_REWARDS_MODULE
from .spec_file import SpecFile
from .user_code import reward_function_names

DEFAULT_TARGET_LENGTH = 8
PLAIN_TEXT = frozenset(string.ascii_letters + string.digits + string.punctuation + " ")


def completion_text(completion) -> str:
    """The text of a completion: a plain string, or a conversational list of messages."""
    if isinstance(completion, str):
        return completion
    parts = []
    for message in completion:
        content = message.get("content") or ""
        if isinstance(content, list):  # multimodal-style content: a list of typed parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        parts.append(content)
    return "".join(parts)


def _fraction(text: str, allowed) -> float:
    return sum(ch in allowed for ch in text) / len(text) if text else 0.0


def digits(completions, **kwargs) -> list[float]:
    """Share of the completion's characters that are the digits 0-9."""
    return [_fraction(completion_text(c), string.digits) for c in completions]


def length_target(completions, target_length=None, **kwargs) -> list[float]:
    """1 at exactly `target_length` characters (a dataset column, else 8), falling linearly to 0 at twice that."""
    targets = target_length or [DEFAULT_TARGET_LENGTH] * len(completions)
    scores = []
    for completion, target in zip(completions, targets, strict=True):
        length = len(completion_text(completion))
        scores.append(max(0.0, 1.0 - abs(length - target) / target))
    return scores


def format(completions, **kwargs) -> list[float]:
    """Share of the completion's characters that are plain printable ASCII (no byte soup, no control codes)."""
    return [_fraction(completion_text(c), PLAIN_TEXT) for c in completions]


DISTINCT_SPAN = 10      # distinct_chars asks for this many distinct characters (fewer in a shorter answer)


def distinct_chars(completions, **kwargs) -> list[float]:
    """Distinct characters over min(length, 10), at most 1: a varied answer scores high ("42": 1, "5 6 7 8 9 10":
    0.8), one character repeated low ("8888888888": 0.1). A monitor that a degenerate policy fails (reward hacking)."""
    scores = []
    for c in completions:
        text = completion_text(c).strip()
        scores.append(min(1.0, len(set(text)) / min(len(text), DISTINCT_SPAN)) if text else 0.0)
    return scores


def exact_answer(completions, answer=None, **kwargs) -> list[float]:
    """1 when the completion, stripped, is the row's `answer` exactly, else 0: no constant or repeated answer earns
    more than the share of rows it happens to answer (the default demo's reward and its held-out measure)."""
    answers = answer or [None] * len(completions)
    return [1.0 if right is not None and completion_text(c).strip() == str(right) else 0.0
            for c, right in zip(completions, answers, strict=True)]


BUILTIN_REWARDS = {"digits": digits, "length_target": length_target, "format": format,
                   "distinct_chars": distinct_chars, "exact_answer": exact_answer}


def _trl_rewards():
    from trl import rewards  # noqa: PLC0415 TRL is absent on a Space

    return rewards


# TRL's reward library by the metric name TRL logs it under. The factories read their parameters from the spec.
TRL_REWARDS = {
    "accuracy_reward": lambda spec: _trl_rewards().accuracy_reward,
    "reasoning_accuracy_reward": lambda spec: _trl_rewards().reasoning_accuracy_reward,
    "think_format_reward": lambda spec: _trl_rewards().think_format_reward,
    "soft_overlong_punishment_reward": lambda spec: _trl_rewards().get_soft_overlong_punishment(
        max_completion_len=spec.get("overlong_max_tokens") or spec["max_completion_length"],
        soft_punish_cache=spec.get("overlong_cache_tokens", 0)),
    "repetition_penalty_reward": lambda spec: _trl_rewards().get_repetition_penalty_reward(
        ngram_size=spec.get("repetition_ngram_size", 3), max_penalty=spec.get("repetition_max_penalty", -1.0)),
}
# The dataset column (reward keyword) a reward cannot work without, and the package it imports.
NEEDS_COLUMN = {"accuracy_reward": "solution", "reasoning_accuracy_reward": "solution", "exact_answer": "answer"}
NEEDS_PACKAGE = {"accuracy_reward": "math-verify==0.9.0", "reasoning_accuracy_reward": "math-verify==0.9.0"}
PACKAGE_FOR_IMPORT = {"math_verify": "math-verify==0.9.0"}
CHOICES = (*BUILTIN_REWARDS, *TRL_REWARDS)


class RewardFunctionError(RuntimeError):
    """A reward function raised, or returned something TRL cannot use; the message names the function."""


ONE_PER_COMPLETION = ("return one float per completion, a list of len(completions) in their order, e.g. "
                      "return [1.0 if right(c) else 0.0 for c in completions]")
FLOAT_EACH = ("return a float for every completion: 0.0 for one your code cannot judge (None, NaN and strings are "
              "no score), e.g. return [1.0 if right(c) else 0.0 for c in completions]")


def checked_scores(name: str, scores, expected: int, allow_none: bool = False) -> list:
    """`scores` as floats, or RewardFunctionError saying what is wrong with them (one finite float per completion)."""
    if isinstance(scores, (str, bytes, dict)) or not hasattr(scores, "__len__"):
        raise RewardFunctionError(f"reward function {name!r} returned {type(scores).__name__}, not a list of floats; "
                                  f"{ONE_PER_COMPLETION}")
    if len(scores) != expected:
        raise RewardFunctionError(f"reward function {name!r} returned {len(scores)} scores for {expected} "
                                  f"completions; {ONE_PER_COMPLETION}")
    out = []
    for i, score in enumerate(scores):
        if score is None and allow_none:
            out.append(None)
        elif isinstance(score, numbers.Real) and math.isfinite(float(score)):
            out.append(float(score))
        else:
            shown = repr(score) if len(repr(score)) <= 40 else repr(score)[:40] + "..."
            raise RewardFunctionError(f"reward function {name!r} returned {shown} ({type(score).__name__}) at "
                                      f"index {i}; {FLOAT_EACH}")
    return out


class UserReward:
    """A function of the run's own reward code, by name. It pickles as (module, name) and is imported where it
    runs; a failure is re-raised naming the function (the original traceback stays chained to it)."""

    def __init__(self, name: str, module: str = USER_REWARDS_MODULE):
        self.__name__ = name
        self.module = module

    def function(self):
        return getattr(importlib.import_module(self.module), self.__name__)

    def __call__(self, *args, **kwargs) -> list[float]:
        try:
            scores = self.function()(*args, **kwargs)
        except Exception as error:
            raise RewardFunctionError(f"reward function {self.__name__!r} raised "
                                      f"{type(error).__name__}: {error}") from error
        completions = kwargs["completions"] if "completions" in kwargs else args[0]
        return checked_scores(self.__name__, scores, len(completions))


class Weighted:
    """A reward scaled by its weight, for TRL's async trainer (it has no `reward_weights`; it sums with weight 1)."""

    def __init__(self, reward, weight: float):
        self.reward = reward
        self.weight = weight
        self.__name__ = getattr(reward, "__name__", type(reward).__name__)

    def __call__(self, *args, **kwargs) -> list:
        return [None if r is None else r * self.weight for r in self.reward(*args, **kwargs)]


def reward_functions(names: list[str], spec: SpecFile | None = None) -> list:
    """The builtin and TRL reward functions named in a RunSpec, in order."""
    unknown = [n for n in names if n not in CHOICES]
    if unknown:
        raise ValueError(f"unknown reward(s) {', '.join(unknown)}; choose from {', '.join(CHOICES)}")
    spec = spec or {}
    return [BUILTIN_REWARDS[n] if n in BUILTIN_REWARDS else TRL_REWARDS[n](spec) for n in names]


def run_rewards(spec: SpecFile) -> tuple[list, list[float]]:
    """Every reward of the run (chosen ones, then the run's own code, which is imported now) and their weights."""
    functions = reward_functions(spec["rewards"], spec)
    code_names = reward_function_names(spec.get("reward_code") or "")
    for name in code_names:
        reward = UserReward(name)
        reward.function()   # import now: an error in the module fails the run before training starts
        functions.append(reward)
    names = [*spec["rewards"], *code_names]
    weights = spec.get("reward_weights") or {}
    return functions, [float(weights.get(name, 1.0)) for name in names]
