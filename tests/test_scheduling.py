"""conftest.py's scheduling on pytest-xdist workers: the tests that start vLLM servers or a Ray cluster form one group,
run first and one at a time; a test marked runs_alone runs with no other test beside it; the tests that share a
module-scoped fixture stay together; the rest go anywhere."""

import os
import re
import subprocess
import sys

import pytest
from conftest import ROOT

pytestmark = pytest.mark.unit

# Each test notes when it ran (its name, start, end) in the file named by RAN, sleeping a little.
NOTE = ("import os, time\n\n\ndef note(name):\n    start = time.time()\n    time.sleep(0.5)\n"
        "    with open(os.environ['RAN'], 'a') as f:\n        f.write(f'{name} {start} {time.time()}\\n')\n")
FILES = {
    "ran.py": NOTE,
    "test_faults.py": (
        "import pytest\nfrom ran import note\n\npytestmark = pytest.mark.integration\n\n\n"
        "def test_light():\n    note('light')\n\n\n"
        "@pytest.mark.xdist_group('vllm-servers')\n@pytest.mark.runs_alone\ndef test_a_local_distributed_run():\n"
        "    note('alone')\n"),
    "test_ray_browser.py": ("import pytest\nfrom ran import note\n\npytestmark = pytest.mark.browser\n\n\n"
                            "def test_on_ray():\n    note('ray')\n"),
    "test_proxy.py": (
        "import pytest\nfrom ran import note\n\npytestmark = pytest.mark.integration\n\n\n"
        "@pytest.fixture\ndef vllm_pool():   # a stand-in\n"
        "    return None\n\n\ndef test_without_the_pair():\n    note('no-pair')\n\n\n"
        "def test_with_the_pair(vllm_pool):\n    note('pair')\n"),
    "test_shared.py": (
        "import pytest\nfrom ran import note\n\npytestmark = pytest.mark.unit\n\n\n"
        "@pytest.fixture(scope='module')\ndef made_once():\n    return 1\n\n\n"
        "def test_first(made_once):\n    note('first')\n\n\ndef test_second(made_once):\n    note('second')\n"),
}


def _run(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-c", os.devnull,
                           "--rootdir", str(tmp_path), "-p", "no:cacheprovider", *args, "tests"],
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": f"{ROOT}:{tmp_path / 'tests'}",
                                             "RAN": str(tmp_path / "ran.txt")},
                          capture_output=True, text=True,
                          timeout=600)   # two xdist workers starting: ~10 s quiet, 175 s seen at load 36 on 2 cores


def test_the_vllm_and_ray_tests_are_one_group_that_runs_first_and_a_shared_fixture_keeps_its_tests_together(tmp_path):
    (tmp_path / "tests").mkdir()
    for name, text in FILES.items():
        (tmp_path / "tests" / name).write_text(text)
    (tmp_path / "ran.txt").write_text("")
    run = _run(tmp_path, "-v", "-n", "2", "--dist", "loadgroup", "--no-loadscope-reorder")
    assert run.returncode == 0 and "7 passed" in run.stdout, run.stdout + run.stderr
    ran = re.findall(r"\[(gw\d)\] \[\s*\d+%\] PASSED (\S+)", run.stdout)
    groups = {node.split("::")[1].split("@")[0]: (worker, node.partition("@")[2]) for worker, node in ran}
    vllm = ["test_a_local_distributed_run", "test_on_ray", "test_with_the_pair"]
    assert {groups[name][1] for name in vllm} == {"vllm-servers"}, groups
    assert len({groups[name][0] for name in vllm}) == 1, "one worker runs them all, one at a time"
    assert [node.split("::")[1].split("@")[0] for worker, node in ran if worker == groups[vllm[0]][0]][:3] == vllm, \
        "first, the marked ones first and the session's vLLM pair last"
    assert groups["test_first"][1] == groups["test_second"][1] == "tests/test_shared.py", groups
    assert groups["test_first"][0] == groups["test_second"][0]
    assert groups["test_light"][1] == groups["test_without_the_pair"][1] == "", "free to run on either worker"
    # While the test marked runs_alone ran, no other test did (on 2 workers the light ones would have).
    spans = {name: (float(start), float(end)) for name, start, end in
             (line.split() for line in (tmp_path / "ran.txt").read_text().splitlines())}
    alone = spans.pop("alone")
    assert len(spans) == 6 and all(end <= alone[0] or start >= alone[1] for start, end in spans.values()), spans


def test_a_vllm_test_marked_into_another_group_is_refused_by_name(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_ray_browser.py").write_text(
        "import pytest\n\npytestmark = pytest.mark.browser\n\n\n"
        "@pytest.mark.xdist_group('mine')\ndef test_on_ray():\n    pass\n")
    run = _run(tmp_path, "--collect-only", "-q")
    assert run.returncode != 0
    assert ("tests/test_ray_browser.py::test_on_ray starts vLLM servers or a Ray cluster: mark it "
            "xdist_group('vllm-servers') or none") in run.stdout + run.stderr, run.stdout + run.stderr
