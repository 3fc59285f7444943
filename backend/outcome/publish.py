"""Publish one adapter version of a run (the best by held-out score, final/, or any published version) to a Hub
model repo, with a model card generated from the run that says which version it is and why.

Buckets cannot be copied into a repo on the server, so the adapter's own files (`layout.SHIPPED_ADAPTER_FILES`:
its config, weights and version record, never anything else its folder holds, read through the store, which
follows no link) are read from the run's bucket store (the Hub bucket, or the local folder of a local run) and
uploaded in one commit with the card
(`create_repo` + `create_commit`). The repo is private unless the visitor asks otherwise.

What is shipped, pushed or downloaded as a zip alike, is built once, by `shipped_adapter`: the adapter's files with
`adapter_config.json` naming the base model as the user named it (PEFT writes the path the trainer loaded it from:
for the builtin tiny model a folder of the run's machine), and the card as README.md. No file names a path of the
machine the panel or the trainer ran on.
"""

import json
import os
import posixpath
import re
from dataclasses import dataclass

from huggingface_hub import CommitOperationAdd, HfApi

from backend.plan.engines import known_engine
from backend.plan.engines.base import Engine
from backend.plan.recipe import PEFT_VERSION, TRL_VERSION
from backend.plan.spec import HUB_ID, bucket_name_problem
from backend.plan.vllm_args import VLLM_LORA_RANKS, round_lora_rank
from backend.runtime import layout
from backend.runtime.redact import redact_tokens
from backend.runtime.tiny_model import TINY_MODEL, TINY_MODELS
from backend.runtime.user_code import reward_function_names
from backend.storage.adapters import shipped


class PublishError(ValueError):
    """The adapter cannot be pushed; the message says why and what would help."""


@dataclass(frozen=True)
class RunFacts:
    """What the card says about a run besides its spec: how far it got and where it can be found."""

    run_id: str
    engine: Engine                       # where it ran
    steps_done: int | None
    final_reward: float | None
    last_rewards_mean: float | None      # mean reward of the last logged steps
    reward_parts: dict[str, float]       # rewards/<name> at the last step
    bucket_path: str                     # where the run's files are (Markdown): hf://buckets/... or a local bucket
    trainer_url: str | None = None       # the trainer job on the Hub
    panel_url: str | None = None         # the Space the run was launched from


def default_repo_id(namespace: str, run_name: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", run_name).strip("-.") or "grpo"
    return f"{namespace}/{name}-lora"


def repo_id_problem(repo_id: str) -> str | None:
    """Why the Hub would refuse this model repo id, or None."""
    if not HUB_ID.match(repo_id or ""):
        return "write it as 'namespace/name', e.g. 'my-user/tiny-demo-lora'"
    return bucket_name_problem(repo_id.split("/", 1)[1])    # repo names follow the same rules as bucket names


def run_facts(view, bucket: str, where: Engine, trainer_url: str | None = None,
              panel_url: str | None = None, last: int = 10) -> RunFacts:
    rows = _rows(view, last)
    rewards = [r["reward"] for r in rows if isinstance(r.get("reward"), (int, float))]
    final = rows[-1] if rows else {}
    parts = {k.split("/", 1)[1]: final[k] for k in layout.reward_function_keys(final) if isinstance(final[k], float)}
    path = (f"`hf://buckets/{bucket}/runs/{view.run_id}`" if where.bucket_on_hub
            else f"`runs/{view.run_id}` in the panel's local bucket `{bucket}`")
    return RunFacts(view.run_id, where, final.get("step"), rewards[-1] if rewards else None,
                    sum(rewards) / len(rewards) if rewards else None, parts, path, trainer_url, panel_url)


def base_model_name(spec: dict) -> str:
    """The base model as a shipped file names it: its Hub id or builtin name as the user gave it, or for a local
    folder its folder's name alone (its path is the panel machine's, meaningless elsewhere)."""
    model = str(spec.get("model") or "")
    if HUB_ID.match(model) or model.startswith("builtin:"):
        return model
    return posixpath.basename(model.replace("\\", "/").rstrip("/")) or "base-model"


def portable_config(data: bytes, spec: dict) -> bytes:
    """`adapter_config.json` with `base_model_name_or_path` naming the base model as `base_model_name` does, in
    place of the path the trainer loaded it from; the bytes unchanged where it already does (or names none)."""
    try:
        config = json.loads(data)
    except ValueError as exc:
        raise PublishError(f"the adapter's adapter_config.json is not JSON ({exc}); it cannot be shipped") from None
    if not isinstance(config, dict):
        raise PublishError("the adapter's adapter_config.json is not a JSON object; it cannot be shipped")
    name = base_model_name(spec)
    if "base_model_name_or_path" not in config or config["base_model_name_or_path"] == name:
        return data
    return (json.dumps({**config, "base_model_name_or_path": name}, indent=2, sort_keys=True) + "\n").encode()


def run_card(registry, view, chosen, repo_id: str) -> str:
    """The card of adapter `chosen` of `view`'s run as it would be pushed to `repo_id`: the run's facts from its
    registry (where its files are, its trainer job, the Space it was launched from)."""
    records = registry.job_records(view.run_id)
    trainer = next((r for r in records if r.role == "trainer" and r.url), None)
    space = os.environ.get("SPACE_ID")
    facts = run_facts(view, next((r.bucket for r in records if r.bucket), view.spec.get("bucket", "")),
                      registry.engine, trainer.url if trainer else None,
                      f"https://huggingface.co/spaces/{space}" if space else None)
    return model_card(view.spec, facts, repo_id, chosen)


def shipped_adapter(registry, view, chosen, repo_id: str) -> dict[str, bytes]:
    """Every file the panel ships of adapter `chosen` (a `best_version.ChosenAdapter`), by name: its own files
    (nothing else its folder holds), `adapter_config.json` naming no path of this machine, and the card as
    README.md. The zip and the push both ship exactly this; PublishError when the adapter is incomplete."""
    files = shipped(chosen.files)
    names = {posixpath.basename(f.path) for f in files}
    if not all(n in names for n in layout.ADAPTER_FILES):
        raise PublishError(f"run {view.run_id} has no complete {chosen.name} adapter "
                           f"(both {' and '.join(layout.ADAPTER_FILES)})")
    out = {posixpath.basename(f.path): view.store.read_bytes(f.path) for f in files}
    out["adapter_config.json"] = portable_config(out["adapter_config.json"], view.spec)
    if layout.ADAPTER_META_FILE not in out:
        # Every shipped adapter says which version it is, also one whose folder holds no version.json (a serving
        # copy, a sweep member's adapter): what the run's records know of it.
        out[layout.ADAPTER_META_FILE] = (json.dumps({
            "name": chosen.name, "version": chosen.version, "step": chosen.step, "run_id": view.run_id,
            "written_by": "the panel, from the run's records (the adapter's folder held no version.json)"},
            indent=2) + "\n").encode()
    out["README.md"] = run_card(registry, view, chosen, repo_id).encode()
    return out


def card_repo_id(repo_id: str | None, run_name: str) -> str:
    """The repo a downloaded zip's card names: the one the push would go to where it is known, else a placeholder
    namespace the reader replaces with their own."""
    return repo_id if repo_id and not repo_id_problem(repo_id) else default_repo_id("your-namespace", run_name)


def model_card(spec: dict, facts: RunFacts, repo_id: str, chosen=None) -> str:
    """The README.md of the adapter's repo: metadata, which version it is and why (`chosen`, a
    `best_version.ChosenAdapter`), results, every setting that shaped it, how to use it."""
    base = base_model_name(spec)
    hub_base = base if HUB_ID.match(base) else None
    executor = facts.engine.label
    intro = (f"A LoRA adapter for {_code(base)} trained with GRPO (TRL {TRL_VERSION}, PEFT {PEFT_VERSION}) from the "
             f"GRPO + LoRA control panel: run {_code(facts.run_id)}, {spec.get('mode')} on {executor}.")
    results = [("steps", f"{_num(facts.steps_done)} of {spec.get('max_steps')}"),
               ("final reward (last logged step)", _num(facts.final_reward)),
               ("mean reward, last logged steps", _num(facts.last_rewards_mean))]
    results += [(f"reward `{k}` (last step)", _num(v)) for k, v in sorted(facts.reward_parts.items())]
    origin = [f"- The run's files (spec.json, metrics, events, code): {facts.bucket_path}"]
    origin += [f"- Trainer job: {facts.trainer_url}"] if facts.trainer_url else []
    origin += [f"- Launched from the panel: {facts.panel_url}"] if facts.panel_url else []
    which = _which_version(chosen) if chosen is not None else []
    lines = [*_front_matter(spec, hub_base), "", f"# {repo_id.split('/', 1)[1]}", "", intro, "", *which,
             "## Results", "", *_table(("result", "value"), results), "",
             "## Training", "", *_table(("setting", "value"), _settings(spec)), "",
             "## Use it", "", *_usage(spec, repo_id, hub_base), "",
             "## Where it comes from", "", *origin]
    return redact_tokens("\n".join(lines) + "\n")


def _which_version(chosen) -> list[str]:
    """The card's "Which version" section: the version, its step, why it was chosen, the run's best-by rule, its
    held-out score under that rule beside the base model's, the reward-hacking alert if one fired, and its trained
    score (named so) and each held-out reward."""
    rows = [("version", chosen.name), ("step", _num(chosen.step)), ("why this one", chosen.why),
            ("best version by (the rule)", chosen.rule or "-"),
            ("held-out score by the rule", chosen.rule_score),
            ("base model's held-out score by the rule", _num(chosen.baseline) if chosen.baseline is not None
             else "not evaluated")]
    if chosen.score is not None:
        std = f" ± {chosen.score.score_std:.4g}" if chosen.score.score_std is not None else ""
        rows.append(("trained score (held-out)", f"{chosen.score.score:.4g}{std} ({chosen.metric})"))
        rows += [(f"held-out `{name}`", _reward_cell(part)) for name, part in sorted(chosen.score.rewards.items())
                 if isinstance(part, dict)]
    alert = ["> ▲ **Warning:** " + chosen.alert.replace("\n", " "), ""] if chosen.alert else []
    return ["## Which version", "", *alert, *_table(("", ""), rows), ""]


def _reward_cell(part: dict) -> str:
    text = f"mean {_num(part.get('mean'))}"
    if isinstance(part.get("solved"), (int, float)):
        text += f", solved {float(part['solved']):.0%}"
    if part.get("weight") == 0:
        text += " (watched, weight 0)"
    return text


def _front_matter(spec: dict, hub_base: str | None) -> list[str]:
    dataset = str(spec.get("dataset") or "")
    meta = ["---", "library_name: peft", "pipeline_tag: text-generation"]
    meta += [f"base_model: {hub_base}"] if hub_base else []
    meta += ["tags:", "- peft", "- lora", "- trl", "- grpo"]
    meta += [f"- base_model:adapter:{hub_base}"] if hub_base else []
    meta += ["datasets:", f"- {dataset}"] if HUB_ID.match(dataset) else []
    return [*meta, "---"]


def _table(headers: tuple[str, str], rows: list[tuple]) -> list[str]:
    return [f"| {headers[0]} | {headers[1]} |", "| --- | --- |", *(f"| {_cell(k)} | {_cell(v)} |" for k, v in rows)]


def push_adapter(run_id: str, files: dict[str, bytes], repo_id: str, token: str, private: bool = True,
                 what: str = "final") -> str:
    """Create the repo (private unless asked) and commit `files` (`shipped_adapter`'s: the adapter and its card;
    `what`: its name in the commit message); return its URL."""
    problem = repo_id_problem(repo_id)
    if problem:
        raise PublishError(f"repo_id: {problem}")
    api = HfApi(token=token)
    url = api.create_repo(repo_id, private=private, exist_ok=True)
    operations = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=data) for name, data in files.items()]
    api.create_commit(repo_id, operations=operations, commit_message=f"LoRA adapter of GRPO run {run_id}: {what}")
    return str(url)


def _rows(view, last: int) -> list[dict]:
    table = getattr(view, "table", None)
    return table.rows(last=last) if table is not None else list(view.metrics[-last:])


def _settings(spec: dict) -> list[tuple[str, str]]:
    weights = spec.get("reward_weights") or {}
    rewards = [f"{r} (weight {weights.get(r, 1.0):g})" for r in _reward_names(spec)]
    dataset = str(spec.get("dataset") or "")
    if not HUB_ID.match(dataset) and not dataset.startswith("builtin:"):
        dataset = f"{posixpath.basename(dataset)} (a local file; the run keeps a copy in data/)"
    targets = ", ".join(spec.get("lora_target_modules") or [])
    lora = (f"r={spec.get('lora_r')}, alpha={spec.get('lora_alpha')}, dropout={spec.get('lora_dropout')}, "
            f"target modules {targets}")
    grpo = (f"learning rate {spec.get('learning_rate')}, {spec.get('max_steps')} steps, batch size "
            f"{spec.get('per_device_batch_size')} per device x {spec.get('num_processes')} process(es), "
            f"{spec.get('num_generations')} generations per prompt, max completion {spec.get('max_completion_length')} "
            f"tokens, temperature {spec.get('temperature')}, KL beta {spec.get('beta')}, seed {spec.get('seed')}")
    rows = [("Base model", _base_model_cell(spec)), ("Dataset", dataset)]
    if HUB_ID.match(str(spec.get("dataset") or "")):
        rows.append(("Config / split", f"{spec.get('dataset_config') or '(first)'} / {spec.get('dataset_split')}"))
    rows += [("Prompt column", spec.get("prompt_column")), ("Rewards", ", ".join(rewards)), ("LoRA", lora),
             ("GRPO", grpo)]
    if spec.get("system_prompt"):
        rows.append(("System prompt", spec["system_prompt"]))
    if spec.get("mode") == "distributed":
        replicas = f"{spec.get('replicas')} vLLM replica(s) on {spec.get('vllm_flavor')}"
        rows.append(("Async GRPO", f"{replicas}, max staleness {spec.get('max_staleness')}, adapter-only weight sync"))
    else:
        rows.append(("Generation", "colocated vLLM" if spec.get("use_vllm") else "transformers generate()"))
    where = known_engine(spec.get("executor"))
    if where is not None and where.chooses_hardware:
        rows.append(("Hardware", f"trainer on {spec.get('flavor')}"))
    return rows


def _base_model_cell(spec: dict) -> str:
    name = base_model_name(spec)
    return name if name == spec.get("model") else f"{name} (a local model folder)"


def _reward_names(spec: dict) -> list[str]:
    return [*(spec.get("rewards") or []), *reward_function_names(spec.get("reward_code") or "")]


def _usage(spec: dict, repo_id: str, hub_base: str | None) -> list[str]:
    # A spec.json that validated has a rank vLLM serves; an older or edited one is capped to the largest.
    rank = round_lora_rank(min(int(spec.get("lora_r") or 1), VLLM_LORA_RANKS[-1]))
    lora_name = repo_id.split("/", 1)[1]
    seed = spec.get("seed")
    if hub_base:
        base, note = hub_base, []
    elif spec.get("model") in TINY_MODELS:
        base, name = layout.BASE_MODEL_DIR, spec["model"]
        note = [(f"The base model is the panel's builtin tiny model ({name}, seed {seed}): the run keeps it in "
                 f"`{base}/` of its bucket folder, and `python -m runtime.tiny_model --out {base} --seed {seed}"
                 + (f" --name {name}" if name != TINY_MODEL else "")
                 + "` in the run's `code/` folder builds it again."), ""]
    else:
        base = base_model_name(spec)
        note = [(f"The base model was a local model folder named {_code(base)} on the machine that trained it (not "
                 f"on the Hub): load it from your own copy of that folder."), ""]
    return [*note, "With PEFT:", "", "```python", "from peft import PeftModel",
            "from transformers import AutoModelForCausalLM", "",
            f'base = AutoModelForCausalLM.from_pretrained("{base}")',
            f'model = PeftModel.from_pretrained(base, "{repo_id}")', "```", "",
            "Served by vLLM as a LoRA module (a private repo needs `HF_TOKEN` in the server's environment):", "",
            "```bash", f"vllm serve {base} --enable-lora --max-lora-rank {rank} \\",
            f"    --lora-modules {lora_name}={repo_id}", "```", "",
            f'then ask for `"model": "{lora_name}"` in `/v1/completions` or `/v1/chat/completions` requests.']


def _num(value) -> str:
    return "-" if value is None else (f"{value:.4g}" if isinstance(value, float) else str(value))


def _code(text: str) -> str:
    return "`" + str(text).replace("`", "'") + "`"


def _cell(value) -> str:
    """A value inside a Markdown table cell: one line, its pipes escaped."""
    return str(value).replace("\n", " ").replace("|", "\\|")
