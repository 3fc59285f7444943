"""A run's own reward code, read without running it: does it parse, which reward functions does it define,
and can TRL call each of them?

TRL calls a reward function with keywords only: `prompts`, `completions`, `completion_ids`, (colocated runs)
`trainer_state`, `log_extra`, `log_metric`, and one keyword per mapped dataset column. So a reward function is
a top-level `def name(completions, **kwargs) -> list[float]` whose other arguments without a default are
among those keywords. Top-level functions whose name starts with "_" are helpers, not rewards.
"""

import ast
import os
import re
from dataclasses import dataclass

from .task import TRL_REWARD_ARGUMENTS

FILENAME = "user_rewards.py"
SIGNATURE = "def my_reward(completions, **kwargs) -> list[float]"


@dataclass(frozen=True)
class CodeProblem:
    line: int | None
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}" if self.line else self.message


def _reward_defs(tree: ast.Module) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and not node.name.startswith("_")]


def reward_function_names(code: str) -> list[str]:
    """The reward functions `code` defines, in order (empty if it does not parse)."""
    try:
        tree = ast.parse(code, filename=FILENAME)
    except SyntaxError:
        return []
    return list(dict.fromkeys(node.name for node in _reward_defs(tree)))


def imported_modules(code: str) -> set[str]:
    """Top-level package names the code imports (e.g. to install `math-verify` for `math_verify`)."""
    try:
        tree = ast.parse(code, filename=FILENAME)
    except SyntaxError:
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def code_problems(code: str, columns: set[str]) -> list[CodeProblem]:
    """Why TRL could not use `code` as reward functions, given the dataset columns mapped to keywords."""
    try:
        tree = ast.parse(code, filename=FILENAME)
    except SyntaxError as exc:
        return [CodeProblem(exc.lineno, f"syntax error: {exc.msg}")]
    defs = _reward_defs(tree)
    if not defs:
        return [CodeProblem(None, f"defines no reward function; write a top-level {SIGNATURE} "
                                  "(functions named _like_this are helpers)")]
    problems, seen = [], set()
    for node in defs:
        if node.name in seen:
            problems.append(CodeProblem(node.lineno, f"{node.name} is defined twice; the second hides the first"))
        seen.add(node.name)
        problems += _signature_problems(node, columns)
    return problems


def _signature_problems(node, columns: set[str]) -> list[CodeProblem]:
    name, args = node.name, node.args
    if isinstance(node, ast.AsyncFunctionDef):
        return [CodeProblem(node.lineno, f"{name} is async; write a plain {SIGNATURE}")]
    if args.posonlyargs:
        return [CodeProblem(node.lineno, f"{name} takes positional-only arguments, but TRL passes every "
                                         f"argument by keyword; write {SIGNATURE}")]
    if args.kwarg is None:
        return [CodeProblem(node.lineno, f"{name} has no **kwargs, but TRL passes more keywords than it names "
                                         f"({', '.join(TRL_REWARD_ARGUMENTS)}, mapped columns); write {SIGNATURE}")]
    passed = set(TRL_REWARD_ARGUMENTS) | columns
    positional = args.args[: len(args.args) - len(args.defaults)]
    keyword_only = [a for a, default in zip(args.kwonlyargs, args.kw_defaults) if default is None]
    unknown = [a.arg for a in [*positional, *keyword_only] if a.arg not in passed]
    if unknown:
        mapped = ", ".join(sorted(columns)) or "none"
        return [CodeProblem(node.lineno, f"{name} needs {', '.join(repr(u) for u in unknown)}, which TRL does not "
                                         f"pass (mapped columns: {mapped}); map a column to it in reward_columns "
                                         "(e.g. solution or solution=answer) or give it a default")]
    return []


_FRAME = re.compile(r'^\s*File "(?P<path>[^"]*)", line (?P<line>\d+), in (?P<name>.+)$')


def code_traceback(text: str) -> tuple[str, int | None] | None:
    """The frames of the run's own code in a formatted traceback (also one carried inside another error's message,
    as TRL's async rollout worker passes it on), the exception they ended in, and the last line number; or None."""
    lines = text.splitlines()
    out, last_line, end = [], None, None
    for i, line in enumerate(lines):
        frame = _FRAME.match(line)
        if not frame or os.path.basename(frame["path"]) != FILENAME:
            continue
        out.append(f'  File "{FILENAME}", line {frame["line"]}, in {frame["name"]}')
        if i + 1 < len(lines) and not _FRAME.match(lines[i + 1]):
            out.append(f"    {lines[i + 1].strip()}")
        last_line, end = int(frame["line"]), i
    if end is None:
        return None
    raised = next((line for line in lines[end + 1:] if line and not line[0].isspace()), "")
    return "\n".join(["Traceback (your code, most recent call last):", *out, raised.strip()]), last_line
