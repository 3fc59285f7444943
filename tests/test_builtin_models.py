"""The builtin benchmarking models: Qwen2.5's shapes with random weights, a vocabulary vLLM can decode whole,
and a label wherever the model is named."""

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from backend.plan.spec import MODEL_HELP, RunSpec
from backend.runtime.tiny_model import BENCHMARK_MODELS, build_tokenizer, model_config
from panel.preview_text import engine_label

pytestmark = pytest.mark.unit

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


def _files(folder) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_builtin_model_is_built_once_into_the_cache_and_copied_after_byte_for_byte(tmp_path, monkeypatch):
    from backend.runtime import tiny_model

    cache = tmp_path / "cache"
    monkeypatch.setenv(tiny_model.CACHE_ENV, str(cache))
    first = tiny_model.ensure_tiny_model(str(tmp_path / "run-1" / "base-model"))
    entry = tiny_model.cache_entry(0, tiny_model.TINY_MODEL)
    assert entry.startswith(str(cache) + "/builtin-tiny-qwen2-seed0-"), entry
    assert _files(tmp_path / "run-1" / "base-model") == _files(tmp_path / "cache" / entry.rsplit("/", 1)[1])
    assert oct(cache.stat().st_mode & 0o777) == oct(0o700)

    def no_build(*args, **kwargs):
        raise AssertionError("built again though the cache holds it")

    monkeypatch.setattr(tiny_model, "build_model", no_build)
    second = tiny_model.ensure_tiny_model(str(tmp_path / "run-2" / "base-model"))
    assert _files(tmp_path / "run-2" / "base-model") == _files(tmp_path / "run-1" / "base-model")
    assert first != second and not [p for p in cache.iterdir() if p.name.startswith("_tmp")]

    # The copy is what a build without the cache writes (the build is deterministic): the cache changes no weight.
    monkeypatch.undo()
    monkeypatch.delenv(tiny_model.CACHE_ENV, raising=False)
    tiny_model.ensure_tiny_model(str(tmp_path / "uncached" / "base-model"))
    assert _files(tmp_path / "run-2" / "base-model") == _files(tmp_path / "uncached" / "base-model")
    # Another seed is another entry; the benchmarking models (1-3 GB) are not kept.
    monkeypatch.setenv(tiny_model.CACHE_ENV, str(cache))
    assert tiny_model.cache_entry(1, tiny_model.TINY_MODEL) not in (entry, None)
    assert tiny_model.cache_entry(0, "builtin:bench-qwen2.5-0.5b") is None


def test_a_cache_folder_others_may_write_is_not_used(tmp_path, monkeypatch):
    from backend.runtime import tiny_model

    cache = tmp_path / "shared-cache"
    cache.mkdir()
    cache.chmod(0o777)
    monkeypatch.setenv(tiny_model.CACHE_ENV, str(cache))
    assert tiny_model.cache_entry(0, tiny_model.TINY_MODEL) is None
    tiny_model.ensure_tiny_model(str(tmp_path / "base-model"))
    assert (tmp_path / "base-model" / "config.json").is_file() and list(cache.iterdir()) == []
