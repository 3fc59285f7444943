"""The launch form's task check: dataset rows, the prompt as the model sees it, sample scores. The code is read here
and run elsewhere: in the sandbox on a local panel, in the visitor's own check job on a panel that serves others,
whose result is reused for the same task and visitor for a while."""

import hashlib
import json
import os
import time
from dataclasses import replace

from backend.executors.hf_jobs import HfJobsExecutor
from backend.plan.spec import TASK_FIELDS, FieldError, RunSpec, SpecError
from backend.runs.access import Visitor, acting_token, no_token_reason
from backend.runs.hub_auth import can_control
from backend.runtime.task import is_local_file
from backend.task.check import TaskReport, check_task, task_field_errors
from backend.task.check_job import CHECK_FLAVOR, check_in_job

CHECK_REUSE_S = 3600.0     # a check job's result stands this long for the same task and visitor
CHECKS_KEPT = 256
CHECK_EXECUTOR = HfJobsExecutor.name   # a panel that serves others checks a task in the visitor's own HF Jobs account
CHECK_SIGN_IN = ("Sign in with Hugging Face (button at the top) to check your task: this panel never runs anyone's "
                 "code on its own machine, so the reward functions run in a short CPU job in your own account.")


class TaskChecks:
    """Part of `Operations` (`operations.py`), whose state and other parts it uses: `deployment`, `runs`, `uploaded`,
    `_checks`, `_checks_lock`; `default_bucket` and `flavors` (`Offers`)."""

    def check_task(self, values: dict, visitor: Visitor, spec: RunSpec | None = None, progress=None) -> TaskReport:
        """The task check and preview (a TaskReport): dataset rows, the prompt as the model sees it, sample scores.
        The code is read here and run elsewhere: in the sandbox on a local panel, in the visitor's own check job
        on a panel that serves others (`progress`, if given, gets a line as that job goes)."""
        try:
            spec = spec or RunSpec.from_dict(values)
        except SpecError as exc:
            return TaskReport(errors=exc.errors)
        problems = task_field_errors(spec)
        if problems:
            return TaskReport(errors=problems)
        if self.deployment.on_space and is_local_file(spec.dataset) and not self.uploaded(spec.dataset):
            return TaskReport(errors=[FieldError("dataset", "on a Space, upload your file (Upload .jsonl / .parquet): "
                                                            "the Space's own files cannot be read")])
        if not self.deployment.serves_others:
            token = acting_token(visitor, self.deployment) if spec.engine.needs_token else None
            return check_task(spec, token, self.deployment.datasets_server, self.deployment.task_check_timeout_s)
        return self._check_in_job(spec, visitor, progress)

    def _check_in_job(self, spec: RunSpec, visitor: Visitor, progress) -> TaskReport:
        token = acting_token(visitor, self.deployment)
        if not token:
            why = CHECK_SIGN_IN if self.deployment.on_space else (
                f"{no_token_reason(self.deployment)} A panel that others reach checks a task in a job of the visitor's "
                "own account, never on its own machine.")
            return TaskReport(errors=[FieldError("account", why)])
        bucket = spec.bucket if spec.engine.bucket_on_hub and spec.bucket.strip() else ""
        spec = replace(spec, executor=CHECK_EXECUTOR,
                       bucket=bucket or self.default_bucket(visitor, CHECK_EXECUTOR) or spec.bucket)
        key = _check_key(spec, token)
        with self._checks_lock:
            cached = self._checks.get(key)
        if cached and time.time() - cached[0] < CHECK_REUSE_S:
            return cached[1]
        allowed, reason = can_control(spec.bucket_namespace, token, self.deployment.on_space)
        if not allowed:
            return TaskReport(errors=[FieldError("bucket", f"the check job runs in the bucket's namespace: {reason}")])
        registry = self.runs.hub_registry(token, spec.bucket_namespace)
        price = next((f.price_per_hour_usd for f in self.flavors(visitor, registry.executor.name)
                      if f.name == CHECK_FLAVOR), None)
        report = check_in_job(spec, token, self.deployment.datasets_server, registry.executor,
                              registry.store_for(spec.bucket), price, self.deployment.task_check_timeout_s, progress,
                              journal=self.runs.journal)
        with self._checks_lock:
            self._checks[key] = (time.time(), report)
            while len(self._checks) > CHECKS_KEPT:
                self._checks.pop(next(iter(self._checks)))
        return report


def _check_key(spec: RunSpec, token: str) -> str:
    """What a check result depends on: the task's fields, the dataset file's bytes, the bucket and the visitor."""
    task = {name: getattr(spec, name) for name in TASK_FIELDS}
    digest = hashlib.sha256(json.dumps([task, spec.bucket, spec.image, spec.mode], sort_keys=True,
                                       default=str).encode())
    if is_local_file(spec.dataset) and os.path.isfile(spec.dataset):
        with open(spec.dataset, "rb") as f:
            for block in iter(lambda: f.read(2**20), b""):
                digest.update(block)
    digest.update(hashlib.sha256(token.encode()).digest())
    return digest.hexdigest()
