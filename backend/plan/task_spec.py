"""The task's own rules in RunSpec validation: the dataset source, the column mapping, the rewards, their weights
and parameters, and the reward code read without running it. Pure; the checks that read data or run code are in
task_check.py.
"""

import math
import os
import re

from backend.plan.engines import reaches_hub
from backend.plan.spec_fields import FieldError
from backend.runtime import rewards as runtime_rewards
from backend.runtime.best_rule import best_by_problem, rule_text
from backend.runtime.prompts import EVAL_SPLIT, builtin_names
from backend.runtime.task import FILE_SUFFIXES, RESERVED_COLUMN_NAMES, is_local_file, parse_reward_columns
from backend.runtime.user_code import code_problems, reward_function_names

BUILTIN_DATASETS = tuple(builtin_names())
BUILTIN_REWARDS = tuple(runtime_rewards.BUILTIN_REWARDS)
TRL_REWARDS = tuple(runtime_rewards.TRL_REWARDS)
REWARD_CHOICES = (*BUILTIN_REWARDS, *TRL_REWARDS)
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
EVAL_SOURCES = ("none", "split", "file", "rows")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def task_errors(spec) -> list[FieldError]:
    """Every problem of a RunSpec's task fields. RunSpec.validate calls this, and its fields are declared with
    the choices above: this module sits below spec.py and takes the spec as it comes."""
    errs = _check_dataset(spec.dataset, spec.executor)
    if not spec.dataset.startswith("builtin:") and not is_local_file(spec.dataset):
        if spec.dataset_config and not _NAME.match(spec.dataset_config):
            errs.append(FieldError("dataset_config", "letters, digits, '-', '_' or '.'; empty for the first"))
        if not _NAME.match(spec.dataset_split or ""):
            errs.append(FieldError("dataset_split", "name a split such as train"))
    if not spec.prompt_column or "\n" in spec.prompt_column:
        errs.append(FieldError("prompt_column", "name the column that holds the prompt, e.g. prompt"))
    columns, problem = _check_reward_columns(spec.reward_columns)
    if problem:
        errs.append(FieldError("reward_columns", problem))
    errs += _check_rewards(spec, columns)
    errs += held_out_errors(spec, columns)
    return errs


def held_out_errors(spec, columns: set[str]) -> list[FieldError]:
    """The held-out set's rules that need no data (task_check reads it: empty, overlapping, missing columns)."""
    errs = []
    bad = [r for r in spec.monitor_rewards if r not in REWARD_CHOICES]
    if bad:
        errs.append(FieldError("monitor_rewards",
                               f"unknown: {', '.join(bad)}; choose from {', '.join(REWARD_CHOICES)}"))
    twice = [r for r in spec.monitor_rewards if r in spec.rewards]
    if twice:
        errs.append(FieldError("monitor_rewards", f"{', '.join(twice)} is already a training reward; to watch it "
                                                  "without training on it, give it weight 0 in reward_weights"))
    for reward, column in runtime_rewards.NEEDS_COLUMN.items():
        if reward in spec.monitor_rewards and column not in columns:
            errs.append(FieldError("monitor_rewards", f"{reward} compares answers with a {column!r} column; map one "
                                                      f"in reward_columns ({column}, or {column}=<your column>)"))
    if spec.monitor_rewards and spec.eval_source == "none":
        errs.append(FieldError("monitor_rewards", "monitor-only rewards are scored on the held-out set: choose a "
                                                  "held-out set (eval_source), or clear them"))
    if spec.best_by and spec.eval_source == "none":
        errs.append(FieldError("best_by", "the best version is chosen by held-out scores: choose a held-out set "
                                          "(eval_source), or clear it"))
    else:
        problem = best_by_problem(spec.best_by, [*spec.rewards, *reward_function_names(spec.reward_code),
                                                 *spec.monitor_rewards])
        if problem:
            errs.append(FieldError("best_by", problem))
    if spec.eval_source == "split":
        split = (spec.eval_split or "").strip()
        if spec.dataset.startswith("builtin:"):
            if split != EVAL_SPLIT:
                errs.append(FieldError("eval_split", f"a builtin set's held-out split is {EVAL_SPLIT!r}"))
        elif is_local_file(spec.dataset):
            errs.append(FieldError("eval_source", "a local file has no splits: hold out 'rows' of it, or give a "
                                                  "held-out 'file'"))
        elif not _NAME.match(split):
            errs.append(FieldError("eval_split", "name the split to evaluate on, such as test or validation"))
        elif split == (spec.dataset_split or "").strip():
            errs.append(FieldError("eval_split", f"the held-out split is the training split ({split!r}): every "
                                                 "held-out prompt would be trained on; name another split, or hold "
                                                 "out 'rows' of it"))
    elif spec.eval_source == "file":
        path = (spec.eval_file or "").strip()
        if not path or not path.lower().endswith(FILE_SUFFIXES):
            errs.append(FieldError("eval_file", "give a local .jsonl or .parquet file with the training data's "
                                                "columns"))
        elif os.path.abspath(os.path.expanduser(path)) == os.path.abspath(os.path.expanduser(spec.dataset)):
            errs.append(FieldError("eval_file", "the held-out file is the training dataset: every held-out prompt "
                                                "would be trained on; give another file, or hold out 'rows' of it"))
    return errs


def held_out_summary(spec) -> str:
    """The held-out evaluation in one line, as the preview and the review show it."""
    if spec.eval_source == "none":
        return "Held-out evaluation: none (no held-out set)."
    source = {"split": f"split `{spec.eval_split}` of `{spec.dataset}`",
              "file": f"file `{os.path.basename(spec.eval_file)}`",
              "rows": f"the first {spec.eval_rows} rows of `{spec.dataset}` (not trained on)"}[spec.eval_source]
    how = ("greedy" if spec.eval_greedy else
           f"sampled at temperature {spec.temperature:g}, {spec.eval_samples_per_prompt} per prompt")
    when = ("every published adapter version" if not spec.eval_every else
            f"a version at least every {spec.eval_every} steps")
    watched = f"; monitor-only: {', '.join(spec.monitor_rewards)}" if spec.monitor_rewards else ""
    watched += (f"; the base model first, as version 0; the best version by {rule_text(spec.best_by)} (ties: the "
                "earliest), if it beats version 0")
    inflight = f", at most {spec.eval_max_inflight} requests in flight" if spec.mode == "distributed" else ""
    return (f"Held-out evaluation: {source}, up to {spec.eval_max_prompts} prompts, {how}, at {when}{inflight}"
            f"{watched}.")


def _check_dataset(dataset: str, executor: str) -> list[FieldError]:
    if dataset in BUILTIN_DATASETS:
        return []
    if is_local_file(dataset):
        if not dataset.lower().endswith(FILE_SUFFIXES):
            return [FieldError("dataset", f"{os.path.basename(dataset)!r} is not a .jsonl or .parquet file; "
                                          "convert it, or give a Hub dataset id")]
        return []
    if not HUB_ID.match(dataset or ""):
        return [FieldError("dataset", f"use one of {', '.join(BUILTIN_DATASETS)}, a Hub dataset id like 'org/name', "
                                      "or a local .jsonl / .parquet file")]
    if not reaches_hub(executor):
        return [FieldError("dataset", "local runs cannot download from the Hub; use a builtin: dataset or a local "
                                      ".jsonl / .parquet file, or run on Hugging Face Jobs")]
    return []


def _check_reward_columns(entries: list[str]) -> tuple[set[str], str | None]:
    """The reward keywords the mapped columns provide, or why the mapping is wrong."""
    names = [e.partition("=")[0].strip() for e in entries]
    columns = parse_reward_columns(entries)
    for entry, name in zip(entries, names):
        if not name.isidentifier():
            return set(columns), (f"{entry!r}: the part before '=' is the keyword the reward functions receive; "
                                  "it must be a Python name, e.g. solution or solution=answer")
        if name in RESERVED_COLUMN_NAMES:
            return set(columns), f"{name!r} is a name TRL passes itself; pass the column as another keyword"
        if not columns[name]:
            return set(columns), f"{entry!r}: name the dataset column after '='"
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        return set(columns), f"{', '.join(duplicates)} mapped more than once"
    return set(columns), None


def _check_rewards(spec, columns: set[str]) -> list[FieldError]:
    errs = []
    bad = [r for r in spec.rewards if r not in REWARD_CHOICES]
    if bad:
        errs.append(FieldError("rewards", f"unknown: {', '.join(bad)}; choose from {', '.join(REWARD_CHOICES)}"))
    for reward, column in runtime_rewards.NEEDS_COLUMN.items():
        if reward in spec.rewards and column not in columns:
            errs.append(FieldError("reward_columns", f"{reward} compares answers with a {column!r} column; map one "
                                                     f"({column}, or {column}=<your column>)"))
    problems = code_problems(spec.reward_code, columns) if spec.reward_code.strip() else []
    errs += [FieldError("reward_code", str(p)) for p in problems]
    code_names = reward_function_names(spec.reward_code)
    clash = [n for n in code_names if n in REWARD_CHOICES]
    if clash:
        errs.append(FieldError("reward_code", f"{', '.join(clash)} is already a reward name; rename your function"))
    if not spec.rewards and not code_names and not problems:
        errs.append(FieldError("rewards", f"choose one or more of {', '.join(REWARD_CHOICES)}, or write your own "
                                          "reward functions in reward_code"))
    names = {*spec.rewards, *code_names}
    unknown = [k for k in spec.reward_weights if k not in names]
    if unknown and not problems:
        errs.append(FieldError("reward_weights", f"no reward named {', '.join(unknown)} in this run; its rewards are "
                                                 f"{', '.join(sorted(names))}"))
    if any(not math.isfinite(w) for w in spec.reward_weights.values()):
        errs.append(FieldError("reward_weights", "weights must be finite numbers"))
    if "soft_overlong_punishment_reward" in spec.rewards:
        limit = spec.overlong_max_tokens or spec.max_completion_length
        if not 0 < spec.overlong_cache_tokens <= limit:
            errs.append(FieldError("overlong_cache_tokens", f"set the zone before the {limit}-token limit where "
                                                            f"the penalty grows: 1 to {limit} (e.g. {limit // 4})"))
    if "repetition_penalty_reward" in spec.rewards:
        if spec.repetition_ngram_size < 1:
            errs.append(FieldError("repetition_ngram_size", "must be at least 1 token, e.g. 3"))
        if spec.repetition_max_penalty > 0:
            errs.append(FieldError("repetition_max_penalty", "a penalty: 0 or below, e.g. -1"))
    return errs

