"""A skipped output costs Gradio nothing and changes nothing: the answers and the session's components are the same
with `panel.cheap_skips` as without it (through Gradio's own request path, `Blocks.process_api`)."""

import asyncio
import threading

import gradio as gr
import pytest
from gradio.blocks import Blocks
from gradio.state_holder import SessionState

from panel import cheap_skips

pytestmark = pytest.mark.unit


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
    monkeypatch.setattr(Blocks, "preprocess_data", Blocks.preprocess_data.__wrapped__)


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


def _shared_demo(values: dict):
    """A page whose button answers every session with the same objects (as a frame shared by the sessions of one
    run does), and a choices update of its own."""
    with gr.Blocks() as demo:
        plot, table, text = gr.Plot(), gr.Dataframe(headers=["n"]), gr.Markdown()
        pick = gr.Dropdown(["a"], allow_custom_value=True)
        button = gr.Button()
        button.click(lambda: {plot: gr.components.plot.PlotData(type="plotly", plot=values["plot"]),
                              table: values["rows"], text: values["text"], pick: gr.update(choices=values["choices"])},
                     None, [plot, table, text, pick])
    return demo


def _sessions(demo, count: int) -> tuple[list, list]:
    fn = next(iter(demo.fns.values()))
    states = [SessionState(demo) for _ in range(count)]

    async def calls():
        return [(await demo.process_api(fn, [], state=s, session_hash=f"s{i}"))["data"] for i, s in enumerate(states)]

    data = asyncio.run(calls())
    return data, [[s.config_values[b._id].get("props", {}).get("value") for b in fn.outputs] for s in states]


def _counted_with_the_shim(values: dict, monkeypatch):
    """The shim installed (after a run without it) and a demo over `values`; `made` lists each postprocessing of a
    plot, a table or a text."""
    monkeypatch.undo()
    cheap_skips.install()
    demo, made = _shared_demo(values), []
    for cls in (gr.Plot, gr.Dataframe, gr.Markdown):
        monkeypatch.setattr(cls, "postprocess", lambda self, v, _f=cls.postprocess: made.append(self) or _f(self, v))
    return demo, made


def test_a_value_another_session_was_just_sent_is_not_postprocessed_again(without_the_shim, monkeypatch):
    values = {"plot": '{"data": [{"y": [1, 2]}], "layout": {}}', "rows": [[1], [2]], "text": "**5 steps**",
              "choices": ["a", "b"]}
    plain = _sessions(_shared_demo(values), 3)
    demo, made = _counted_with_the_shim(values, monkeypatch)
    shared = _sessions(demo, 3)
    assert shared == plain, "each session's answer and what its state keeps are Gradio's own"
    assert len(made) == 3, "the plot, the table and the text postprocessed once for the three sessions"
    assert shared[0][2][3]["choices"] == [["a", "a"], ["b", "b"]], "a choices update is each session's own"
    values.update(rows=[[1], [2], [3]])                          # a new value: postprocessed again, once
    again = _sessions(demo, 2)
    assert len(made) == 4 and again[0][0][1]["data"] == [[1], [2], [3]] == again[0][1][1]["data"]


def _inputs_demo(seen: list):
    with gr.Blocks() as demo:
        pick = gr.Dropdown(["x", "y"], value="x")
        amount = gr.Slider(0, 10, value=3, step=1)
        words = gr.Textbox("hi")
        mode = gr.Radio(["a", "b"], value="a")
        kept = gr.State({"n": 1})
        timer = gr.Timer(2.0, active=False)      # the tick's own period is one of its inputs
        out = gr.Textbox()

        def handler(*args):
            seen.append(threading.get_ident())
            return repr(args)

        gr.Button().click(handler, [pick, amount, words, mode, kept, timer], out)
    return demo


def _preprocessed(demo, inputs) -> tuple:
    fn = next(iter(demo.fns.values()))
    state = SessionState(demo)
    pick = fn.inputs[0]
    threads = []
    original = type(pick).preprocess

    def preprocess(self, value):
        threads.append(threading.get_ident())
        return original(self, value)

    type(pick).preprocess = preprocess
    try:
        answer = asyncio.run(demo.process_api(fn, list(inputs), state=state, session_hash="s"))["data"]
    except Exception as exc:      # a refused input: its error, as Gradio words it
        answer = (type(exc).__name__, str(exc))
    finally:
        type(pick).preprocess = original
    configs = [state.config_values[b._id].get("props", {}).get("value") for b in fn.inputs if not b.stateful]
    return answer, configs, threads


def test_inputs_are_preprocessed_as_gradio_does_without_a_thread_hop_each(without_the_shim, monkeypatch):
    good, bad = ["y", 7, "hello", "b", None, 2.0], ["z", 7, "hello", "b", None, 2.0]    # "z" is not a choice
    plain = [_preprocessed(_inputs_demo([]), inputs) for inputs in (good, bad)]
    monkeypatch.undo()
    cheap_skips.install()
    shimmed = [_preprocessed(_inputs_demo([]), inputs) for inputs in (good, bad)]
    assert [s[:2] for s in shimmed] == [p[:2] for p in plain], "the same values, configs and refusal"
    assert plain[0][0] == ["('y', 7, 'hello', 'b', {'n': 1}, 2.0)"]
    assert plain[1][0][0] == "Error" and "z" in plain[1][0][1]
    assert all(t != threading.get_ident() for t in plain[0][2]), "Gradio hops to a worker thread"
    assert shimmed[0][2] == [threading.get_ident()], "here the picker's check runs where the request is handled"


def _sessions_together(demo, count: int, answers=None) -> list:
    """`count` sessions' events postprocessed at the same time (their ticks came together), each its answer's data."""
    fn = next(iter(demo.fns.values()))
    states = [SessionState(demo) for _ in range(count)]

    async def calls():
        return await asyncio.gather(*(demo.process_api(fn, [], state=s, session_hash=f"t{i}")
                                      for i, s in enumerate(states)))

    return [answer["data"] for answer in asyncio.run(calls())]


def test_sessions_ticking_together_postprocess_a_value_once(without_the_shim, monkeypatch):
    values = {"plot": '{"data": [{"y": [3, 4]}], "layout": {}}', "rows": [[7], [8]], "text": "**6 steps**",
              "choices": ["a", "c"]}
    plain = _sessions_together(_shared_demo(values), 4)
    demo, made = _counted_with_the_shim(values, monkeypatch)
    together = _sessions_together(demo, 4)
    assert together == plain, "each session's answer is Gradio's own"
    assert len(made) == 3, "the plot, the table and the text postprocessed once for the four sessions at once"
    assert not cheap_skips._pending, "nothing left waiting"


def test_sessions_ticking_together_with_other_values_get_their_own(monkeypatch):
    """Two visitors' sessions tick at once with different values for the same components (their own runs lists):
    each gets the output of its own value, none the other's."""
    cheap_skips.install()
    with gr.Blocks() as demo:
        table, text = gr.Dataframe(headers=["run"]), gr.Markdown()
        turn = iter([{table: [["alice-run"]], text: "alice"}, {table: [["bob-run"]], text: "bob"}] * 2)
        gr.Button().click(lambda: next(turn), None, [table, text])
    first, second = _sessions_together(demo, 2)
    assert first[0]["data"] == [["alice-run"]] and first[1] == "alice"
    assert second[0]["data"] == [["bob-run"]] and second[1] == "bob"


def test_a_failed_postprocessing_leaves_the_waiting_sessions_to_do_their_own(monkeypatch):
    cheap_skips.install()
    with gr.Blocks() as demo:
        table, text = gr.Dataframe(headers=["n"]), gr.Markdown()
        gr.Button().click(lambda: {table: [[1]], text: "same"}, None, [table, text])
    calls = []
    original = gr.Markdown.postprocess

    def flaky(self, value):
        calls.append(value)
        if len(calls) == 1:
            raise RuntimeError("the first postprocessing fails")
        return original(self, value)

    monkeypatch.setattr(gr.Markdown, "postprocess", flaky)
    fn = next(iter(demo.fns.values()))
    states = [SessionState(demo) for _ in range(3)]

    async def calls_together():
        return await asyncio.gather(*(demo.process_api(fn, [], state=s, session_hash=f"f{i}")
                                      for i, s in enumerate(states)), return_exceptions=True)

    answers = asyncio.run(calls_together())
    failed = [a for a in answers if isinstance(a, Exception)]
    assert len(failed) == 1, "the session whose postprocessing failed meets its error"
    assert [a["data"][1] for a in answers if not isinstance(a, Exception)] == ["same", "same"]
    assert not cheap_skips._pending


def test_a_session_waits_for_anothers_postprocessing_only_so_long_then_does_its_own(monkeypatch):
    """A value another session is postprocessing (its future never settled here: stuck in its thread) holds this
    session's tick only SHARED_WAIT_S; then it postprocesses its own and answers."""
    cheap_skips.install()
    monkeypatch.setattr(cheap_skips, "SHARED_WAIT_S", 0.2)
    with gr.Blocks() as demo:
        table, text = gr.Dataframe(headers=["n"]), gr.Markdown()
        gr.Button().click(lambda: {table: [[1]], text: "stuck"}, None, [table, text])
    fn = next(iter(demo.fns.values()))

    async def tick():
        stuck = cheap_skips._promise(text, "stuck")        # another session's, never settled
        try:
            return await asyncio.wait_for(demo.process_api(fn, [], state=SessionState(demo), session_hash="w"), 30)
        finally:
            cheap_skips._settle(text, stuck, None)

    answer = asyncio.run(tick())
    assert answer["data"][0]["data"] == [[1]] and answer["data"][1] == "stuck"
    assert not cheap_skips._pending
