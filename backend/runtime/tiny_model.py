"""Build the builtin models: random Qwen2-style causal LMs and a byte-level tokenizer, locally, with no Hub access.

    python -m runtime.tiny_model --out /bucket/runs/<run_id>/base-model [--name builtin:bench-qwen2.5-1.5b]

`builtin:tiny-qwen2` is the 2-layer demo model that learns the builtin tasks in a minute on a CPU.
`builtin:tiny-qwen2-repeat` is the same model after a brief supervised warm-up on the repeat-letters task's training
questions (`warm_up`, at build time, kept in the build cache like any tiny build): the SFT before the default demo's
GRPO run, which leaves the model right on only some sampled answers (label smoothing).
`builtin:bench-qwen2.5-0.5b` and `builtin:bench-qwen2.5-1.5b` have the shapes of Qwen2.5-0.5B and -1.5B (layers,
hidden size, heads, KV heads, intermediate size, vocabulary, context) and random weights: they cost a GPU what the
real models cost (throughput, memory, weight sync), but their rewards mean nothing. They are for benchmarking.

The build is deterministic (fixed seed), so every job of a run that builds it gets the same weights, and
it is published by atomic rename, so jobs racing to build it never see a half-written folder.
Being deterministic, the tiny model's build can be kept and copied: where `GRPO_BUILTIN_MODEL_CACHE` names a folder
(local jobs get one in the machine's temp dir, as torch's compile cache: backend/executors/local.py), its first build
is kept there under a digest of this file and the torch/transformers/tokenizers versions, and later runs copy it
(under a second, where importing torch and transformers and drawing the weights took ~8 s of every local run's start
on 2 cores). The benchmarking models are not kept (1-3 GB each in a temp dir). A cache folder that is not this user's
own and private to it is not used.
Head size 64 because vLLM's CPU attention rejects 16; the chat template is Qwen2.5's, which TRL recognises.
The tiny model's weights start at std 0.15, not transformers' 0.02: the embeddings are tied and the final RMSNorm
fixes the hidden state's norm, so at 0.02 no LoRA can move a logit by more than a fraction of a unit and GRPO raised
no reward in 300 steps; at 0.15 the "digits" demo climbs from ~0.05 to ~0.9 in 50-70 steps (0.1 stalled at 0.7).
"""

import argparse
import hashlib
import importlib.metadata
import os
import shutil
import time
from pathlib import Path

from .layout import publish_folder

CHAT_TEMPLATE = (Path(__file__).parent / "qwen2_5_chat_template.jinja").read_text()
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TINY_CONFIG = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=1,
    num_key_value_heads=1, head_dim=64, max_position_embeddings=512, rope_theta=10000.0,
    tie_word_embeddings=True, torch_dtype="float32", initializer_range=0.15,
)
# The shapes of Qwen/Qwen2.5-0.5B and Qwen/Qwen2.5-1.5B (their config.json), bf16 as they are published.
QWEN2_5_SHAPE = dict(max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                     vocab_size=151936, torch_dtype="bfloat16", initializer_range=0.02)
BENCH_0_5B_CONFIG = dict(QWEN2_5_SHAPE, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2)
BENCH_1_5B_CONFIG = dict(QWEN2_5_SHAPE, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2)
TINY_MODEL = "builtin:tiny-qwen2"
# The default demo's model: the tiny model after a brief supervised warm-up on the repeat-letters training questions
# (prompts.py), as real pipelines run SFT before RL. From random weights GRPO has no right answer to reinforce (a
# random 3-letter answer is right once in ~10^7 samples). Label smoothing leaves the warmed model unsure: its greedy
# answer is right on the 24 held-out questions, a sampled one (temperature 1) on 23% of them; GRPO makes it reliable
# (0.23 -> 0.81 in 300 steps, panel/presets.py). Measured: warm-ups that stop early instead (no smoothing, 35-55 steps)
# leave errors GRPO did not fix: held-out 0.3-0.4 -> 0.5-0.6 in 200 steps, and lr 5e-3 once collapsed to "aaa".
TINY_REPEATER = "builtin:tiny-qwen2-repeat"
TINY_MODELS = (TINY_MODEL, TINY_REPEATER)
WARM_UP_STEPS = 150             # full-batch AdamW steps on the 192 training questions
WARM_UP_LR = 5e-3
WARM_UP_SMOOTHING = 0.3         # label smoothing: the skill learnt, the answers left unsure
BENCHMARK_MODELS = {"builtin:bench-qwen2.5-0.5b": ("Qwen2.5-0.5B", BENCH_0_5B_CONFIG),
                    "builtin:bench-qwen2.5-1.5b": ("Qwen2.5-1.5B", BENCH_1_5B_CONFIG)}
BUILTIN_MODELS = (*TINY_MODELS, *BENCHMARK_MODELS)
CACHE_ENV = "GRPO_BUILTIN_MODEL_CACHE"
# What a build's bytes depend on besides this file: the libraries that draw the weights and write the tokenizer.
BUILD_LIBRARIES = ("torch", "transformers", "tokenizers")


def model_config(name: str) -> dict:
    if name in TINY_MODELS:
        return TINY_CONFIG
    if name in BENCHMARK_MODELS:
        return BENCHMARK_MODELS[name][1]
    raise ValueError(f"no builtin model {name!r}; builtin models: {', '.join(BUILTIN_MODELS)}")


def benchmark_note(name: str) -> str | None:
    """What a run on a benchmarking model must say wherever its model is named, or None for other models."""
    if name not in BENCHMARK_MODELS:
        return None
    return (f"{name}: random weights shaped like {BENCHMARK_MODELS[name][0]}, for benchmarking "
            "(throughput, memory and sync times are real; rewards mean nothing)")


def filler_token(i: int) -> str:
    """The i-th made-up token of a benchmarking vocabulary: a space and four letters ("Ġaaab" decodes to " aaab")."""
    letters = "".join(chr(ord("a") + (i // 26**p) % 26) for p in (3, 2, 1, 0))
    return "Ġ" + letters


def build_tokenizer(vocab_size: int | None = None, max_length: int = TINY_CONFIG["max_position_embeddings"]):
    """Byte-level tokenizer with no merges: 256 byte tokens plus Qwen's chat special tokens.

    With `vocab_size`, made-up tokens fill the vocabulary up to it (special tokens last), so a model with a real
    vocabulary can sample any id and vLLM can decode it. Text still encodes byte by byte: with no merges, no
    encoding ever produces a made-up token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # noqa: PLC0415 heavy: only to build a model
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415 heavy: only to build a model

    byte_pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    fillers = (vocab_size or 0) - len(vocab) - len(SPECIAL_TOKENS)
    if fillers > 26**4:
        raise ValueError(f"a vocabulary of {vocab_size} needs more made-up tokens than four letters spell")
    base = len(vocab)
    vocab.update((filler_token(i), base + i) for i in range(max(fillers, 0)))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = byte_pre
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None,
        model_max_length=max_length,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(tokenizer, seed: int = 0, shape: dict = TINY_CONFIG):
    import torch  # noqa: PLC0415 heavy: only to build a model
    from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: PLC0415 heavy: only to build a model

    torch.manual_seed(seed)
    config = Qwen2Config(**{
        **shape, "vocab_size": len(tokenizer), "bos_token_id": None, "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    })
    dtype = getattr(torch, shape["torch_dtype"])
    # A GPU draws a 1.5B model's random weights in a second; a CPU takes a minute.
    with torch.device("cuda" if torch.cuda.is_available() and shape is not TINY_CONFIG else "cpu"):
        model = Qwen2ForCausalLM(config).to(dtype)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def warm_up(model, tokenizer, steps: int = WARM_UP_STEPS, lr: float = WARM_UP_LR) -> None:
    """Supervised warm-up on the repeat-letters training questions (never the held-out ones): the loss on the answer
    and its end-of-turn token only, one full batch a step, one thread (deterministic, and as fast on a 64-wide
    model)."""
    import torch  # noqa: PLC0415 heavy: only to build a model

    from .prompts import REPEAT, builtin_eval_rows, builtin_rows  # noqa: PLC0415

    held_out = {row["prompt"][-1]["content"] for row in builtin_eval_rows(REPEAT)}
    rows = {row["prompt"][-1]["content"]: row for row in builtin_rows(REPEAT)}
    assert not held_out & set(rows), "the warm-up never sees a held-out question"
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    seqs, labels = [], []
    for row in rows.values():
        prompt = tokenizer(tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True),
                           add_special_tokens=False)["input_ids"]
        answer = tokenizer(row["answer"], add_special_tokens=False)["input_ids"] + [end]
        seqs.append(prompt + answer)
        labels.append([-100] * len(prompt) + answer)
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), tokenizer.pad_token_id)
    target = torch.full((len(seqs), width), -100)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, (seq, label) in enumerate(zip(seqs, labels, strict=True)):
        ids[i, :len(seq)], target[i, :len(seq)], mask[i, :len(seq)] = (torch.tensor(seq), torch.tensor(label), 1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
        model.train()
        for _ in range(steps):
            logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
            torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target[:, 1:].reshape(-1),
                                              ignore_index=-100, label_smoothing=WARM_UP_SMOOTHING).backward()
            optimizer.step()
            optimizer.zero_grad()
        model.eval()
    finally:
        torch.set_num_threads(threads)


def ensure_tiny_model(out: str, seed: int = 0, name: str = TINY_MODEL) -> str:
    """Build the builtin model `name` at `out` unless it is already there (or copy it from the build cache, and
    keep a new build there); return `out`."""
    if _is_model(out) or copy_from_cache(out, seed, name):
        return out
    try:
        with publish_folder(out, replace=False, prefix="_tmp-model-") as tmp:
            shape = model_config(name)
            tokenizer = build_tokenizer(shape.get("vocab_size"), shape["max_position_embeddings"])
            model = build_model(tokenizer, seed, shape)
            if name == TINY_REPEATER:
                warm_up(model, tokenizer)
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
    except OSError:
        if not _is_model(out):
            raise  # another job published first otherwise
    _keep_in_cache(out, seed, name)
    return out


def _is_model(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, "config.json"))


def cache_entry(seed: int, name: str, cache: str | None = None) -> str | None:
    """Where the build cache keeps `name` built with `seed` by this code and these library versions, or None where
    there is no cache (GRPO_BUILTIN_MODEL_CACHE unset), it is not this user's private folder, or `name` is not a
    tiny model."""
    cache = cache if cache is not None else os.environ.get(CACHE_ENV, "")
    if not cache or name not in TINY_MODELS:
        return None
    try:
        os.makedirs(cache, mode=0o700, exist_ok=True)
        info = os.stat(cache)
    except OSError:
        return None
    # A folder another user owns or may write could hold anything under a digest's name: build instead.
    if info.st_uid != os.getuid() or info.st_mode & 0o022:
        return None
    # prompts.py too: the warm-up's questions are part of a build.
    digest = hashlib.sha256(Path(__file__).read_bytes() + CHAT_TEMPLATE.encode()
                            + (Path(__file__).parent / "prompts.py").read_bytes())
    for library in BUILD_LIBRARIES:
        try:
            digest.update(f"{library}={importlib.metadata.version(library)}".encode())
        except importlib.metadata.PackageNotFoundError:
            digest.update(f"{library}=none".encode())
    return os.path.join(cache, f"{name.replace(':', '-')}-seed{seed}-{digest.hexdigest()[:16]}")


def copy_from_cache(out: str, seed: int = 0, name: str = TINY_MODEL) -> bool:
    """Copy the cached build of `name` to `out` (published whole); False where the cache has none."""
    entry = cache_entry(seed, name)
    if not entry or not _is_model(entry):
        return False
    try:
        _copy_whole(entry, out)
    except OSError:
        if not _is_model(out):      # another job published first otherwise
            return False
    return True


def _keep_in_cache(built: str, seed: int, name: str) -> None:
    """Keep a new build for the next run; a cache that cannot take it costs the next run a build, nothing more."""
    entry = cache_entry(seed, name)
    if entry and not _is_model(entry):
        try:
            _copy_whole(built, entry)
        except OSError:
            pass


def _copy_whole(source: str, dest: str) -> None:
    with publish_folder(dest, replace=False, prefix="_tmp-model-") as tmp:
        for item in os.listdir(source):
            shutil.copy(os.path.join(source, item), os.path.join(tmp, item))


def no_progress_bars() -> None:
    """Job logs are read line by line in the panel: carriage-return progress bars only garble them."""
    from huggingface_hub.utils import disable_progress_bars  # noqa: PLC0415 only in a job
    from transformers.utils import logging as hf_logging  # noqa: PLC0415 heavy: only in a job

    disable_progress_bars()
    hf_logging.disable_progress_bar()
    try:
        import datasets  # its "Map" and "Filter" bars, while the trainer shapes a task's rows  # noqa: PLC0415 optional
    except ImportError:
        return
    datasets.disable_progress_bars()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default=TINY_MODEL, choices=BUILTIN_MODELS)
    args = parser.parse_args()
    started = time.time()
    if not (_is_model(args.out) or copy_from_cache(args.out, args.seed, args.name)):
        no_progress_bars()      # (importing transformers for it takes seconds: not for a copy)
    out = ensure_tiny_model(args.out, args.seed, args.name)
    print(f"{args.name} ready at {out} ({time.time() - started:.1f} s)", flush=True)
    if benchmark_note(args.name):
        print(f"note: {benchmark_note(args.name)}", flush=True)


if __name__ == "__main__":
    main()
