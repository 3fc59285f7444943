"""The builtin benchmarking models: Qwen2.5's shapes with random weights, a vocabulary vLLM can decode whole,
and a label wherever the model is named."""

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from backend.plan.spec import MODEL_HELP, RunSpec
from backend.runtime.tiny_model import BENCHMARK_MODELS, build_tokenizer, model_config
from panel.actions import engine_label

# Parameter counts of the published Qwen/Qwen2.5-0.5B and Qwen/Qwen2.5-1.5B checkpoints.
PUBLISHED = {"builtin:bench-qwen2.5-0.5b": 494_032_768, "builtin:bench-qwen2.5-1.5b": 1_543_714_304}


@pytest.mark.parametrize("name", sorted(BENCHMARK_MODELS))
def test_a_benchmarking_model_has_the_shape_and_size_of_the_real_one(name):
    with torch.device("meta"):   # the shape alone: no memory, no time
        model = Qwen2ForCausalLM(Qwen2Config(**model_config(name)))
    assert sum(p.numel() for p in model.parameters()) == PUBLISHED[name]
    assert model.config.tie_word_embeddings and model.config.max_position_embeddings == 32768


def test_the_benchmark_vocabulary_is_the_models_and_every_id_decodes():
    shape = model_config("builtin:bench-qwen2.5-0.5b")
    tokenizer = build_tokenizer(shape["vocab_size"], shape["max_position_embeddings"])
    assert len(tokenizer) == shape["vocab_size"] == 151936
    assert tokenizer.eos_token_id == 151935 and tokenizer.convert_ids_to_tokens(151935) == "<|im_end|>"
    # Text still encodes byte by byte, as with the tiny model: the made-up tokens are only ever sampled.
    tiny = build_tokenizer()
    assert tokenizer("Count to ten: 1 2 3")["input_ids"] == tiny("Count to ten: 1 2 3")["input_ids"]
    sampled = [256, 257, 100_000, 151_932]
    assert tokenizer.decode(sampled) == " aaaa aaab froi iqjs"
    assert tokenizer.model_max_length == 32768


def test_a_benchmarking_model_is_labelled_in_the_form_and_the_preview():
    assert "benchmarking" in MODEL_HELP and "rewards mean nothing" in MODEL_HELP
    spec = RunSpec(model="builtin:bench-qwen2.5-1.5b", use_vllm=True)
    assert spec.validate() == []
    assert "random weights shaped like Qwen2.5-1.5B, for benchmarking" in engine_label(spec)
    assert "random weights" not in engine_label(RunSpec())
