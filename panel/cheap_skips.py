"""An output a handler leaves unchanged costs Gradio nothing, and one another session was just sent costs it
nothing again.

Gradio 6.31 answers an output that a handler skips (absent from its dict, or `gr.skip()`) by rebuilding that
component from its constructor arguments and its config (`Blocks.postprocess_data`: the prop-update path, with
no props): 3-18 ms a component here, the same for every browser session on every timer tick, whatever changed.
A rebuild with no props is the component as it was, and the browser is sent `{"__type__": "update"}` either way,
so `install()` has Gradio postprocess only the outputs that carry something and puts the bare skips back in
their places. Batched events, and events that skip everything through Gradio's own shortcut, are left as Gradio
does them.

Every session watching a live run is sent the same new charts, tables and text each tick (the frame is built once
for all of them): postprocessing each again for each session (a thread hop, a pydantic model and its dump, two
walks for files) made an extra session cost what the first did. So the newest few postprocessed values of each
plain-data component (`SHARED`: their output depends on the value and the component alone and holds no file) are
kept, and a session sent an equal value through the same component gets the kept output, recorded in its own
session state as Gradio records it. Sessions whose ticks come together (their timers in step, or queued behind one
slow event) would all miss the kept outputs, each postprocessing while the others do: the first to start on a value
is the one that postprocesses it, and the others wait for its output (`_pending`) instead of doing it again; where
its postprocessing fails, each does its own (and meets its own error).

Its inputs likewise: Gradio preprocesses each input in a worker thread of its own (a thread hop each, nine a tick
here, a tenth of a millisecond each and contended), though a picker's, a slider's or a textbox's preprocessing is
a check of a plain value (a timer's, none at all). An event whose inputs are all such components (`INLINE`) or
states is preprocessed the same way without the hops.
"""

import asyncio
import contextvars
import copy
import functools

from gradio.blocks import Blocks, convert_component_dict_to_list
from gradio.components import JSON, Checkbox, Dataframe, Dropdown, Markdown, Number, Plot, Radio, Slider, Textbox
from gradio.components.base import Component
from gradio.components.timer import Timer
from gradio.data_classes import GradioModel, GradioRootModel
from gradio.exceptions import ComponentProcessingError, Error

_SKIP = {"__type__": "update"}
SHARED = (Plot, Dataframe, Markdown, Textbox, JSON)
KEPT_PER_COMPONENT = 4       # sessions on a few runs, or a few chart options, each hit their own
_PLAIN = (str, list, tuple, dict, int, float, GradioModel, GradioRootModel)
_kept: dict[int, list[tuple[Component, object, object]]] = {}    # block id -> (component, value, output), newest last
# block id -> (component, value, future of its output) being postprocessed now by one session for all; the event loop's
# own (Gradio postprocesses there), so no lock.
_pending: dict[int, list[tuple[Component, object, asyncio.Future]]] = {}
# Set while this module postprocesses: a second wrapping of Gradio's method (installed over a patched one) passes
# through, and never waits for an output its own caller is making.
_inside: contextvars.ContextVar[bool] = contextvars.ContextVar("cheap_skips_inside", default=False)
# How long a session waits for another's postprocessing of the same value before doing its own (a postprocessing
# stuck in its thread must not hold every session ticking with it).
SHARED_WAIT_S = 10.0
INLINE = (Dropdown, Radio, Slider, Textbox, Checkbox, Number, Timer)
_SCALARS = (str, int, float, bool, type(None))


def _is_bare_skip(value) -> bool:
    return isinstance(value, dict) and value == _SKIP


def _shareable(block, value) -> bool:
    return (isinstance(block, SHARED) and isinstance(value, _PLAIN) and not block.stateful
            and not (isinstance(value, dict) and "__type__" in value))     # a prop update builds the session's own


def _equal(a, b) -> bool:
    try:
        return a is b or (type(a) is type(b) and bool(a == b))
    except Exception:        # a value whose == is not a yes or no
        return False


def _recall(component, value):
    for kept_component, kept_value, output in reversed(_kept.get(component._id, ())):
        if kept_component is component and _equal(kept_value, value):
            return output
    return None


def _in_flight(component, value) -> asyncio.Future | None:
    for pending_component, pending_value, future in _pending.get(component._id, ()):
        if pending_component is component and _equal(pending_value, value):
            return future
    return None


def _promise(component, value) -> asyncio.Future:
    future = asyncio.get_running_loop().create_future()
    _pending.setdefault(component._id, []).append((component, value, future))
    return future


def _settle(component, future: asyncio.Future, output) -> None:
    """`output` (None: none, the waiters do their own) to the sessions waiting on `future`, which is no longer
    pending."""
    entries = _pending.get(component._id, [])
    entries[:] = [entry for entry in entries if entry[2] is not future]
    if not entries:
        _pending.pop(component._id, None)
    if not future.done():
        future.set_result(output)


def _keep(component, value, output) -> None:
    entries = _kept.setdefault(component._id, [])
    entries.append((component, value, output))
    del entries[:-KEPT_PER_COMPONENT]


def _record(state, block, output) -> None:
    """A kept output recorded in the session's state as Gradio records a postprocessed one."""
    if block._id not in state:
        state[block._id] = block
    state._update_value_in_config(block._id, output)


async def _settled(postprocessing, todo: list, values, promised: dict) -> list:
    """The outputs of `todo` (index, the session's component) from `postprocessing` (Gradio's), each shareable one
    kept and handed to the sessions waiting for it; where it fails, the waiters are told to do their own."""
    try:
        done = await postprocessing
    except BaseException:
        for i, own in todo:
            if i in promised:
                _settle(own, promised[i], None)
        raise
    for (i, own), output in zip(todo, done):
        if i in promised:
            _keep(own, values[i], output)
            _settle(own, promised[i], output)
    return done


def _inline(block, state, value) -> bool:
    """Whether this input is preprocessed without a thread hop: a state, or an `INLINE` component with a plain value
    (no file, no prop dict)."""
    if block.stateful:
        return True
    plain = isinstance(value, _SCALARS) or (isinstance(value, (list, tuple)) and all(isinstance(v, _SCALARS)
                                                                                      for v in value))
    return plain and isinstance(state.get(block._id, block), INLINE)


def install() -> None:
    """Wrap `Blocks.postprocess_data` and `Blocks.preprocess_data` once per process (idempotent)."""
    _install_preprocess()
    original = Blocks.postprocess_data
    if getattr(original, "_cheap_skips", False):
        return

    @functools.wraps(original)
    async def postprocess_data(self, block_fn, predictions, state):
        outputs = list(block_fn.outputs)
        if (block_fn.batch or len(outputs) < 2 or block_fn.is_validator_function or state is None
                or _inside.get()):
            return await original(self, block_fn, predictions, state)
        entered = _inside.set(True)
        try:
            return await _postprocess(self, original, block_fn, outputs, predictions, state)
        finally:
            _inside.reset(entered)

    postprocess_data._cheap_skips = True
    Blocks.postprocess_data = postprocess_data


async def _postprocess(self, original, block_fn, outputs: list, predictions, state) -> list:
    """`install`'s postprocessing of an event's outputs (see the module)."""
    values = predictions
    if isinstance(values, dict) and values and not _is_bare_skip(values):
        values = convert_component_dict_to_list(outputs, values)
    if not isinstance(values, (list, tuple)) or len(values) != len(outputs):
        return await original(self, block_fn, predictions, state)   # Gradio says what is wrong with it
    out: list = [dict(_SKIP) for _ in outputs]
    todo, waits, promised = [], [], {}
    for i, (block, value) in enumerate(zip(outputs, values)):
        if _is_bare_skip(value):
            # A component's skip is sent as the bare update; a state's leaves the state as it is and sends nothing
            # (Gradio's own answer for it: None).
            if isinstance(block, Component) and block.stateful:
                out[i] = None
            if isinstance(block, Component):
                continue
        own = state.get(block._id, block)      # the session's copy: its props
        if not _shareable(own, value):
            todo.append((i, own))
            continue
        recalled = _recall(own, value)
        if recalled is not None:
            _record(state, block, recalled)
            out[i] = recalled
            continue
        future = _in_flight(own, value)
        if future is not None:
            waits.append((i, block, future))
            continue
        promised[i] = _promise(own, value)
        todo.append((i, own))
    if len(todo) == len(outputs):
        todo_done = await _settled(original(self, block_fn, predictions, state), todo, values, promised)
    elif todo:
        narrowed = copy.copy(block_fn)
        narrowed.outputs = [outputs[i] for i, _ in todo]
        chosen = [values[i] for i, _ in todo]
        todo_done = await _settled(original(self, narrowed, chosen if len(todo) > 1 else chosen[0], state),
                                   todo, values, promised)
    else:
        todo_done = []
    for (i, _), output in zip(todo, todo_done):
        out[i] = output
    again = []
    for i, block, future in waits:
        try:    # shielded: this session cancelled or out of time, the one postprocessing goes on
            output = await asyncio.wait_for(asyncio.shield(future), SHARED_WAIT_S)
        except TimeoutError:
            output = None
        if output is None:
            again.append(i)
            continue
        _record(state, block, output)
        out[i] = output
    if again:       # the session that postprocessed it failed or is late: each does its own, as without the sharing
        narrowed = copy.copy(block_fn)
        narrowed.outputs = [outputs[i] for i in again]
        chosen = [values[i] for i in again]
        for i, output in zip(again, await original(self, narrowed, chosen if len(again) > 1 else chosen[0],
                                                   state)):
            out[i] = output
    return out


def _install_preprocess() -> None:
    original = Blocks.preprocess_data
    if getattr(original, "_cheap_skips", False):
        return

    @functools.wraps(original)
    async def preprocess_data(self, block_fn, inputs, state, explicit_call=False):
        if (state is None or block_fn.component_prop_inputs or len(inputs) < len(block_fn.inputs)
                or not all(_inline(b, state, v) for b, v in zip(block_fn.inputs, inputs))):
            return await original(self, block_fn, inputs, state, explicit_call)    # Gradio's own (and its errors)
        processed = []
        for i, block in enumerate(block_fn.inputs):     # Gradio's steps, less the file moves and the thread hop
            if block.stateful:
                processed.append(state[block._id])
                continue
            block = state.get(block._id, block)
            if block._id not in state:
                state[block._id] = block
            state._update_value_in_config(block._id, inputs[i])
            if not block_fn.preprocess:
                processed.append(inputs[i])
                continue
            try:
                processed.append(block.preprocess(inputs[i]))
            except Error:
                raise
            except Exception as err:
                raise ComponentProcessingError(self._format_processing_error(
                    block_fn, i, block, inputs[i], is_input=True, original_error=err)) from err
        return processed

    preprocess_data._cheap_skips = True
    Blocks.preprocess_data = preprocess_data
