"""The code base passes `ruff check` with the committed ruff.toml (line length, imports, bug-prone patterns)."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ruff_finds_nothing():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_no_panel_function_is_over_120_lines():
    """A UI file is short and declarative: a function of the panel that grows past a screen or two is two."""
    import ast
    import glob

    long = []
    for path in glob.glob(os.path.join(ROOT, "panel", "*.py")):
        with open(path) as f:
            tree = ast.parse(f.read())
        long += [f"{os.path.basename(path)}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
                 for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and node.end_lineno - node.lineno + 1 > 120]
    assert not long, long
