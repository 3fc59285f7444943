"""A run's task data: where its rows come from, which column is the prompt, which columns reach the rewards.

The trainer (`load_task_dataset`) and the pre-launch check (`runtime.check.check_task`) shape rows with the same
functions: every prompt becomes a conversation (a plain-text prompt is one user message; the run's system
prompt, if set, comes first and replaces the dataset's own), and each mapped column is passed to the reward
functions under its keyword name (`reward_columns` entries are `name` or `name=column`).
"""

import json
import os

from .layout import DATA_DIR
from .prompts import BUILTIN_PREFIX, builtin_eval_rows, builtin_rows
from .spec_file import SpecFile

FILE_SUFFIXES = (".jsonl", ".parquet")
# Names that only look like a file: refused with "use .jsonl or .parquet" rather than taken for a Hub id.
_FILE_LIKE = FILE_SUFFIXES + (".json", ".csv", ".tsv", ".txt", ".arrow", ".xlsx", ".zip", ".gz")
# Keywords TRL itself passes to reward functions: a dataset column must not take one of these names.
TRL_REWARD_ARGUMENTS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric")
RESERVED_COLUMN_NAMES = frozenset({*TRL_REWARD_ARGUMENTS, "prompt", "completion", "environments"})


class TaskDataError(ValueError):
    """A row or a file cannot become a training task; the message says which and why."""


def is_local_file(dataset: str) -> bool:
    """Whether a RunSpec's dataset names a local file rather than a builtin set or a Hub dataset id."""
    if not dataset or dataset.startswith(BUILTIN_PREFIX):
        return False
    return (dataset.startswith(("/", "./", "../", "~")) or dataset.lower().endswith(_FILE_LIKE)
            or os.path.isfile(os.path.expanduser(dataset)))


HELD_OUT_PREFIX = "heldout-"      # the run's copy of a held-out file: data/heldout-<name>


def local_copy_path(run_dir: str, dataset: str, held_out: bool = False) -> str:
    """Where a run keeps its copy of a local dataset file (uploaded with the run, so HF Jobs can read it); a
    held-out file's copy is named apart, so it never replaces the training file's."""
    return os.path.join(run_dir, DATA_DIR, (HELD_OUT_PREFIX if held_out else "") + os.path.basename(dataset))


def prompt_key(prompt) -> str:
    """A prompt (text or messages) as one comparable string: equal keys, the same prompt for the model."""
    return json.dumps(prompt, sort_keys=True, ensure_ascii=False, default=str)


def parse_reward_columns(entries: list[str]) -> dict[str, str]:
    """`["solution", "answer=final"]` -> `{"solution": "solution", "answer": "final"}` (keyword -> column)."""
    columns = {}
    for entry in entries:
        name, sep, column = entry.partition("=")
        columns[name.strip()] = column.strip() if sep else name.strip()
    return columns


def to_messages(value, system_prompt: str = "") -> list[dict]:
    """A prompt cell as the conversation TRL trains on."""
    if isinstance(value, str):
        messages = [{"role": "user", "content": value}]
    elif (isinstance(value, list) and value
          and all(isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m for m in value)):
        messages = [{"role": m["role"], "content": m["content"]} for m in value]
    else:
        raise TaskDataError(f"a prompt must be text or a list of {{role, content}} messages, not {_describe(value)}")
    if system_prompt:
        messages = [{"role": "system", "content": system_prompt}, *(m for m in messages if m["role"] != "system")]
    return messages


def _describe(value) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60] + '...' if len(text) > 60 else text}"


def task_row(row: dict, prompt_column: str, columns: dict[str, str], system_prompt: str) -> dict:
    """One dataset row as TRL sees it: the conversation in `prompt`, then each reward keyword's value."""
    return {"prompt": to_messages(row[prompt_column], system_prompt), **{k: row[c] for k, c in columns.items()}}


def missing_columns(available: list[str], prompt_column: str, columns: dict[str, str]) -> list[tuple[str, str]]:
    """(RunSpec field, column) for every mapped column the data does not have."""
    wanted = [("prompt_column", prompt_column), *(("reward_columns", c) for c in columns.values())]
    return [(field, column) for field, column in wanted if column not in available]


def render_prompt(tokenizer, messages: list[dict]) -> str:
    """The prompt exactly as the model reads it: the chat template applied, ready for the assistant's turn."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def count_tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


# ---- reading a local file (the check reads a few rows; the trainer loads it with `datasets`)

def read_file_rows(path: str, limit: int) -> tuple[list[dict], int]:
    """The first `limit` rows of a local .jsonl or .parquet file, and how many rows it has."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in FILE_SUFFIXES:
        raise TaskDataError(f"{os.path.basename(path)} is not a .jsonl or .parquet file")
    if not os.path.isfile(path):
        raise TaskDataError(f"no file at {path}")
    try:
        return _read_jsonl(path, limit) if suffix == ".jsonl" else _read_parquet(path, limit)
    except UnicodeDecodeError as exc:
        raise TaskDataError(f"{os.path.basename(path)} is not UTF-8 text (byte {exc.start})") from exc


def _read_jsonl(path: str, limit: int) -> tuple[list[dict], int]:
    rows, total = [], 0
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            total += 1
            if len(rows) >= limit:
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise TaskDataError(f"line {number} of {os.path.basename(path)} is not JSON ({exc})") from exc
            if not isinstance(row, dict):
                raise TaskDataError(f"line {number} of {os.path.basename(path)} is not a JSON object")
            rows.append(row)
    return rows, total


def _read_parquet(path: str, limit: int) -> tuple[list[dict], int]:
    import pyarrow.parquet as pq  # noqa: PLC0415 only for Parquet files

    try:
        parquet = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow says ArrowInvalid, OSError, ... depending on what the bytes are
        raise TaskDataError(f"{os.path.basename(path)} is not a Parquet file ({exc})") from exc
    rows = []
    for batch in parquet.iter_batches(batch_size=max(limit, 1)):
        rows = batch.to_pylist()[:limit]
        break
    return rows, parquet.metadata.num_rows


# ---- the trainer's dataset

def _raw_dataset(spec: SpecFile, run_dir: str, held_out: bool = False):
    """The rows of the run's dataset (or, `held_out`, of its held-out split or file) as they are stored."""
    from datasets import Dataset, load_dataset  # noqa: PLC0415 heavy: trainer only, absent on a Space

    source = spec["dataset"]
    if held_out and spec.get("eval_source") == "file":
        path = local_copy_path(run_dir, spec["eval_file"], held_out=True)
        return load_dataset("json" if path.endswith(".jsonl") else "parquet", data_files=path, split="train")
    split = spec.get("eval_split") if held_out else spec.get("dataset_split")
    if source.startswith(BUILTIN_PREFIX):
        name = source[len(BUILTIN_PREFIX):]
        return Dataset.from_list(builtin_eval_rows(name) if held_out else builtin_rows(name))
    if is_local_file(source):
        path = local_copy_path(run_dir, source)
        return load_dataset("json" if path.endswith(".jsonl") else "parquet", data_files=path, split="train")
    return load_dataset(source, spec.get("dataset_config") or None, split=split or "train")


def held_out_rows(spec: SpecFile) -> int:
    """How many of the dataset's first rows the run holds out of training (0 unless its held-out set is 'rows')."""
    return int(spec.get("eval_rows") or 0) if spec.get("eval_source") == "rows" else 0


def load_task_dataset(spec: SpecFile, run_dir: str, held_out: bool = False):
    """The run's rows as a `datasets.Dataset` with a conversational `prompt` and one column per reward keyword:
    the training rows, or (`held_out`) the held-out set's, at most `eval_max_prompts` of them."""
    source = spec["dataset"]
    data = _raw_dataset(spec, run_dir, held_out and spec.get("eval_source") in ("split", "file"))
    kept = held_out_rows(spec)
    if kept and held_out:
        data = data.select(range(min(kept, len(data))))
    elif kept:
        if kept >= len(data):
            raise TaskDataError(f"eval_rows holds out {kept} rows, but {source} has only {len(data)}: training would "
                                "have none")
        data = data.select(range(kept, len(data)))
    if held_out:
        data = data.select(range(min(len(data), int(spec.get("eval_max_prompts") or len(data)))))
    prompt_column = spec.get("prompt_column") or "prompt"
    columns = parse_reward_columns(spec.get("reward_columns") or [])
    missing = missing_columns(data.column_names, prompt_column, columns)
    if missing:
        raise TaskDataError(f"dataset {source} has no column {', '.join(repr(c) for _, c in missing)}; "
                            f"its columns are {', '.join(data.column_names)}")
    system = spec.get("system_prompt") or ""
    # remove_columns drops the originals before the mapped row is written, so "prompt" can be both.
    return data.map(lambda row: task_row(row, prompt_column, columns, system), remove_columns=data.column_names)


def drop_long_prompts(data, tokenizer, limit: int):
    """Keep the rows whose templated prompt has at most `limit` tokens (0: keep all); return (rows, dropped)."""
    if not limit:
        return data, 0
    kept = data.filter(lambda batch: [count_tokens(tokenizer, render_prompt(tokenizer, p)) <= limit
                                      for p in batch["prompt"]], batched=True)
    return kept, len(data) - len(kept)
