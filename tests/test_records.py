"""The record vocabulary (`backend/runtime/records.py`): every event kind is declared there, writers refuse any other,
and no code names a kind with a bare string."""

import ast
import json
import os
import re

import pytest

from backend.runtime import records
from backend.runtime.layout import EVENTS_DIR, TRAINER_WRITER

pytestmark = pytest.mark.unit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRODUCT = ("app.py", "backend", "panel")
WRITERS = {"write_event": 2, "event_record": 0}    # the writers' kind argument, by position


def _is_event_lookup(node) -> bool:
    """`x["event"]` or `x.get("event")`."""
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "event"
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "event")


def _strings(node) -> list[str]:
    """The string constants `node` is, or holds (a tuple, list or set of them)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for element in node.elts for s in _strings(element)]
    return []


def _function_name(func) -> str:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def bare_kinds(source: str) -> list[tuple[int, str]]:
    """(line, text) of every event kind `source` names with a string literal: `{"event": "x"}`, `event="x"`, a
    writer's kind argument, or a comparison of an event's kind (`e["event"]`, `e.get("event")`, or a name bound to
    one) with a literal."""
    tree = ast.parse(source)
    kind_names = {target.id for node in ast.walk(tree) if isinstance(node, ast.Assign) and _is_event_lookup(node.value)
                  for target in node.targets if isinstance(target, ast.Name)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            found += [(node.lineno, s) for key, value in zip(node.keys, node.values)
                      if isinstance(key, ast.Constant) and key.value == "event" for s in _strings(value)]
        elif isinstance(node, ast.Call):
            found += [(node.lineno, s) for kw in node.keywords if kw.arg == "event" for s in _strings(kw.value)]
            position = WRITERS.get(_function_name(node.func))
            if position is not None and len(node.args) > position:
                found += [(node.lineno, s) for s in _strings(node.args[position])]
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_is_event_lookup(o) or (isinstance(o, ast.Name) and o.id in kind_names) for o in operands):
                found += [(node.lineno, s) for o in operands for s in _strings(o)]
    return sorted(found)


def _product_files():
    for top in PRODUCT:
        path = os.path.join(ROOT, top)
        if os.path.isfile(path):
            yield path
        for folder, _dirs, files in os.walk(path):
            yield from (os.path.join(folder, f) for f in sorted(files) if f.endswith(".py"))


def test_the_scan_finds_every_way_of_naming_a_kind_with_a_bare_string():
    source = '''
def f(e, run_dir):
    write_event(run_dir, "trainer", "started", step=0)
    record = event_record("finished", final="final")
    emit(event="loaded")
    answer = {"event": "scores", "scores": []}
    if e["event"] == "failed" or e.get("event") in ("canceled", "alert"):
        pass
    kind = e.get("event")
    if kind == "done":
        pass
    if e.get("event") == STARTED and e.get("kind") == "ratio":   # a name, and another key: both fine
        pass
'''
    assert bare_kinds(source) == [(3, "started"), (4, "finished"), (5, "loaded"), (6, "scores"), (7, "alert"),
                                  (7, "canceled"), (7, "failed"), (10, "done")]


def test_no_code_names_an_event_kind_with_a_bare_string():
    offenders = []
    for path in _product_files():
        with open(path, encoding="utf-8") as f:
            offenders += [f"{os.path.relpath(path, ROOT)}:{line}: {text!r}" for line, text in bare_kinds(f.read())]
    assert offenders == [], "use the names of backend/runtime/records.py:\n" + "\n".join(offenders)


def _kind_constant(node) -> str | None:
    """The kind a writer's argument names: `records.X` or an imported `X` of the records module."""
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
    value = getattr(records, name, None) if name else None
    return value if isinstance(value, str) and value in records.EVENTS else None


def writes(source: str) -> list[tuple[int, str, set[str], bool]]:
    """(line, kind, its keyword fields, whether it also passes `**fields`) of every writer call of a named kind."""
    found = []
    for node in ast.walk(ast.parse(source)):
        position = WRITERS.get(_function_name(node.func)) if isinstance(node, ast.Call) else None
        if position is not None and len(node.args) > position and _kind_constant(node.args[position]):
            fields = {kw.arg for kw in node.keywords if kw.arg}
            found.append((node.lineno, _kind_constant(node.args[position]), fields,
                          any(kw.arg is None for kw in node.keywords)))
    return found


def test_every_writer_writes_the_fields_its_kind_declares():
    problems, written, named = [], set(), ""
    for path in _product_files():
        with open(path, encoding="utf-8") as f:
            source = f.read()
        if not path.endswith(os.path.join("runtime", "records.py")):
            named += source
        for line, kind, fields, more in writes(source):
            written.add(kind)
            shape, where = records.EVENTS[kind], f"{os.path.relpath(path, ROOT)}:{line}"
            unknown = fields - {*shape.fields, *shape.optional, "time"}
            missing = set() if more else set(shape.fields) - fields
            problems += [f"{where}: a {kind!r} event with {sorted(unknown)}, not in its shape"] if unknown else []
            problems += [f"{where}: a {kind!r} event without {sorted(missing)}"] if missing else []
    assert problems == []
    assert len(written) >= 8, written     # most writers name their kind where they write it
    constants = {name for name in dir(records) if _kind_constant(ast.Name(name))}
    assert {c for c in constants if not re.search(rf"\b{c}\b", named)} == set(), "a kind nobody writes or reads"


def test_every_kind_is_declared_once_with_its_shape():
    assert len(set(records.EVENTS)) == len(records.EVENTS)
    for kind, shape in records.EVENTS.items():
        assert shape.writer in (records.TRAINER_WRITER, records.PANEL_WRITER, records.REPLICA_WRITER), kind
        assert shape.fields and not set(shape.fields) & set(shape.optional), kind
        assert shape.about, kind
    assert set(records.TRAINER_STAGES) <= set(records.EVENTS)
    assert records.CHECK_MESSAGES.isdisjoint({"event"}) and records.TRY_MESSAGES.isdisjoint({"event"})


def test_a_writer_refuses_an_undeclared_kind_and_writes_nothing(tmp_path):
    with pytest.raises(records.UndeclaredKind, match="'tick' is not declared"):
        records.write_event(str(tmp_path), TRAINER_WRITER, "tick", i=1)
    assert not os.path.exists(tmp_path / EVENTS_DIR)


def test_a_declared_event_is_written_dated_and_masked(tmp_path):
    token = "hf_" + "a1b2c3d4e5" * 4
    records.write_event(str(tmp_path), TRAINER_WRITER, records.FAILED, error=f"HTTPError: 401 for {token}")
    (name,) = os.listdir(tmp_path / EVENTS_DIR)
    record = json.loads((tmp_path / EVENTS_DIR / name).read_text())
    assert record["event"] == "failed" and isinstance(record["time"], float)
    assert token not in record["error"] and record["error"].startswith("HTTPError: 401")
    alert = records.event_record(records.ALERT, kind="stall", key="stall", message="no step for 10 minutes")
    assert alert["event"] == "alert" and alert["kind"] == "stall"
    assert records.event_record(records.BUDGET_CAP, time=12.0, reason="r", budget_usd=1.0, spent_usd=1.0,
                                projected_usd=None, cancelled=[])["time"] == 12.0
