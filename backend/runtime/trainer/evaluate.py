"""Held-out evaluation: each published adapter version answers the run's held-out prompts, scored by the run's
rewards and its monitor-only ones (weight 0), written as `evals/trainer-NNNNNN.jsonl` fragments, one record per
evaluated version; the best version's adapter is kept in `best/` (best_rule.py says which is best). Version 0 is
the base model, evaluated once before training starts (its record has step 0): the baseline every version must beat.

A record:
    {"time", "step", "policy_version", "n_prompts", "samples_per_prompt", "greedy",
     "score":     the weighted sum of the reward means (rewards of weight != 0): the held-out reward,
     "score_std": the spread of the per-prompt weighted score,
     "rewards":   {name: {"mean", "std", "weight", "solved"}}  (solved: share of prompts whose best sample scored
                  >= 1, for a reward that only gave 0 or 1; else None),
     "samples":   [{"prompt_index", "prompt", "completion", "rewards"}]  (the first prompts, the same each time)}

Who answers: the colocated trainer generates with the model it trains (`LocalGenerator`), the distributed one asks
the replicas through the proxy for `trl-policy-vN` (`ReplicaGenerator`), a bounded number of requests at a time;
version 0 with the adapter off, or from the replicas' base model.
"""

import contextlib
import json
import math
import os
import queue
import shutil
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from ..best_rule import best_json, newest_best_by, pick_best
from ..layout import (
    ADAPTER_FILES,
    ADAPTER_META_FILE,
    BEST_DIR,
    BEST_FILE,
    EVALS_DIR,
    FRAGMENT_RE,
    TRAINER_WRITER,
    FragmentWriter,
    adapter_name,
    atomic_write_bytes,
    publish_folder,
    spec_member,
)
from ..redact import redact_record
from ..rewards import checked_scores, reward_functions, run_rewards
from ..spec_file import SpecFile
from ..task import render_prompt
from .samples import MAX_TEXT, text_of

SAMPLES_SHOWN = 4           # held-out prompts whose answers a record keeps, for the samples view
REQUEST_TIMEOUT_S = 300.0
RETRIES = 3                 # of a held-out request the proxy answered 503


def eval_rewards(spec: SpecFile) -> list[tuple[str, object, float]]:
    """(name, function, weight) of every reward scored on the held-out set: the run's own, then the monitor-only
    ones at weight 0."""
    functions, weights = run_rewards(spec)
    names = [*spec["rewards"], *[getattr(f, "__name__", "") for f in functions[len(spec["rewards"]):]]]
    monitored = spec.get("monitor_rewards") or []
    return ([*zip(names, functions, weights)]
            + [(name, f, 0.0) for name, f in zip(monitored, reward_functions(monitored, spec))])


def score_answers(rewards, rows: list[dict], answers: list[list[str]], tokenizer, extra: dict | None = None
                  ) -> dict[str, list[list[float | None]]]:
    """Every reward's score of every answer (per prompt, per sample), each reward called once as TRL calls it."""
    columns = [k for k in rows[0] if k != "prompt"] if rows else []
    flat = [(row, text) for row, texts in zip(rows, answers) for text in texts]
    kwargs = dict(prompts=[row["prompt"] for row, _ in flat],
                  completions=[[{"role": "assistant", "content": text}] for _, text in flat],
                  completion_ids=[tokenizer(text, add_special_tokens=False)["input_ids"] for _, text in flat],
                  **{c: [row[c] for row, _ in flat] for c in columns}, **(extra or {}))
    out = {}
    for name, function, _ in rewards:
        scores = checked_scores(name, function(**kwargs), len(flat), allow_none=True)
        per_prompt, i = [], 0
        for texts in answers:
            per_prompt.append(scores[i:i + len(texts)])
            i += len(texts)
        out[name] = per_prompt
    return out


def _mean_std(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    mean = sum(values) / len(values)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def _solved(per_prompt: list[list[float | None]]) -> float | None:
    """Share of prompts whose best sample scored >= 1, for a pass/fail reward (every score 0 or 1)."""
    seen = [s for scores in per_prompt for s in scores if s is not None]
    if not seen or any(s not in (0.0, 1.0) for s in seen):
        return None
    best = [max((s for s in scores if s is not None), default=0.0) for scores in per_prompt]
    return sum(b >= 1.0 for b in best) / len(best)


def eval_record(step: int, version: int, rows: list[dict], answers: list[list[str]],
                scores: dict[str, list[list[float | None]]], weights: dict[str, float], greedy: bool) -> dict:
    """One evaluated version's record (the module's docstring says what it holds)."""
    rewards = {}
    for name, per_prompt in scores.items():
        mean, std = _mean_std([s for prompt in per_prompt for s in prompt if s is not None])
        rewards[name] = {"mean": mean, "std": std, "weight": weights[name], "solved": _solved(per_prompt)}
    weighted = {n: w for n, w in weights.items() if w != 0}
    score = sum(w * (rewards[n]["mean"] or 0.0) for n, w in weighted.items())
    per_prompt_score = []
    for i, texts in enumerate(answers):
        for_prompt = [sum(w * (scores[n][i][j] or 0.0) for n, w in weighted.items()) for j in range(len(texts))]
        per_prompt_score.append(sum(for_prompt) / len(for_prompt) if for_prompt else 0.0)
    samples = [{"prompt_index": i, "prompt": text_of(rows[i]["prompt"])[-MAX_TEXT:],
                "completion": answers[i][0][:MAX_TEXT] if answers[i] else "",
                "rewards": {n: scores[n][i][0] for n in scores if answers[i] and scores[n][i][0] is not None}}
               for i in range(min(SAMPLES_SHOWN, len(rows)))]
    return redact_record({
        "time": time.time(), "step": step, "policy_version": version, "n_prompts": len(rows),
        "samples_per_prompt": max((len(a) for a in answers), default=0), "greedy": greedy,
        "score": score, "score_std": _mean_std(per_prompt_score)[1] or 0.0, "rewards": rewards, "samples": samples})


def score_metric(weights: dict[str, float]) -> str:
    """What the score is, in words: 'digits', or '1 x accuracy_reward + 0.2 x think_format_reward'."""
    weighted = {n: w for n, w in weights.items() if w != 0}
    if len(weighted) == 1 and next(iter(weighted.values())) == 1:
        return next(iter(weighted))
    return " + ".join(f"{w:g} x {n}" for n, w in weighted.items()) or "no weighted reward"


class BestVersion:
    """`best/`: the adapter of the best version so far under the rule in force (`best_rule`: the user's `best_by`,
    changed on the run or as launched; ties go to the earliest version; it must beat the base model, version 0) and
    `best.json` saying why. Republished when a newly evaluated version becomes the best. Kept apart from the serving
    copies TRL prunes. A resumed run reads back the records and the best it had."""

    def __init__(self, run_dir: str, metric: str, best_by: dict | None = None, member: str = ""):
        self.run_dir, self.member = run_dir, member
        self.folder = os.path.join(run_dir, BEST_DIR)
        self.metric, self.launch_rule = metric, dict(best_by or {})
        self.records = {r["policy_version"]: _ranked(r) for r in _records_in(os.path.join(run_dir, EVALS_DIR))}
        self.best = self._read()

    def _read(self) -> dict | None:
        """best.json as it stands (the panel republishes best/ when the user changes the rule)."""
        try:
            with open(os.path.join(self.folder, BEST_FILE)) as f:
                best = json.load(f)
        except (OSError, ValueError):
            return None
        return best if isinstance(best, dict) else None

    @property
    def evaluated(self) -> int:
        return sum(1 for v in self.records if v >= 1)

    def rule(self) -> dict[str, float]:
        """The rule in force: the user's newest change on the run, else the launch spec's best_by."""
        changed = newest_best_by(self.run_dir)
        return self.launch_rule if changed is None else changed

    def offer(self, record: dict, adapter_dir: str | None) -> bool:
        """Count an evaluated version (version 0: the base model, the baseline); publish it as best/ if it is now
        the best under the rule in force. Whether it was published."""
        self.records[record["policy_version"]] = _ranked(record)
        rule = self.rule()
        best, baseline = pick_best(self.records, rule)
        self.best = self._read()
        current = (self.best or {}).get("policy_version")
        publish = adapter_dir is not None and best == record["policy_version"] and best != current
        if publish:
            with publish_folder(self.folder) as tmp:
                for name in (*ADAPTER_FILES, ADAPTER_META_FILE):
                    if os.path.isfile(os.path.join(adapter_dir, name)):
                        shutil.copyfile(os.path.join(adapter_dir, name), os.path.join(tmp, name))
                if not os.path.isfile(os.path.join(tmp, ADAPTER_META_FILE)):
                    with open(os.path.join(tmp, ADAPTER_META_FILE), "w") as f:
                        json.dump({"version": record["policy_version"],
                                   "name": adapter_name(record["policy_version"], self.member),
                                   "step": record["step"]}, f)
                self._write_why(tmp, best, rule, baseline)
        elif best is not None and best == current and os.path.isdir(self.folder):
            self._write_why(self.folder, best, rule, baseline)      # the count of evaluated versions moves on
        return publish

    def _write_why(self, folder: str, best: int, rule: dict, baseline: float | None) -> None:
        self.best = best_json(self.records[best], rule, baseline, self.evaluated, self.metric)
        atomic_write_bytes(os.path.join(folder, BEST_FILE), json.dumps(self.best).encode())


def _ranked(record: dict) -> dict:
    """What ranking needs of a record: its version, step, score and reward means (not its samples)."""
    return {k: record.get(k) for k in ("policy_version", "step", "score", "rewards")}


def _records_in(folder: str) -> list[dict]:
    out = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if FRAGMENT_RE.match(name):
            with open(os.path.join(folder, name), "rb") as f:
                for line in f:
                    try:
                        record = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(record, dict) and type(record.get("policy_version")) is int:
                        out.append(record)
    return out


class HeldOutEvaluation:
    """Evaluates adapter versions on the held-out rows: when one is due, generate, score, write, keep the best."""

    def __init__(self, spec: SpecFile, run_dir: str, rows: list[dict], tokenizer, generate, extra=None):
        self.rows, self.tokenizer, self.generate, self.extra = rows, tokenizer, generate, extra or dict
        self.rewards = eval_rewards(spec)
        self.weights = {name: weight for name, _, weight in self.rewards}
        self.greedy = bool(spec.get("eval_greedy", True))
        self.every = int(spec.get("eval_every") or 0)
        self.fragments = FragmentWriter(os.path.join(run_dir, EVALS_DIR), TRAINER_WRITER)
        self.best = BestVersion(run_dir, score_metric(self.weights), spec.get("best_by") or {}, spec_member(spec))
        self.last_step: int | None = None

    def base_due(self) -> bool:
        """Whether the base model (version 0) still needs its evaluation: once per run, before training moves it."""
        return 0 not in self.best.records

    def due(self, step: int, last: bool = False) -> bool:
        """Whether the version published at `step` is evaluated (every one, or K steps after the last one)."""
        return last or not self.every or self.last_step is None or step - self.last_step >= self.every

    def evaluate(self, version: int, step: int, adapter_dir: str | None) -> dict:
        """Evaluate version `version` (published at `step`, its files in `adapter_dir`; version 0: the base model,
        no adapter); return its record."""
        if version:
            self.last_step = step
        answers = self.generate([row["prompt"] for row in self.rows], version)
        scores = score_answers(self.rewards, self.rows, answers, self.tokenizer, self.extra())
        record = eval_record(step, version, self.rows, answers, scores, self.weights, self.greedy)
        self.fragments.write([record])
        self.best.offer(record, adapter_dir)
        return record


def progress_line(record: dict) -> str:
    what = "the base model" if record["policy_version"] == 0 else f"step {record['step']}"
    return (f"held-out v{record['policy_version']} ({what}): score {record['score']:.3f} "
            f"over {record['n_prompts']} prompts")


def evaluate_base(evaluation: "HeldOutEvaluation") -> None:
    """The base model as version 0, before training: the baseline every version must beat (never stops training)."""
    if not evaluation.base_due():
        return
    try:
        print(progress_line(evaluation.evaluate(0, 0, None)), flush=True)
    except Exception as error:   # a held-out score must never stop training
        print(f"held-out v0 (the base model) not evaluated: {type(error).__name__}: {error}", flush=True)


class LocalGenerator:
    """Answers with the model being trained (the colocated trainer), through transformers' generate."""

    def __init__(self, model_of, tokenizer, spec: SpecFile, batch_size: int = 16):
        self.model_of, self.tokenizer, self.batch_size = model_of, tokenizer, batch_size
        self.greedy = bool(spec.get("eval_greedy", True))
        self.n = 1 if self.greedy else int(spec.get("eval_samples_per_prompt") or 1)
        self.temperature, self.max_tokens = spec["temperature"], spec["max_completion_length"]

    def __call__(self, prompts: list, version: int) -> list[list[str]]:
        import torch  # noqa: PLC0415 trainer only

        model, tokenizer = self.model_of(), self.tokenizer
        was_training, side = model.training, tokenizer.padding_side
        model.eval()
        tokenizer.padding_side = "left"     # a batch of prompts ends where the answers begin
        answers = []
        try:
            for start in range(0, len(prompts), self.batch_size):
                texts = [render_prompt(tokenizer, p) for p in prompts[start:start + self.batch_size]]
                batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
                batch = {k: v.to(model.device) for k, v in batch.items()}
                sampling = {} if self.greedy else {"temperature": self.temperature, "top_k": 0, "top_p": 1.0}
                # Version 0 is the base model: the adapter off (a fresh LoRA adds nothing, a resumed one does).
                base = model.disable_adapter() if version == 0 and hasattr(model, "disable_adapter") else None
                with torch.no_grad(), base or contextlib.nullcontext():
                    out = model.generate(**batch, max_new_tokens=self.max_tokens, do_sample=not self.greedy,
                                         num_return_sequences=self.n, pad_token_id=tokenizer.pad_token_id,
                                         **sampling)
                decoded = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
                answers += [decoded[i:i + self.n] for i in range(0, len(decoded), self.n)]
        finally:
            tokenizer.padding_side = side
            model.train(was_training)
        return answers


class ReplicaGenerator:
    """Answers with version `trl-policy-vN` (a sweep member's `trl-policy-<member>-vN`) on the replicas, through the
    proxy (the distributed trainer), with at most `eval_max_inflight` requests open at once so the rollouts keep the
    replicas."""

    def __init__(self, proxy_url: str, tokenizer, spec: SpecFile):
        self.url, self.tokenizer = proxy_url.rstrip("/"), tokenizer
        self.greedy = bool(spec.get("eval_greedy", True))
        self.n = 1 if self.greedy else int(spec.get("eval_samples_per_prompt") or 1)
        self.temperature, self.max_tokens = spec["temperature"], spec["max_completion_length"]
        self.pool = ThreadPoolExecutor(max_workers=int(spec.get("eval_max_inflight") or 4),
                                       thread_name_prefix="held-out")
        self._base: str | None = None
        self.member = spec_member(spec)

    def base_model(self) -> str:
        """The name the replicas serve the base model under (version 0): the model of /v1/models with no parent."""
        if self._base is None:
            with urllib.request.urlopen(f"{self.url}/v1/models", timeout=REQUEST_TIMEOUT_S) as response:
                models = json.load(response).get("data") or []
            self._base = next(m["id"] for m in models if not m.get("parent"))
        return self._base

    def _ask(self, prompt, version: int) -> list[str]:
        ids = self.tokenizer(render_prompt(self.tokenizer, prompt), add_special_tokens=False)["input_ids"]
        model = adapter_name(version, self.member) if version else self.base_model()
        body = {"model": model, "prompt": ids, "max_tokens": self.max_tokens, "n": self.n,
                "temperature": 0.0 if self.greedy else self.temperature, "skip_special_tokens": True}
        request = urllib.request.Request(f"{self.url}/v1/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        for attempt in range(RETRIES + 1):
            try:
                with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
                    choices = sorted(json.load(response)["choices"], key=lambda c: c.get("index", 0))
                return [c.get("text") or "" for c in choices]
            except urllib.error.HTTPError as error:
                # 503: the proxy found no healthy replica for a moment (a busy one misses its health check).
                if error.code != 503 or attempt == RETRIES:
                    raise
            time.sleep(2 * (attempt + 1))
        raise AssertionError("unreachable")

    def __call__(self, prompts: list, version: int) -> list[list[str]]:
        return list(self.pool.map(lambda p: self._ask(p, version), prompts))

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def snapshot_adapter(adapter_dir: str) -> str:
    """A private copy of an adapter's files: TRL deletes a serving copy a few syncs later, maybe mid-evaluation."""
    copy = tempfile.mkdtemp(prefix="held-out-")
    for name in (*ADAPTER_FILES, ADAPTER_META_FILE):
        if os.path.isfile(os.path.join(adapter_dir, name)):
            shutil.copyfile(os.path.join(adapter_dir, name), os.path.join(copy, name))
    return copy


class BackgroundEvaluation:
    """The distributed trainer's evaluation: each synced version is queued (with a private copy of its adapter)
    and evaluated by a thread of its own, in order, while training goes on. A version the replicas no longer hold
    when its turn comes (max_staleness + 1 newer ones were loaded meanwhile) is skipped, and said so."""

    def __init__(self, evaluation: HeldOutEvaluation, generator: ReplicaGenerator):
        self.evaluation, self.generator = evaluation, generator
        self.pending: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._work, name="held-out-evaluation", daemon=True)
        self.thread.start()

    def base(self) -> None:
        """Queue the base model (version 0) first, when the run has not evaluated it yet."""
        if self.evaluation.base_due():
            self.pending.put((0, 0, None))

    def published(self, version: int, step: int, adapter_dir: str, last: bool = False) -> None:
        if self.evaluation.due(step, last):
            self.evaluation.last_step = step
            self.pending.put((version, step, snapshot_adapter(adapter_dir)))

    def _work(self) -> None:
        while True:
            item = self.pending.get()
            if item is None:
                return
            version, step, copy = item
            try:
                print(progress_line(self.evaluation.evaluate(version, step, copy)), flush=True)
            except Exception as error:   # evaluation must never stop training
                print(f"held-out v{version} (step {step}) not evaluated: {type(error).__name__}: {error}", flush=True)
            finally:
                if copy:
                    shutil.rmtree(copy, ignore_errors=True)
                self.pending.task_done()

    def finish(self, timeout_s: float = 120.0) -> None:
        """Wait for the queued versions (the last one included), at most `timeout_s`, then stop the thread."""
        self.pending.put(None)
        self.thread.join(timeout_s)
        self.generator.close()
