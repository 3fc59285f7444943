"""A skipped output costs Gradio nothing and changes nothing: the answers and the session's components are the same
with `panel.cheap_skips` as without it (through Gradio's own request path, `Blocks.process_api`)."""

import asyncio

import gradio as gr
import pytest
from gradio.blocks import Blocks
from gradio.state_holder import SessionState

from panel import cheap_skips


def _demo():
    with gr.Blocks() as demo:
        text = gr.Textbox("a")
        pick = gr.Dropdown(["x", "y"], value="x", allow_custom_value=True)
        plot = gr.Plot()
        table = gr.Dataframe(headers=["n"])
        kept = gr.State(None)
        button = gr.Button()
        answers = iter([
            {text: "b", kept: {"n": 1}},                                  # the rest skipped
            {pick: gr.update(choices=["x", "y", "z"]), table: [[1]]},
            {text: gr.skip(), pick: gr.skip(), plot: gr.skip(), table: gr.skip(), kept: gr.skip()},
            gr.skip(),                                                    # Gradio's own "skip them all"
            ["c", gr.skip(), gr.skip(), gr.skip(), gr.skip()],           # a list, not a dict
            {pick: "y"},
        ])
        button.click(lambda: next(answers), None, [text, pick, plot, table, kept])
    return demo


def _answers(demo) -> tuple[list, dict]:
    state = SessionState(demo)
    fn = next(iter(demo.fns.values()))

    async def calls():
        return [(await demo.process_api(fn, [], state=state, session_hash="s"))["data"] for _ in range(6)]

    data = asyncio.run(calls())
    configs = {i: state.config_values[block._id].get("props") for i, block in enumerate(fn.outputs)
               if block._id in state.config_values}       # by output: two demos' components have other ids
    return data, configs


@pytest.fixture
def without_the_shim(monkeypatch):
    cheap_skips.install()
    monkeypatch.setattr(Blocks, "postprocess_data", Blocks.postprocess_data.__wrapped__)


def test_the_answers_and_the_sessions_components_are_gradios_own(without_the_shim, monkeypatch):
    plain = _answers(_demo())
    monkeypatch.undo()
    cheap_skips.install()
    assert getattr(Blocks.postprocess_data, "_cheap_skips", False)
    shimmed = _answers(_demo())
    assert shimmed[0] == plain[0]
    assert shimmed[0][0][0] == "b" and shimmed[0][0][1] == {"__type__": "update"}
    assert shimmed[0][1][1]["choices"] == [["x", "x"], ["y", "y"], ["z", "z"]]
    assert shimmed[0][5][1] == "y"
    assert set(shimmed[1]) <= set(plain[1]) and all(shimmed[1][k] == plain[1][k] for k in shimmed[1]), \
        "what the session keeps of each component it changed is Gradio's own (a rebuild for a skip added nothing)"
    assert any(props.get("choices") == [("x", "x"), ("y", "y"), ("z", "z")] for props in shimmed[1].values()), \
        "a choices update is kept by the session's copy of the component, skipped calls after it or not"
