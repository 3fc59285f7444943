""""Try it": one prompt sent to chosen adapter versions of a run and to its base model, answered side by side.

Where an answer comes from:
- A distributed run that is live answers through its proxy (`model="trl-policy-vN"`, the base model's own name for
  the base), for the versions its replicas hold (the newest `max_staleness + 1`). The panel reaches the proxy where
  the run runs on its own machine. On HF Jobs the proxy is inside the trainer job: on the run's private network the
  trainer exposes the proxy's one port, which the panel asks with the visitor's token; with exposed ports (the
  published recipe) it asks one of the run's replicas on its exposed port, with the visitor's token, instead
  (`try_live.py`: which addresses those are).
- Any other version, of a run whose base model is on this machine (a builtin model in the run's folder, a local
  folder, a Hub model in this machine's cache) and small enough, is answered on CPU with PEFT
  (`runtime.check.try_adapter`) in the sandbox the task check uses, never in the panel's process: an adapter is a
  visitor's data. Greedy, bounded tokens, bounded time and memory. One CPU try runs at a time per panel: the others
  wait in a line and see their place (`TryLine`: one place per visitor, a bounded line, each try stopped at
  `TRY_TIMEOUT_S`). Where this machine cannot make the sandbox, nothing is tried here (unless the operator opted
  in: `Sandbox.refusal`), and no one waits for it.
- Otherwise the answer says what it would need.
"""

import json
import os
import posixpath
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from huggingface_hub import snapshot_download

from backend.outcome.best_version import BEST, FINAL, ChoiceError, choose, published, version_choices
from backend.outcome.try_line import LineRefused, TryLine
from backend.outcome.try_live import live_answer, live_endpoint, served_versions
from backend.runtime import layout, records
from backend.runtime.redact import redact_tokens
from backend.runtime.tiny_model import BUILTIN_MODELS
from backend.task.sandbox import INSIDE_WORK, LIMITS, Sandbox, local_sandbox

BASE = "base"
EVENTS_WAIT_S = 60.0      # how long a try waits for the older events of a run just opened
MAX_PROMPT_CHARS = 4000
MAX_NEW_TOKENS = 256
MAX_PICKS = 4                          # versions besides the base model, per try
TRY_TIMEOUT_S = 240.0                  # the whole CPU try: loading the base model and every answer
TRIES_WAITING = 4                      # CPU tries in line behind the running one: a wait of at most 4 x 240 s
TRIES_PER_ADDRESS = 2                  # places (waiting or running) of visitors who are not signed in, an address
TRIES_KEPT = 1                         # waiting places kept for signed-in visitors
MAX_BASE_BYTES = 2 * 2**30             # a base model's weights that "fit this machine" for a CPU try
BASE_FILES = (".json", ".safetensors", ".jinja", ".txt", ".model")   # what of a model folder a try copies
MAX_ADAPTER_BYTES = 512 * 2**20
_line = TryLine(waiting=TRIES_WAITING, cap_s=TRY_TIMEOUT_S, per_address=TRIES_PER_ADDRESS, kept=TRIES_KEPT)


class TryRefused(ValueError):
    """The try cannot start; the message names the field and what would be right."""


@dataclass
class TryAnswers:
    """What a try has so far: a line on its progress, and each picked version's answer (or why there is none)."""

    progress: str = ""
    answers: dict[str, str] = field(default_factory=dict)     # label -> answer text or "(why not)"
    routes: dict[str, str] = field(default_factory=dict)      # label -> how it was answered
    done: bool = False


def checked_request(prompt, picks, max_tokens) -> tuple[str, list[str], int]:
    """The prompt, picks and token limit, or TryRefused naming the field."""
    prompt = prompt if isinstance(prompt, str) else ""
    if not prompt.strip():
        raise TryRefused("Prompt: write a prompt to send.")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise TryRefused(f"Prompt: {len(prompt)} characters; at most {MAX_PROMPT_CHARS} can be tried.")
    picks = [p for p in (picks or []) if isinstance(p, str)]
    if not picks:
        raise TryRefused("Versions: pick the base model, the best version, final/ or versions to compare.")
    versions = [p for p in dict.fromkeys(picks) if p != BASE]
    if len(versions) > MAX_PICKS:
        raise TryRefused(f"Versions: {len(versions)} picked; at most {MAX_PICKS} besides the base model at once.")
    try:
        tokens = int(max_tokens)
    except (TypeError, ValueError):
        raise TryRefused(f"Max new tokens: write a whole number from 1 to {MAX_NEW_TOKENS}.") from None
    if not 1 <= tokens <= MAX_NEW_TOKENS:
        raise TryRefused(f"Max new tokens: {tokens} is outside 1..{MAX_NEW_TOKENS}.")
    return prompt, list(dict.fromkeys(picks)), tokens


def try_choices(view) -> list[tuple[str, str]]:
    """(label, value) of what can be tried: the base model, then the adapter versions a download offers."""
    return [("base model", BASE), *version_choices(view)]


def try_it(view, engine, token: str | None, prompt, picks, max_tokens, who: str | None = None,
           address: str | None = None) -> Iterator[TryAnswers]:
    """Answer `prompt` with each pick ("base", "best", "final", "trl-policy-v<N>"), yielding progress as it goes
    (a place in the CPU line among it). `who` is the visitor the line knows (one try at a time each; None: a caller
    of its own); `address`, where a visitor who is not signed in comes from (None: signed in), whose places the line
    caps. Raises TryRefused before anything starts when the request is bad."""
    prompt, picks, tokens = checked_request(prompt, picks, max_tokens)
    view.refresh()
    if hasattr(view, "wait_for_events"):    # where the run serves is in its engine event, among its first
        view.wait_for_events(EVENTS_WAIT_S)
    state = TryAnswers(progress="Starting…")
    live = live_endpoint(view, engine)
    served = served_versions(view) if live else set()
    local: dict[str, object] = {}       # label -> ChosenAdapter (or None for the base) for the CPU try
    for pick in picks:
        try:
            name = _model_name(view, pick)
        except ChoiceError as exc:
            state.answers[pick], state.routes[pick] = f"({exc})", "-"
            continue
        if live and (pick == BASE or name in served):
            state.routes[pick] = live[2]
            continue
        if pick == BASE:
            local[pick] = None
        else:
            try:
                local[pick] = choose(view, pick)
            except ChoiceError as exc:
                state.answers[pick], state.routes[pick] = f"({exc})", "-"
    yield state
    for pick, route in list(state.routes.items()):
        if route.startswith("live"):
            state.progress = f"Asking the live replicas for {pick}…"
            yield state
            state.answers[pick] = live_answer(live, _model_name(view, pick), _messages(view, prompt), tokens, token)
    if local:
        base, why = local_base(view)
        if base is None:
            for pick in local:
                state.answers[pick], state.routes[pick] = f"(not here: {why})", "-"
        else:
            yield from _cpu_try(view, base, local, prompt, tokens, state, who or secrets.token_hex(8), address)
    state.progress, state.done = "Done.", True
    yield state


def _model_name(view, pick: str) -> str | None:
    """The name a vLLM server knows the pick by (None: the base model, whose name the server says)."""
    if pick == BASE:
        return None
    if pick == BEST:
        best = view.held_out.best_version
        if best is None:
            raise ChoiceError("no held-out evaluation yet, so no best version")
        return layout.run_adapter_name(view.spec, best)
    if pick == FINAL:
        version = view.trainer_end.get("version")
        return layout.run_adapter_name(view.spec, version) if type(version) is int else FINAL
    version = layout.adapter_version(pick, layout.spec_member(view.spec))
    if version is None or published(view, version) is None:
        raise ChoiceError(f"run {view.run_id} published no adapter {pick[:80]!r}")
    return pick


def _messages(view, prompt: str) -> list[dict]:
    system = str(view.spec.get("system_prompt") or "")
    return [*([{"role": "system", "content": system}] if system else []), {"role": "user", "content": prompt}]


# ---- on CPU, with PEFT, in the sandbox

def local_base(view) -> tuple[str | None, str]:
    """(folder of the base model on this machine, '') or (None, what a CPU try would need)."""
    model = str(view.spec.get("model") or "")
    if model in BUILTIN_MODELS:
        local = getattr(view.store, "local_path", None)
        if local is None:
            return None, (f"the run's builtin model is in {layout.BASE_MODEL_DIR}/ of its bucket on the Hub; a CPU "
                          "try needs the run's folder on this machine (a local run), or a live distributed run")
        prefix = f"{layout.run_prefix(view.run_id)}/{layout.BASE_MODEL_DIR}"
        folder = local(prefix)
        if not view.store.sizes([f"{prefix}/config.json"]):    # the store: reached through real folders only
            return None, (f"the run's {layout.BASE_MODEL_DIR}/ folder holds no model yet (its first job builds it)")
        if any(entry.is_symlink() for entry in os.scandir(folder)):
            # A run's jobs write its folder: a link there could hand the try a file from outside it.
            return None, f"the run's {layout.BASE_MODEL_DIR}/ folder holds links, which a try never follows"
        return _fits(folder)
    if os.path.isabs(model):
        return (_fits(model) if os.path.isfile(os.path.join(model, "config.json"))
                else (None, f"the base model folder {model} is not on this machine"))
    try:
        folder = snapshot_download(model, local_files_only=True)
    except Exception:   # not in this machine's cache (or not a Hub id): say what would help
        return None, (f"{model} is not in this machine's Hugging Face cache (`hf download {model}` puts it there), "
                      "or try it while a distributed run is live")
    return _fits(folder)


def _fits(folder: str) -> tuple[str | None, str]:
    weights = sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder) if n.endswith(".safetensors"))
    if weights > MAX_BASE_BYTES:
        return None, (f"the base model's weights are {weights / 2**30:.1f} GiB; a CPU try here takes models up to "
                      f"{MAX_BASE_BYTES / 2**30:.0f} GiB: try it while a distributed run is live")
    if not weights:
        return None, "the base model has no safetensors weights"
    return folder, ""


def _cpu_try(view, base: str, local: dict, prompt: str, tokens: int, state: TryAnswers,
             who: str, address: str | None = None) -> Iterator[TryAnswers]:
    refusal = local_sandbox().refusal()
    if refusal:     # fail closed: no sandbox, nothing loaded here (unless the operator opted in)
        _not_tried(state, local, refusal)
        return
    try:
        ticket = _line.join(who, address)
    except LineRefused as exc:
        _not_tried(state, local, str(exc))
        return
    scratch = None
    try:        # leaving (the visitor cancelled or went: Gradio closes this generator) gives the place up
        for where in _line.wait(ticket):
            state.progress = where
            yield state
        scratch = tempfile.mkdtemp(prefix="grpo-try-")
        box = local_sandbox()
        adapters = {}
        for pick, chosen in local.items():
            state.routes[pick] = "PEFT on CPU" + ("" if box.bwrap else " (unsandboxed)")
            if chosen is not None:
                adapters[pick] = _stage_adapter(view, chosen, os.path.join(scratch, f"a{len(adapters)}"), box)
        state.progress = f"Loading the base model and {len(adapters)} adapter(s) on CPU…"
        yield state
        inside_base = _stage_base(base, os.path.join(scratch, "base"), box)
        yield from _run_worker(box, scratch, inside_base, adapters, BASE in local, _messages(view, prompt), tokens,
                               state, _line.left_s(ticket))
    except LineRefused as exc:
        _not_tried(state, local, str(exc))
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
        _line.leave(ticket)


def _not_tried(state: TryAnswers, local: dict, why: str) -> None:
    for pick in local:
        state.answers[pick], state.routes[pick] = f"(not tried: {why})", "-"


def _stage_adapter(view, chosen, folder: str, box: Sandbox) -> str:
    """Copy the adapter's two files into the scratch folder (a Hub bucket's or a local one's alike); its path as
    the worker sees it."""
    os.makedirs(folder)
    for f in chosen.files:
        name = posixpath.basename(f.path)
        if name in layout.ADAPTER_FILES and f.size <= MAX_ADAPTER_BYTES:
            with open(os.path.join(folder, name), "wb") as out:
                out.write(view.store.read_bytes(f.path))
    return f"{INSIDE_WORK}/{os.path.basename(folder)}" if box.bwrap else folder


def _stage_base(folder: str, target: str, box: Sandbox) -> str:
    """A copy of the base model's files in the scratch folder (links resolved: a Hub cache snapshot is links into
    blobs the sandbox does not see, and a run's folder may be readable by its writer only); its path inside."""
    os.makedirs(target)
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if os.path.isfile(path) and name.endswith(BASE_FILES):
            shutil.copyfile(path, os.path.join(target, name))
    return f"{INSIDE_WORK}/base" if box.bwrap else target


def _run_worker(box: Sandbox, scratch: str, base: str, adapters: dict, with_base: bool, messages: list[dict],
                tokens: int, state: TryAnswers, budget_s: float) -> Iterator[TryAnswers]:
    """Run the worker, stopped after `budget_s` (what is left of the try's turn of `TRY_TIMEOUT_S`)."""
    nonce = secrets.token_hex(16)
    request = {"nonce": nonce, "base": base, "adapters": adapters, "with_base": with_base,
               "prompt": messages[-1]["content"], "system_prompt": messages[0]["content"] if len(messages) > 1 else "",
               "max_new_tokens": tokens, "limits": LIMITS, "drop_uid": box.drop_uid}
    if box.drop_uid is not None:
        for folder, dirs, files in os.walk(scratch):
            for name in [folder, *(os.path.join(folder, n) for n in dirs + files)]:
                os.chown(name, box.drop_uid, box.drop_uid)
    argv, env, cwd = box.command([sys.executable, "-m", "runtime.check.try_adapter"], scratch, {})
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True, text=True)
    began = time.monotonic()
    timer = threading.Timer(budget_s, lambda: _kill(proc))
    timer.start()
    try:
        proc.stdin.write(json.dumps(request))
        proc.stdin.close()
        for line in proc.stdout:
            event = _event(line, nonce)
            if event is None:
                continue
            kind = event.get("event")
            label = str(event.get("label", ""))
            if kind == records.TRY_LOADED:
                state.progress = f"Base model loaded in {event.get('seconds')} s; answering…"
            elif kind == records.TRY_ANSWER and label in state.routes:
                state.answers[label] = str(event.get("text", ""))
            elif kind == records.TRY_ERROR and label in state.routes:
                state.answers[label] = f"(not loaded: {event.get('message')})"
            yield state
        proc.wait()
    finally:
        timer.cancel()
        _kill(proc)
        proc.wait()
        stderr = proc.stderr.read()[-2000:] if proc.stderr else ""
    missing = [label for label in state.routes if label not in state.answers and state.routes[label] != "-"]
    if missing:
        out_of_time = time.monotonic() - began >= budget_s - 1
        why = (f"the CPU try ran past {TRY_TIMEOUT_S:.0f} s" if out_of_time else
               f"the CPU try stopped (exit {proc.returncode}): {_last_line(stderr)}")
        for label in missing:
            state.answers[label] = redact_tokens(f"({why})")


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _event(line: str, nonce: str) -> dict | None:
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) and event.get("nonce") == nonce else None


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"
