"""How a RunSpec field's own declaration is checked, and the errors every validation rule returns.

A field is declared once, TRL style: `field(default=..., metadata={"help": ..., ...})`. The metadata keys:
- `help`: what the field means, shown beside its widget (every field has one);
- `label`, `section`: how the launch form shows it, and in which accordion (no section: placed by hand);
- `choices`: the values a single-choice field takes (a list field's are only offered: custom names are fine);
- `suggestions`: values offered for a field that takes others too (the builtin datasets);
- `widget`: a special widget ("flavor": the Hub's hardware with prices; "code": a Python editor);
- `limits`: a whole number's valid (lowest, highest), None for no highest, shown with the field;
- `group`: a part of a section the form shows together (HELD_OUT_SET, HELD_OUT_EVALUATION), and code reads as one
  (`spec.HELD_OUT_FIELDS`, `spec.HELD_OUT_SETTINGS`);
- `task_check`: True for a field outside the TASK section that the task check reads too (the model: its tokenizer).
`declared_problems` checks `choices` and `limits` for every field, so no rule is written twice; the field groups
(`spec.TASK_FIELDS`, ...) are read from the metadata, so a new field joins its group by its declaration alone.
"""

import dataclasses
from dataclasses import dataclass

# The launch form's sections. A Distributed field is read only by a distributed run: its limits bind only there.
LORA, GRPO, COLOCATED, DISTRIBUTED, STORAGE = (
    "LoRA", "GRPO training", "vLLM (colocated)", "Distributed (async GRPO)", "Hardware and storage")
TASK = "Your task"
# The task section's held-out fields: what is held out, and how it is evaluated
# (runtime/trainer/evaluate.py reads those).
HELD_OUT_SET, HELD_OUT_EVALUATION = "held-out set", "held-out evaluation"


@dataclass(frozen=True)
class FieldError:
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class SpecError(ValueError):
    """A RunSpec did not validate. `errors` lists every problem; str() reads as one message per line."""

    def __init__(self, errors: list[FieldError]):
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


def limits_text(limits: tuple | None) -> str:
    """A whole number's valid range in words: 'between 1 and 512', 'at least 2' ('' without limits)."""
    if not limits:
        return ""
    low, high = limits
    return f"between {low:,} and {high:,}" if high is not None else f"at least {low:,}"


def declared_problems(spec, mode: str) -> list[FieldError]:
    """Every field of `spec` (a RunSpec) outside the choices or limits its declaration gives."""
    errs = []
    for f in dataclasses.fields(spec):
        meta, value = f.metadata, getattr(spec, f.name)
        if meta.get("section") == DISTRIBUTED and mode != "distributed":
            continue
        choices = meta.get("choices")
        if choices and not isinstance(value, list) and value not in choices:
            errs.append(FieldError(f.name, f"must be one of {', '.join(map(str, choices))}"))
        problem = _limits_problem(value, meta.get("limits"))
        if problem:
            errs.append(FieldError(f.name, f"{problem} ({meta['help']})" if meta.get("help") else problem))
    return errs


def _limits_problem(value, limits: tuple | None) -> str | None:
    if not limits:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        return f"enter a whole number {limits_text(limits)}"
    low, high = limits
    if value < low or (high is not None and value > high):
        return f"must be {limits_text(limits)}"
    return None
