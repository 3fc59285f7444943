"""The task check's data report: a few rows of the dataset (given in the request, or from a file, or a builtin set)
shaped as the trainer shapes them (task.py), the held-out set checked against them, the first prompt rendered with the
model's chat template and every prompt's tokens counted.
"""

import json

from ..prompts import BUILTIN_PREFIX, builtin_eval_rows, builtin_rows
from ..task import (
    TaskDataError,
    count_tokens,
    is_local_file,
    missing_columns,
    parse_reward_columns,
    prompt_key,
    read_file_rows,
    render_prompt,
    task_row,
    to_messages,
)
from ..tiny_model import build_tokenizer

TOKENIZER_FILES = ["tokenizer*", "special_tokens_map.json", "vocab*", "merges.txt", "*.model", "*.tiktoken",
                   "chat_template*", "config.json"]
PREVIEW_CELL_CHARS = 300
MOST = 0.5   # prompts over the limit on more than this share of rows: refused, not just warned about


def load_rows(request: dict) -> tuple[list[dict], int | None]:
    spec, limit = request["spec"], request["stats_rows"]
    if request.get("rows") is not None:
        return request["rows"], request.get("num_rows")
    if is_local_file(spec["dataset"]):
        return read_file_rows(request["file"] or spec["dataset"], limit)
    if spec["dataset"].startswith(BUILTIN_PREFIX):
        rows = builtin_rows(spec["dataset"][len(BUILTIN_PREFIX):])
        return rows[:limit], len(rows)
    raise TaskDataError("no rows were given for a Hub dataset")


def load_tokenizer(source: str | None):
    if source is None:
        return None
    if source == "builtin":
        return build_tokenizer()
    if source.startswith("hub:"):    # a check job fetches the model's tokenizer files itself
        from huggingface_hub import snapshot_download  # noqa: PLC0415 only a check job needs it

        source = snapshot_download(source[len("hub:"):], allow_patterns=TOKENIZER_FILES)
    from transformers import AutoTokenizer  # noqa: PLC0415 transformers loads slowly: only for a model's own tokenizer

    return AutoTokenizer.from_pretrained(source)


def _cell(value):
    text = value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= PREVIEW_CELL_CHARS else text[:PREVIEW_CELL_CHARS] + " ..."


def check_data(request: dict) -> tuple[dict, list[dict], object]:
    """The data report (columns, preview, the templated prompt, token counts, problems), task rows, tokenizer."""
    spec = request["spec"]
    report = {"errors": [], "warnings": [], "columns": [], "preview": [], "num_rows": None}
    try:
        rows, report["num_rows"] = load_rows(request)
    except (TaskDataError, ValueError, OSError) as exc:
        report["errors"].append(["dataset", f"cannot read {spec['dataset']}: {exc}"])
        return report, [], None
    if not rows:
        report["errors"].append(["dataset", f"{spec['dataset']} has no rows"])
        return report, [], None
    columns = request.get("columns") or list(dict.fromkeys(k for row in rows for k in row))
    report["columns"] = columns
    report["preview"] = [{k: _cell(row.get(k)) for k in columns} for row in rows[:request["preview_rows"]]]
    prompt_column = spec.get("prompt_column") or "prompt"
    mapped = parse_reward_columns(spec.get("reward_columns") or [])
    for field, column in missing_columns(columns, prompt_column, mapped):
        report["errors"].append([field, f"no column {column!r} in the dataset; its columns are {', '.join(columns)}"])
    if report["errors"]:
        return report, [], None
    tasks = []
    for i, row in enumerate(rows):
        try:
            tasks.append(task_row(row, prompt_column, mapped, spec.get("system_prompt") or ""))
        except (TaskDataError, KeyError) as exc:
            report["errors"].append(["prompt_column", f"row {i}: {exc}"])
            return report, [], None
    report["prompt_messages"] = tasks[0]["prompt"]
    check_held_out(request, rows, report)
    if report["errors"]:
        return report, [], None
    tokenizer = _measure_prompts(request, tasks, report)
    return report, tasks, tokenizer


HELD_OUT_FIELD = {"split": "eval_split", "file": "eval_file", "rows": "eval_rows"}


def held_out_and_training(request: dict, rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """The held-out rows the check reads, and the training rows to compare them with (those read)."""
    spec = request["spec"]
    source = spec.get("eval_source")
    if source == "rows":
        kept = int(spec.get("eval_rows") or 0)
        return rows[:kept], rows[kept:]
    if source == "file":
        return read_file_rows(request["eval_file"], request["stats_rows"])[0], rows
    if request.get("eval_rows") is not None:
        return request["eval_rows"], rows
    if spec["dataset"].startswith(BUILTIN_PREFIX):
        return builtin_eval_rows(spec["dataset"][len(BUILTIN_PREFIX):]), rows
    raise TaskDataError("no rows were given for the Hub dataset's held-out split")


def check_held_out(request: dict, rows: list[dict], report: dict) -> None:
    """Refuse a held-out set that is empty, lacks a column the prompt or a reward needs, or shares prompts with the
    training rows (among the rows read), naming the held-out field."""
    spec = request["spec"]
    field = HELD_OUT_FIELD.get(spec.get("eval_source"))
    if field is None:
        return

    def refuse(message: str) -> None:
        report["errors"].append([field, message])

    try:
        held, training = held_out_and_training(request, rows)
    except (TaskDataError, ValueError, OSError) as exc:
        return refuse(f"cannot read the held-out set: {exc}")
    if not held:
        return refuse("the held-out set has no rows: give a split or file with rows, or hold out rows of the dataset")
    total = report["num_rows"] or len(rows)
    if spec.get("eval_source") == "rows" and total <= len(held):
        return refuse(f"eval_rows holds out {spec.get('eval_rows')} rows, but the dataset has {total}: training "
                      "would have none")
    prompt_column = spec.get("prompt_column") or "prompt"
    mapped = parse_reward_columns(spec.get("reward_columns") or [])
    columns = request.get("eval_columns") or list(dict.fromkeys(k for row in held for k in row))
    missing = missing_columns(columns, prompt_column, mapped)
    for where, column in missing:
        need = "the prompt" if where == "prompt_column" else "a reward (reward_columns)"
        refuse(f"the held-out set has no column {column!r}, which {need} reads; its columns are {', '.join(columns)}")
    if missing:
        return None
    system = spec.get("system_prompt") or ""
    try:
        trained = {prompt_key(to_messages(row[prompt_column], system)) for row in training if prompt_column in row}
        shared = [i for i, row in enumerate(held) if prompt_key(to_messages(row[prompt_column], system)) in trained]
    except TaskDataError as exc:
        return refuse(f"a held-out prompt: {exc}")
    if shared:
        return refuse(f"{len(shared)} of the {len(held)} held-out prompts checked are training prompts too (held-out "
                      f"row {shared[0]} first): a held-out score would measure memory, not the task; hold out other "
                      "prompts")
    report["held_out_rows"] = len(held)
    return None


def _measure_prompts(request: dict, tasks: list[dict], report: dict):
    spec = request["spec"]
    try:
        tokenizer = load_tokenizer(request.get("tokenizer"))
    except Exception as exc:  # a tokenizer is a folder of files from anywhere: any failure is only a warning
        report["warnings"].append(f"could not load the tokenizer of {spec['model']} ({type(exc).__name__}: {exc}); "
                                  "prompts are shown without the chat template")
        return None
    if tokenizer is None:
        return None
    try:
        texts = [render_prompt(tokenizer, t["prompt"]) for t in tasks]
    except Exception as exc:
        report["errors"].append(["model", (f"the tokenizer of {spec['model']} cannot format a conversation "
                                           f"({type(exc).__name__}: {exc}); TRL needs a chat template")])
        return None
    counts = [count_tokens(tokenizer, text) for text in texts]
    limit = spec.get("max_prompt_tokens") or 0
    long_rows = sum(c > limit for c in counts) if limit else 0
    report.update(prompt_text=texts[0], prompt_tokens=counts[0], checked_rows=len(counts), longest=max(counts),
                  long_rows=long_rows)
    if long_rows:
        share = long_rows / len(counts)
        message = (f"{share:.0%} of the {len(counts)} rows checked ({long_rows}) have prompts longer than {limit} "
                   f"tokens (the longest has {max(counts)}); the trainer skips them. Raise max_prompt_tokens or "
                   "shorten the prompts or the system prompt")
        if share > MOST:
            report["errors"].append(["max_prompt_tokens", message])
        else:
            report["warnings"].append(message)
    return tokenizer
