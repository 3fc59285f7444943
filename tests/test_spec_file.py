"""spec.json as the jobs read it (`backend/runtime/spec_file.py`) is tied to RunSpec: same keys, same types, same
defaults where a reader assumes one for an older spec.json."""

import ast
import dataclasses
import os
import typing

import pytest

from backend.plan.spec import RunSpec
from backend.runtime import RUNTIME_DIR
from backend.runtime.spec_file import SpecFile, read_spec

pytestmark = pytest.mark.unit

RUN_SPEC_FIELDS = {f.name: f for f in dataclasses.fields(RunSpec)}


def _spec_name(node) -> bool:
    """A value the runtime holds a spec in: a name (or attribute) that says `spec`."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return "spec" in name


def spec_reads(source: str) -> list[tuple[int, str, ast.expr | None]]:
    """(line, key, the default given to `.get`, if any) of every key read from a spec: `spec["k"]`,
    `spec.get("k")`, `spec.get("k", default)`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Subscript) and _spec_name(node.value) and isinstance(node.slice, ast.Constant)
                and isinstance(node.slice.value, str)):
            found.append((node.lineno, node.slice.value, None))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and _spec_name(node.func.value) and node.args and isinstance(node.args[0], ast.Constant)):
            found.append((node.lineno, node.args[0].value, node.args[1] if len(node.args) > 1 else None))
    return found


def _runtime_reads():
    for folder, _, names in sorted(os.walk(RUNTIME_DIR)):
        for name in sorted(n for n in names if n.endswith(".py")):
            where = os.path.relpath(os.path.join(folder, name), os.path.dirname(RUNTIME_DIR))
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                yield from ((f"{where}:{line}", key, default) for line, key, default in spec_reads(f.read()))


def test_the_scan_finds_every_way_of_reading_a_key():
    source = 'def f(spec, self):\n    spec["a"]\n    spec.get("b")\n    self.spec.get("c", 3)\n    other["d"]\n'
    assert [(line, key) for line, key, _ in spec_reads(source)] == [(2, "a"), (3, "b"), (4, "c")]


def test_every_key_is_a_run_spec_field_of_the_same_type():
    declared = typing.get_type_hints(SpecFile)
    fields = typing.get_type_hints(RunSpec)
    assert {k: v for k, v in declared.items() if fields.get(k) != v} == {}


def test_every_key_the_runtime_reads_from_a_spec_is_declared():
    reads = list(_runtime_reads())
    assert len({key for _, key, _ in reads}) >= 50, "the scan found the trainers' reads"
    assert [f"{where}: {key!r}" for where, key, _ in reads if key not in SpecFile.__annotations__] == []


def test_a_default_assumed_for_an_older_spec_json_is_run_specs_own():
    wrong = []
    for where, key, default in _runtime_reads():
        if default is None or not isinstance(default, (ast.Constant, ast.List, ast.Dict, ast.Tuple)):
            continue
        field = RUN_SPEC_FIELDS[key]
        own = field.default_factory() if field.default is dataclasses.MISSING else field.default
        assumed = ast.literal_eval(default)
        if assumed != own and not (assumed in (None, "", [], (), {}) and not own):
            wrong.append(f"{where}: {key} assumed {assumed!r}, RunSpec's default is {own!r}")
    assert wrong == []


def test_read_spec_reads_what_the_panel_writes(tmp_path):
    (tmp_path / "spec.json").write_text(RunSpec(run_id="r1").to_json())
    spec = read_spec(str(tmp_path))
    assert set(SpecFile.__annotations__) <= set(spec) and spec["run_id"] == "r1"
    (tmp_path / "spec.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a JSON object"):
        read_spec(str(tmp_path))
