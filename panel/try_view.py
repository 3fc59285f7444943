""""Try it" in the open run: one prompt sent to the chosen versions and the base model, answered side by side, with
the progress of a CPU try shown while its base model loads. The logic is `backend.outcome.try_it`; who may is the run
view's rule (`Panel.try_it`). Handlers are plain functions (see `panel.page`)."""

import gradio as gr
import pandas as pd

from backend.outcome.try_it import BASE, MAX_NEW_TOKENS, TRIES_WAITING, TryAnswers, TryRefused, try_choices
from panel.client_address import request_address
from panel.markdown import masked, plain

LABEL_PERCENT = 10      # the answers table's first column ("answer", "answered by"), of its width


def build(page, panel) -> None:
    """The try-it controls (below the adapters table), added to `page`."""
    with gr.Accordion("Try it: one prompt, several versions side by side", open=False, elem_id="try-section"):
        with gr.Row():
            prompt = gr.Textbox(label="Prompt", lines=2, elem_id="try-prompt", scale=3)
            picks = gr.Dropdown([], value=[], multiselect=True, label="Versions (and the base model)",
                                elem_id="try-picks", scale=2, allow_custom_value=True)
            tokens = gr.Slider(1, MAX_NEW_TOKENS, value=32, step=1, label="Max new tokens (greedy)",
                               elem_id="try-tokens", scale=1)
        button = gr.Button("Try it", elem_id="try-btn")
        message = gr.Markdown(elem_id="try-msg")
        answers = gr.Dataframe(interactive=False, wrap=True, elem_id="try-answers")
    page.add(try_prompt=prompt, try_picks=picks, try_tokens=tokens, try_btn=button, try_msg=message,
             try_answers=answers)


def wire(page) -> None:
    # Tries wait in the panel's own line (`TryLine`), where each visitor sees their place; Gradio's queue must let
    # them all reach it (the one running, those waiting, and one more to be told the line is full).
    page.on(page["try_btn"].click, on_try, ["run_pick", "try_prompt", "try_picks", "try_tokens"],
            ["try_msg", "try_answers"], request=True, concurrency_limit=TRIES_WAITING + 2)
    page.on(page["try_picks"].focus, on_picks, ["run_pick"], ["try_picks"], show_progress="hidden")


def on_picks(panel, visitor, run_id) -> dict:
    """What can be tried, sent when the picker is opened (a tick does not: `live.ON_REQUEST`)."""
    try:
        view = panel.view(run_id, visitor) if run_id else None
    except KeyError:
        view = None
    return {"try_picks": gr.update(choices=try_choices(view) if view else [])}


def answers_table(state: TryAnswers, picks: list[str]) -> pd.DataFrame:
    """One column per pick, in the order picked: its answer, then how it was answered."""
    shown = [p for p in dict.fromkeys(picks) if p in state.routes or p in state.answers]
    columns = {"": ["answer", "answered by"]}
    for pick in shown:
        columns["base model" if pick == BASE else pick] = [state.answers.get(pick, "…"),
                                                           state.routes.get(pick, "-")]
    return pd.DataFrame(columns)


def answers_update(table: pd.DataFrame) -> dict:
    """The answers table with its columns sharing the section's width: left to themselves, a long answer's column
    grows to the whole answer's length on one line and pushes the versions after it out of sight."""
    answers = len(table.columns) - 1
    share = f"{(100 - LABEL_PERCENT) / max(answers, 1):.2f}%"
    return gr.update(value=table, column_widths=[f"{LABEL_PERCENT}%", *[share] * answers])


def on_try(panel, visitor, request, run_id, prompt, picks, tokens):
    if not run_id:
        yield {"try_msg": "Pick a run first."}
        return
    picks = list(picks or []) if isinstance(picks, (list, tuple)) else []
    address = request_address(request, panel.settings.on_space)
    named = plain(panel.run_named(run_id, visitor))
    try:
        for state in panel.try_it(run_id, visitor, prompt, picks, tokens, getattr(request, "session_hash", None),
                                  address):
            line = ("✅ " if state.done else "⏳ ") + state.progress + f" · {named}"
            yield {"try_msg": line, "try_answers": answers_update(answers_table(state, picks))}
    except TryRefused as exc:
        yield {"try_msg": f"**Not tried.** {masked(exc)}"}
    except KeyError as exc:
        yield {"try_msg": f"**Not tried.** {masked(exc.args[0] if exc.args else exc)}"}
