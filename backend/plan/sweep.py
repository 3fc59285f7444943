"""A sweep: N distributed LoRA runs that differ in one to three settings, trained on one replica fleet.

    sweep = SweepSpec(base, {"learning_rate": [1e-4, 5e-4], "lora_r": [8, 16]}, grid=True)
    members = sweep.members()        # 4 RunSpecs, tied by sweep.sweep_id, tagged m0..m3
    fleet = fleet_size(members)      # --max-loras 12, --max-lora-rank 16, and a note on padding

Members are ordinary runs (their own spec, bucket folder, checkpoints, resume); what ties them is `sweep_id`, and what
keeps them apart on the shared replicas is `sweep_member`, part of every adapter version's name
(`layout.adapter_name`). A sweep varies only what one trainer decides (its LoRA, its GRPO settings, its share of the
fleet's traffic): the fleet itself (the model, the mode, the replicas, their hardware) is one for every member.
Bad input is refused with the field named, before anything is launched. No I/O beyond `RunSpec.validate`'s.
"""

import dataclasses
import hashlib
import itertools
import json
import math
import secrets
import time
from dataclasses import dataclass, field

from backend.plan.spec import RunSpec, SpecError, _coerce
from backend.plan.spec_fields import GRPO, LORA, FieldError
from backend.plan.vllm_args import max_loras, round_lora_rank

MAX_SWEPT_FIELDS = 3
# Adapter slots one replica may be asked to hold for a whole sweep. vLLM reserves, on each replica and for each slot,
# the weights of an adapter of --max-lora-rank on every target module, and batches at most --max-loras adapters per
# step: past this the reserve crowds out the KV cache of a small GPU. A sweep that needs more runs fewer members.
MAX_FLEET_LORA_SLOTS = 32
# Members a sweep may have, checked before any combination is made, so a long value list (a visitor's input) never
# builds its grid: a bound above what the slots allow (each member holds at least 3: max_staleness 1 + 2), which the
# slots check then refuses with the field named.
MAX_MEMBERS = MAX_FLEET_LORA_SLOTS // 2
# The early-stop rule's K (successive halving after K held-out versions each): 0 stops members by hand only.
MAX_EARLY_STOP_AFTER = 1000
EARLY_STOP_FIELD = "early_stop_after"
# The sweep's one budget cap over its members and its fleet (USD; 0: none), as a refusal names it.
BUDGET_FIELD = "sweep_budget_usd"

# The trainer-side fields of the distributed section: each member's own, not the fleet's.
DISTRIBUTED_MEMBER_FIELDS = ("max_staleness", "max_tokens_per_batch", "max_inflight_tasks", "queue_maxsize",
                             "gradient_checkpointing")
TASK_MEMBER_FIELDS = ("reward_weights",)

# Fields that cannot vary between members, and why (the message the refusal gives).
FLEET_FIELDS = {
    "model": "the fleet serves one base model to every member",
    "mode": "a sweep's members are distributed runs sharing one replica fleet",
    "executor": "the fleet runs in one place",
    "replicas": "the fleet's size is one for every member",
    "servers_per_gpu": "the fleet's size is one for every member",
    "vllm_flavor": "the fleet's hardware is one for every member",
    "replica_max_model_len": "the fleet's replicas are started once, with one context length",
    "replica_gpu_memory_utilization": "the fleet's replicas are started once, with one memory share",
    "network": "the fleet has one network",
}


def sweepable_fields() -> tuple[str, ...]:
    """What a member may set apart from the others: the LoRA and GRPO sections, the trainer-side distributed
    fields and the reward weights."""
    sections = (LORA, GRPO)
    own = [f.name for f in dataclasses.fields(RunSpec) if f.metadata.get("section") in sections]
    return (*own, *DISTRIBUTED_MEMBER_FIELDS, *TASK_MEMBER_FIELDS)


def _key(value) -> str:
    """A value's identity for the duplicate check: 1e-4 and 0.0001 are one value, [a, b] one list."""
    return json.dumps(value, sort_keys=True)


@dataclass
class SweepSpec:
    """The base settings, and the swept fields with their values. `grid`: every combination of the values (a grid);
    otherwise the value lists are read side by side (all of one length), member i taking each field's i-th value."""

    base: RunSpec
    swept: dict[str, list]
    grid: bool = True
    sweep_id: str = field(default="")
    # The members' run ids, m0 first, where a reviewed preview gave them (the launch keeps the ids the preview
    # showed); empty, or not one a member: each member gets a new id.
    run_ids: tuple[str, ...] = ()
    # The stated early-stop rule: successive halving on the best held-out score after this many evaluated versions
    # each (`backend/view/sweep.py`, `Halving`); 0: members are stopped by hand only.
    early_stop_after: int = 0
    # One cap over every member's jobs and the fleet's, in USD (0: none): once their spend together reaches it, the
    # panel's budget check cancels them all (`backend/runs/budget.py`, `SpendWatch.enforce_sweeps`).
    budget_usd: float = 0.0

    def __post_init__(self):
        if not self.sweep_id:
            self.sweep_id = f"sweep-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(3)}"

    def problems(self) -> list[FieldError]:
        """Why this sweep cannot launch, each naming the field at fault; [] when it can."""
        errs = self.field_problems()
        if errs:
            return errs
        if self.base.mode != "distributed":
            return [FieldError("mode", "a sweep's members share one replica fleet: choose the distributed mode")]
        if not self.grid and len({len(v) for v in self.swept.values()}) > 1:
            lengths = ", ".join(f"{name} {len(v)}" for name, v in self.swept.items())
            return [FieldError(next(iter(self.swept)), f"side-by-side lists must be of one length ({lengths}): "
                                                      "give each the same number of values, or sweep a grid")]
        count = math.prod(len(v) for v in self.swept.values()) if self.grid else len(next(iter(self.swept.values())))
        if count > MAX_MEMBERS:
            return [FieldError(next(iter(self.swept)), f"{count} members are more than a fleet serves at once "
                                                      f"({MAX_MEMBERS}): sweep fewer values")]
        if len(self._combinations()) < 2:
            return [FieldError(next(iter(self.swept)), "a sweep needs at least 2 members: give more values")]
        base_errs = self.base.validate()
        if base_errs:
            return base_errs
        if self.budget_usd and not self.base.engine.billed:
            return [FieldError(BUDGET_FIELD, f"runs on {self.base.engine.label} bill nothing, so a sweep there has no "
                                             "spend to cap: leave the sweep's budget cap 0, or run on hf_jobs")]
        if self.early_stop_after and self.base.eval_source == "none":
            return [FieldError(EARLY_STOP_FIELD, "successive halving ranks the members by held-out score: choose a "
                                                 "held-out set (Held-out evaluation), or set 0 to stop by hand")]
        members = self._members()
        errs = [FieldError(e.field, f"member {m.sweep_member} ({_settings_text(self.member_settings(m))}): "
                                    f"{e.message}") for m in members for e in m.validate()]
        return errs or _slot_problems(members, self.swept)

    def field_problems(self) -> list[FieldError]:
        """What is wrong with the swept fields and their values, and the early-stop rule, alone (the base settings
        aside)."""
        k = self.early_stop_after
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_EARLY_STOP_AFTER:
            return [FieldError(EARLY_STOP_FIELD, f"a whole number of held-out versions from 0 (stop by hand only) to "
                                                 f"{MAX_EARLY_STOP_AFTER}, not {k!r:.40}")]
        b = self.budget_usd
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b) or b < 0:
            return [FieldError(BUDGET_FIELD, f"the sweep's budget cap is 0 (none) or a positive amount in USD, e.g. "
                                             f"20; not {b!r:.40}")]
        if not self.swept:
            return [FieldError("sweep", "name one to three fields to sweep, each with its values")]
        if len(self.swept) > MAX_SWEPT_FIELDS:
            return [FieldError("sweep", f"a sweep varies at most {MAX_SWEPT_FIELDS} fields, not {len(self.swept)} "
                                        f"({', '.join(self.swept)})")]
        known, allowed, errs = {f.name: f for f in dataclasses.fields(RunSpec)}, sweepable_fields(), []
        for name, values in self.swept.items():
            if name not in known:
                errs.append(FieldError(name, "is not a RunSpec field"))
            elif name not in allowed:
                why = FLEET_FIELDS.get(name, "it is not a trainer's own setting")
                errs.append(FieldError(name, f"cannot be swept: {why}; sweep one of {', '.join(allowed)}"))
            elif not isinstance(values, list) or not values:
                errs.append(FieldError(name, "give a list of one or more values to sweep"))
            elif len(values) > MAX_MEMBERS:
                errs.append(FieldError(name, f"{len(values)} values make more members than a fleet serves at once "
                                             f"({MAX_MEMBERS}): sweep fewer values"))
            else:
                errs += _value_problems(name, values, known[name].type)
        return errs

    def _combinations(self) -> list[dict]:
        names = list(self.swept)
        if self.grid:
            rows = itertools.product(*(self.swept[n] for n in names))
        else:
            rows = zip(*(self.swept[n] for n in names))
        return [dict(zip(names, row)) for row in rows]

    def _members(self) -> list[RunSpec]:
        base = {k: v for k, v in self.base.to_dict().items() if k not in ("run_id", "created_at")}
        combinations = self._combinations()
        # Where the engine runs one fleet for every member, each member's trainer uses the sweep's (its id names
        # the fleet); elsewhere each member still starts its own replicas.
        fleet = self.sweep_id if self.base.engine.shared_fleet else ""
        ids = self.run_ids if len(self.run_ids) == len(combinations) else ("",) * len(combinations)
        out = []
        for i, (settings, run_id) in enumerate(zip(combinations, ids)):
            tag = f"m{i}"
            out.append(RunSpec.from_dict({**base, **settings, "name": f"{self.base.name[:60]}-{tag}",
                                          "sweep_id": self.sweep_id, "sweep_member": tag, "fleet": fleet,
                                          **({"run_id": run_id} if run_id else {})}))
        return out

    def members(self) -> list[RunSpec]:
        """The member runs, each a whole RunSpec with its own run id; SpecError when the sweep has problems."""
        errs = self.problems()
        if errs:
            raise SpecError(errs)
        return self._members()

    def member_settings(self, member: RunSpec) -> dict:
        """What sets `member` apart: its value of each swept field."""
        return {name: getattr(member, name) for name in self.swept}

    def fingerprint(self, members: list[RunSpec]) -> str:
        """The review code of the whole sweep: every member's settings (`RunSpec.fingerprint`, which holds the sweep
        id and the member's tag), so one review covers every member and any change to one needs a new review."""
        codes = [m.fingerprint() for m in members]
        if self.early_stop_after:      # the stated rule is reviewed too (a sweep without one hashes as before)
            codes.append(f"early_stop_after={self.early_stop_after}")
        if self.budget_usd:            # and the cap (a sweep without one hashes as before)
            codes.append(f"budget_usd={float(self.budget_usd)!r}")
        return hashlib.sha256(json.dumps(codes).encode()).hexdigest()[:10]

    def record(self, members: list[RunSpec]) -> dict:
        """What the bucket keeps of the sweep (`layout.sweep_record_path`): its members by tag, so one cancel finds
        them all, and what was swept."""
        return {"sweep_id": self.sweep_id, "grid": self.grid, "swept": self.swept,
                "fleet": members[0].fleet if members else "",
                "members": {m.sweep_member: m.run_id for m in members},
                "settings": {m.sweep_member: self.member_settings(m) for m in members},
                "early_stop": self.early_stop(), "budget_usd": float(self.budget_usd)}

    def early_stop(self) -> dict:
        """The stated early-stop rule as the record keeps it: successive halving after K versions, or by hand."""
        if self.early_stop_after:
            return {"rule": "successive halving", "after_versions": self.early_stop_after}
        return {"rule": "by hand"}


def parse_budget(value) -> float:
    """The sweep's budget cap from the form or a tool call: a number, or text of one ("20", "$12.50"); empty or None
    is 0 (no cap). Raises SpecError naming BUDGET_FIELD for anything else (a negative or non-finite amount is
    refused by `SweepSpec.field_problems`, which says what would be valid)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return 0.0
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip().removeprefix("$").replace(",", ""))
        except ValueError:
            pass
    raise SpecError([FieldError(BUDGET_FIELD, f"the sweep's budget cap is an amount in USD, e.g. 20 (0: none); "
                                              f"{str(value)[:40]!r} is not a number")])


def parse_swept(rows: list[tuple[str, str]]) -> dict[str, list]:
    """The swept fields from the form's rows (a field's name, its values as text); rows without a field are skipped.
    Values are separated by commas, or by semicolons where a value holds commas itself (reward weights:
    `digits=1,format=0.5; digits=1`). Raises SpecError naming the field: a field named twice, a value left empty."""
    swept: dict[str, list] = {}
    errs = []
    for name, text in rows:
        name, text = (name or "").strip(), (text or "").strip()
        if not name:
            if text:
                errs.append(FieldError("sweep", f"values {text[:60]!r} name no field: pick the field they sweep"))
            continue
        if name in swept:
            errs.append(FieldError(name, "is named twice in the sweep: give all its values on one row"))
            continue
        parts = [part.strip() for part in text.split(";" if ";" in text else ",")]
        if not text:
            errs.append(FieldError(name, "give its values, separated by commas (e.g. 1e-4, 5e-4)"))
        elif any(not part for part in parts):
            errs.append(FieldError(name, f"an empty value in {text[:80]!r}: remove the stray separator"))
        swept[name] = parts
    if errs:
        raise SpecError(errs)
    return swept


def _value_problems(name: str, values: list, tp) -> list[FieldError]:
    try:
        coerced = [_coerce(v, tp) for v in values]
    except (TypeError, ValueError):
        return [FieldError(name, f"every value must be of the field's type ({tp}): {values!r:.200}")]
    seen, dupes = set(), []
    for value in coerced:
        key = _key(value)
        if key in seen:
            dupes.append(value)
        seen.add(key)
    if dupes:
        return [FieldError(name, f"{dupes[0]!r} is given twice: each value makes one member, give each once")]
    return []


def _slot_problems(members: list[RunSpec], swept: dict) -> list[FieldError]:
    slots = sum(max_loras(m.max_staleness) for m in members)
    if slots <= MAX_FLEET_LORA_SLOTS:
        return []
    at = "max_staleness" if "max_staleness" in swept else next(iter(swept))
    return [FieldError(at, f"{len(members)} members need {slots} LoRA slots on each replica (max_staleness + 2 "
                           f"each), more than a fleet holds ({MAX_FLEET_LORA_SLOTS}): sweep fewer values, or lower "
                           "max_staleness")]


def _settings_text(settings: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in settings.items())


@dataclass(frozen=True)
class FleetSize:
    """What the one fleet's replicas are started with for a sweep, and what the preview says about it."""

    max_loras: int          # --max-loras and --max-cpu-loras: every member's (max_staleness + 2) at once
    max_lora_rank: int      # --max-lora-rank: the largest member's rank, rounded to one vLLM accepts
    notes: tuple[str, ...]  # what the preview says (a rank sweep pads its small members)


def fleet_size(members: list[RunSpec]) -> FleetSize:
    """The adapter slots and rank a fleet needs to serve every member at once: each member keeps up to
    max_staleness + 1 versions in use and loads its next before unloading its oldest (TRL's own need, summed)."""
    slots = sum(max_loras(m.max_staleness) for m in members)
    ranks = sorted({m.lora_r for m in members})
    rank = round_lora_rank(ranks[-1])
    notes = []
    if len(ranks) > 1 or ranks[0] != rank:
        small = [m.sweep_member for m in members if round_lora_rank(m.lora_r) < rank]
        if small:
            notes.append(f"vLLM pads every adapter to --max-lora-rank {rank}: member(s) {', '.join(small)} "
                         f"(rank {', '.join(str(r) for r in ranks if round_lora_rank(r) < rank)}) are served at rank "
                         f"{rank}'s cost, so a sweep over the rank slows its small members")
    return FleetSize(slots, rank, tuple(notes))

