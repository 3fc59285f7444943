"""The launch form's "Your task" section: the dataset and its column mapping, the system prompt, the rewards with
their weights and parameters, and a Python editor for your own reward functions, with a check that previews it all.

`TaskSection` builds the components, keyed by RunSpec field names (they join the launch form), plus the check
button and its preview outputs. `preview_outputs` turns a TaskReport into what the preview shows: plain data,
so a test reads it without a browser.
"""

import dataclasses
import queue
import threading
from dataclasses import dataclass
from types import SimpleNamespace

import gradio as gr
import pandas as pd

from backend.plan.spec import HELD_OUT_SETTINGS, RunSpec
from backend.plan.spec_fields import limits_text
from backend.runtime.redact import redact_tokens
from panel.markdown import code_span, fenced, masked, plain

REQUIRED_CHOICE = "required-choice"     # a dropdown that must not be left empty (see ui.KEEP_CLEARED_CHOICES)
SPEC_FIELDS = {f.name: f for f in dataclasses.fields(RunSpec)}
# gr.Code has no `info`: the editor's label carries the field's help.
CODE_LABEL = f"{SPEC_FIELDS['reward_code'].metadata['label']}: {SPEC_FIELDS['reward_code'].metadata['help']}"

CHECKS_AT_ONCE = 16       # local checks wait their turn in backend.task.check (two at a time)
HELD_OUT_TITLE = "Held-out evaluation"


def _columns_text(columns: list[str] | str) -> str:
    return columns if isinstance(columns, str) else ", ".join(columns)


def format_weights(weights: dict[str, float] | str) -> str:
    """Reward weights as the form shows them: "accuracy_reward=1, think_format_reward=0.2"."""
    if isinstance(weights, str):
        return weights
    return ", ".join(f"{name}={weight:g}" for name, weight in weights.items())


@dataclass
class TaskSection:
    fields: dict
    check_btn: gr.Button
    message: gr.Markdown
    prompt: gr.Textbox
    scores: gr.Dataframe
    rows: gr.Dataframe
    held_out: gr.Accordion      # opened when one of its fields is refused (launch_view.SECTIONS)

    @classmethod
    def build(cls, initial: dict) -> "TaskSection":
        """The section's components, showing `initial` (the form's starting preset)."""
        start = SimpleNamespace(**{**initial, "reward_columns": _columns_text(initial["reward_columns"]),
                                   "reward_weights": format_weights(initial["reward_weights"]),
                                   "best_by": format_weights(initial.get("best_by") or {})})
        f = {}
        with gr.Accordion("Your task: dataset, prompt and rewards", open=True, elem_id="task-section"):
            with gr.Row():
                f["dataset"] = task_widget("dataset", start, scale=3, elem_classes=[REQUIRED_CHOICE])
                upload = gr.UploadButton("Upload .jsonl / .parquet", file_types=[".jsonl", ".parquet"], size="sm",
                                         elem_id="dataset-upload", scale=1)
                f["dataset_config"] = task_widget("dataset_config", start, scale=1)
                f["dataset_split"] = task_widget("dataset_split", start, scale=1)
            with gr.Row():
                for name in ("prompt_column", "reward_columns", "max_prompt_tokens"):
                    f[name] = task_widget(name, start)
            f["system_prompt"] = task_widget("system_prompt", start, lines=2)
            with gr.Row():
                f["rewards"] = task_widget("rewards", start, scale=3)
                f["reward_weights"] = task_widget("reward_weights", start, scale=1)
            with gr.Accordion("Reward parameters", open=False), gr.Row():
                for name in ("overlong_max_tokens", "overlong_cache_tokens", "repetition_ngram_size",
                             "repetition_max_penalty"):
                    f[name] = task_widget(name, start)
            f["reward_code"] = task_widget("reward_code", start, lines=10)
            with gr.Accordion(HELD_OUT_TITLE, open=False, elem_id="heldout-section") as held_out:
                with gr.Row():
                    for name in ("eval_source", "eval_split", "eval_file", "eval_rows"):
                        f[name] = task_widget(name, start)
                with gr.Row():
                    f["monitor_rewards"] = task_widget("monitor_rewards", start, scale=3)
                    f["best_by"] = task_widget("best_by", start, scale=2)
                with gr.Row():
                    for name in HELD_OUT_SETTINGS:
                        f[name] = task_widget(name, start)
            check_btn = gr.Button("Check task", elem_id="check-task-btn")
            message = gr.Markdown(elem_id="task-msg")
            # Shown once a check has filled them: empty, a table shows bare column headers "1 2 3".
            scores = gr.Dataframe(label="Sample completions and their scores", interactive=False,
                                  elem_id="task-scores", wrap=True, visible=False)
            with gr.Row():
                prompt = gr.Textbox(label="The first prompt, as the model sees it", lines=8, max_lines=16,
                                    interactive=False, elem_id="task-prompt", visible=False)
                rows = gr.Dataframe(label="First rows of the dataset", interactive=False, elem_id="task-rows",
                                    wrap=True, visible=False)
        upload.upload(_on_upload, [upload, f["eval_source"]],
                      [f["dataset"], f["eval_source"], f["monitor_rewards"], f["best_by"]])
        return cls(f, check_btn, message, prompt, scores, rows, held_out)

    def wire(self, panel, names: list[str], inputs: list) -> None:
        """Connect the check button to `panel.check_task` over every form field; a check job's progress shows as
        it goes."""
        def on_check(oauth_token: gr.OAuthToken | None, *values):
            # OAuth first: Gradio fills it only where it can match it positionally (never after *values).
            lines: queue.Queue = queue.Queue()
            done: dict = {}

            def work() -> None:
                try:
                    done["report"] = panel.check_task(dict(zip(names, values)),
                                                      oauth_token.token if oauth_token else None, progress=lines.put)
                finally:
                    lines.put(None)

            threading.Thread(target=work, daemon=True, name="task-check").start()
            for line in iter(lines.get, None):
                yield line, gr.update(), gr.update(), gr.update()
            if "report" not in done:
                raise gr.Error("The task check failed; see the panel's log.")
            message, rows, prompt, scores = preview_outputs(done["report"])
            yield message, shown(rows, not rows.empty), shown(prompt, bool(prompt)), shown(scores, not scores.empty)

        # A check job waits minutes on the Hub, not on this machine: more of them at once than the queue's default.
        self.check_btn.click(on_check, inputs, [self.message, self.rows, self.prompt, self.scores],
                             concurrency_limit=CHECKS_AT_ONCE)


def shown(value, filled: bool):
    """A preview output with its value, visible only where the check gave it something to show."""
    return gr.update(value=value, visible=filled)


def task_widget(name: str, start, **kw):
    """The widget of task field `name`, showing `start.<name>`, labelled and explained by the RunSpec field."""
    spec_field = SPEC_FIELDS[name]
    meta, value = spec_field.metadata, getattr(start, name)
    common = dict(label=meta["label"], elem_id=f"f-{name}", **kw)
    info = "; ".join(part for part in (meta["help"], limits_text(meta.get("limits"))) if part)
    if meta.get("widget") == "code":
        return gr.Code(value, language="python", label=CODE_LABEL, elem_id=f"f-{name}", interactive=True, **kw)
    if meta.get("suggestions"):
        return gr.Dropdown(list(meta["suggestions"]), value=value, allow_custom_value=True, info=info, **common)
    if meta.get("choices") and spec_field.type in (str, "str"):
        return gr.Radio(list(meta["choices"]), value=value, info=info, **common)
    if meta.get("choices"):
        return gr.CheckboxGroup(list(meta["choices"]), value=value, info=info, **common)
    if spec_field.type in (bool, "bool"):
        return gr.Checkbox(value, info=info, **common)
    if spec_field.type in (int, "int"):
        return gr.Number(value, precision=0, info=info, **common)
    if spec_field.type in (float, "float"):
        return gr.Number(value, info=info, **common)
    return gr.Textbox(value, info=info, **common)


def preview_outputs(report) -> tuple[str, pd.DataFrame, str, pd.DataFrame]:
    """(message, first rows, the first prompt as the model sees it, sample scores) for a TaskReport."""
    rows = pd.DataFrame(report.preview, columns=report.columns or None)
    return summary_markdown(report), rows, prompt_text(report), scores_table(report)


def summary_markdown(report) -> str:
    parts = []
    if report.errors:
        items = "\n".join(f"- **{plain(e.field)}**: {masked(e.message)}" for e in report.errors)
        parts.append(f"**Fix these fields before launching:**\n{items}")
        parts += [f"{code_span(name)}:\n{fenced(redact_tokens(tb))}" for name, tb in report.tracebacks.items()]
    elif report.scores or report.preview:
        parts.append(f"**Task checked.** {_rows_line(report)}")
        if report.held_out_rows:
            parts.append(f"Held-out set: {report.held_out_rows} rows checked: no prompt of theirs is among the "
                         "training rows checked, and they have every column the prompt and the rewards read.")
    parts += [f"⚠️ {masked(w)}" for w in report.warnings]
    if report.output:
        parts.append(f"Your code printed:\n{fenced(redact_tokens(report.output[-2000:]))}")
    return "\n\n".join(parts)


def _rows_line(report) -> str:
    size = f"{report.num_rows:,} rows" if report.num_rows is not None else "rows"
    line = f"{size}, columns {', '.join(code_span(c) for c in report.columns)}."
    if report.prompt_tokens is not None:
        line += (f" The first prompt has {report.prompt_tokens} tokens; of {report.checked_rows} rows checked, "
                 f"{report.long_rows} ({report.long_rows / max(report.checked_rows, 1):.0%}) are over the limit.")
    if report.scores:
        line += f" {len(report.scores)} reward function(s) scored {len(report.samples)} sample completions."
    return line


def prompt_text(report) -> str:
    if report.prompt_text is not None:
        return f"{report.prompt_text}\n\n[{report.prompt_tokens} tokens]"
    if report.prompt_messages:   # no tokenizer: the conversation, without the model's template
        return "\n".join(f"[{m['role']}] {m['content']}" for m in report.prompt_messages)
    return ""


def scores_table(report) -> pd.DataFrame:
    """One row per sample completion: its dataset row, what it is, each reward's score, and its text."""
    records = []
    for i, sample in enumerate(report.samples):
        record = {"row": sample["row"], "completion": sample["completion"]}
        for name, scores in report.scores.items():
            record[name] = "skipped (None)" if scores[i] is None else f"{scores[i]:.3f}"
        text = sample["text"].replace("\n", " ")
        record["text"] = text if len(text) <= 60 else text[:59] + "…"
        records.append(record)
    return pd.DataFrame(records)


def _on_upload(path, eval_source):
    """An uploaded file becomes the dataset; a held-out split (the builtin set's) goes with the set it replaced, as a
    file has no splits: the held-out evaluation (and its monitor-only rewards and best-by rule) is switched off until
    one is chosen for the file."""
    if eval_source != "split":
        return gr.update(value=path), gr.skip(), gr.skip(), gr.skip()
    return gr.update(value=path), "none", [], ""
