"""An output a handler leaves unchanged costs Gradio nothing.

Gradio 6.31 answers an output that a handler skips (absent from its dict, or `gr.skip()`) by rebuilding that
component from its constructor arguments and its config (`Blocks.postprocess_data`: the prop-update path, with
no props): 3-18 ms a component here, the same for every browser session on every timer tick, whatever changed.
A rebuild with no props is the component as it was, and the browser is sent `{"__type__": "update"}` either way,
so `install()` has Gradio postprocess only the outputs that carry something and puts the bare skips back in
their places. Batched events, and events that skip everything through Gradio's own shortcut, are left as Gradio
does them.
"""

import copy
import functools

from gradio.blocks import Blocks, convert_component_dict_to_list
from gradio.components.base import Component

_SKIP = {"__type__": "update"}


def _is_bare_skip(value) -> bool:
    return isinstance(value, dict) and value == _SKIP


def install() -> None:
    """Wrap `Blocks.postprocess_data` once per process (idempotent)."""
    original = Blocks.postprocess_data
    if getattr(original, "_cheap_skips", False):
        return

    @functools.wraps(original)
    async def postprocess_data(self, block_fn, predictions, state):
        outputs = list(block_fn.outputs)
        if block_fn.batch or len(outputs) < 2 or block_fn.is_validator_function:
            return await original(self, block_fn, predictions, state)
        values = predictions
        if isinstance(values, dict) and values and not _is_bare_skip(values):
            values = convert_component_dict_to_list(outputs, values)
        if not isinstance(values, (list, tuple)) or len(values) != len(outputs):
            return await original(self, block_fn, predictions, state)   # Gradio says what is wrong with it
        # A state's skip is cheap already (and a state is never rebuilt): only components' skips are left out.
        kept = [i for i, (block, value) in enumerate(zip(outputs, values))
                if not (_is_bare_skip(value) and isinstance(block, Component) and not block.stateful)]
        if len(kept) == len(outputs):
            return await original(self, block_fn, predictions, state)
        out: list = [dict(_SKIP) for _ in outputs]
        if kept:
            narrowed = copy.copy(block_fn)
            narrowed.outputs = [outputs[i] for i in kept]
            chosen = [values[i] for i in kept]
            done = await original(self, narrowed, chosen if len(kept) > 1 else chosen[0], state)
            for i, value in zip(kept, done):
                out[i] = value
        return out

    postprocess_data._cheap_skips = True
    Blocks.postprocess_data = postprocess_data
