"""What this deployment offers a visitor: the executors, the token to act with on a namespace, the launch form's
defaults (mount path, bucket), hardware with prices and what a run's jobs can cost, the job secrets a run gets."""

import os

from backend.plan import recipe
from backend.plan.engines import engine, engines, known_engine
from backend.plan.engines.base import Engine
from backend.plan.hardware import Flavor, estimate_cost
from backend.plan.jobspec import JobSpec
from backend.plan.spec import RunSpec
from backend.runs.access import (
    Refused,
    Visitor,
    acting_token,
    local_runs_problem,
    no_token_reason,
    token_lifetime_problem,
)
from backend.runs.answers import CostEstimate, TokenTooShort
from backend.runs.hub_auth import can_control, whoami_name


class Offers:
    """Part of `Operations` (`operations.py`), whose state it uses: `deployment`, `spend`, `local`."""

    def offered_executors(self) -> list[str]:
        """The executors this deployment offers: those whose runtime it has, the panel's own machine only where
        local runs are on."""
        return [where.name for where in engines() if self._offers(where)]

    def _offers(self, where: Engine) -> bool:
        if where.runtime_problem():
            return False
        return not where.operators_machines or self.deployment.local_runs != "off"

    def control_token(self, where: Engine, namespace: str | None, visitor: Visitor) -> str | None:
        """The token to act with on `namespace` with engine `where`'s runs; raises Refused with a reason the visitor
        can act on."""
        problem = where.runtime_problem() or (
            local_runs_problem(visitor, self.deployment) if where.operators_machines else None)
        if problem:
            raise Refused(problem)
        if not where.needs_token:
            return None
        token = acting_token(visitor, self.deployment)
        if not token:
            raise Refused(no_token_reason(self.deployment))
        allowed, reason = can_control(namespace or "", token, self.deployment.on_space)
        if not allowed:
            raise Refused(reason)
        return token

    def missing_token(self, executor: object, visitor: Visitor) -> str | None:
        """Why a run on `executor` cannot start for this visitor yet (its engine needs a token they lack), or None."""
        where = known_engine(executor)
        if where is None or not where.needs_token or acting_token(visitor, self.deployment):
            return None
        return no_token_reason(self.deployment)

    def default_mount(self, executor: str, make: bool = False) -> str:
        """The form's mount path for runs on `executor`: its engine's, else the spec's. With `make`, an engine's
        folder (one of this panel's home) is made, as the form is about to offer it."""
        where = known_engine(executor)
        mount = where.default_mount(self.deployment.home) if where is not None else None
        if mount is None:
            return RunSpec.mount_path
        if mount and make:
            os.makedirs(mount, mode=0o700, exist_ok=True)
        return mount

    def default_bucket(self, visitor: Visitor, executor: str) -> str:
        """The bucket a preset starts with: the visitor's own `<name>/grpo-runs` on the Hub, created on first
        launch (private); '' when nobody is signed in, so the form asks for one."""
        where = known_engine(executor)
        if where is None or not where.bucket_on_hub:
            return RunSpec.bucket
        if visitor.username:
            return f"{visitor.username}/grpo-runs"
        token = acting_token(visitor, self.deployment)
        if token:
            try:
                return f"{whoami_name(token)}/grpo-runs"
            except Exception:   # the Hub unreachable: the visitor types the bucket
                return ""
        return ""

    def flavors(self, visitor: Visitor, executor: str | None = None) -> list[Flavor]:
        """The hardware of `executor`'s runs (None: of every executor this deployment offers whose runs choose it),
        with prices (the Hub's list asked with the visitor's token, or the built-in one), asked at most every 10
        minutes."""
        token = acting_token(visitor, self.deployment)
        chosen = [engine(executor)] if executor else [where for where in engines() if self._offers(where)]
        return [f for where in chosen if where.chooses_hardware
                for f in self.spend.flavor_cache.get((where.name, "signed in", bool(token)),
                                                     lambda where=where: where.flavors(token))]

    def estimate(self, jobs: list[JobSpec], visitor: Visitor) -> CostEstimate:
        flavors = self.flavors(visitor)
        fallback = any(f.fallback for f in flavors)
        try:
            return CostEstimate(estimate_cost(jobs, flavors), fallback_prices=fallback)
        except ValueError as exc:
            return CostEstimate(None, str(exc), fallback)

    def _check_token_lifetime(self, where: Engine, visitor: Visitor, spec: RunSpec) -> None:
        expiry = token_lifetime_problem(visitor, spec.timeout_minutes * 60) if where.needs_token else None
        if expiry:
            raise TokenTooShort(expiry)


def job_secrets(token: str | None) -> dict[str, str]:
    """The job secrets a run gets: the acting token, where its engine needs one."""
    return {recipe.TOKEN_SECRET: token} if token else {}
