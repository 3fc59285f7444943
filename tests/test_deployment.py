"""What the deployment decides before any click: the Space's packages, who gets a token, what the form offers."""

import base64
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest

from backend.runs.access import Deployment, Refused, Visitor, acting_token, local_runs_problem
from panel.actions import Panel
from panel.launch_view import presets_for

pytestmark = pytest.mark.unit

ROOT = __import__("os").path.dirname(__import__("os").path.dirname(__import__("os").path.abspath(__file__)))


def test_the_space_installs_gradio_with_its_oauth_extra():
    # Without it a Space cannot start: Gradio raises "Cannot initialize OAuth" when SPACE_ID is set.
    with open(f"{ROOT}/requirements.txt") as f:
        gradio = next(line for line in f if line.startswith("gradio"))
    assert re.match(r"gradio\[[^\]]*\boauth\b[^\]]*\]==", gradio), gradio


def test_the_space_front_matter_lets_a_token_outlive_the_longest_run():
    with open(f"{ROOT}/README.md") as f:
        front = f.read().split("---")[1]
    minutes = int(re.search(r"hf_oauth_expiration_minutes:\s*(\d+)", front).group(1))
    assert minutes >= 7 * 24 * 60, "a run may time out after 7 days"
    assert "jobs" in front and "hf_oauth: true" in front


def _front_matter() -> dict:
    import yaml

    with open(f"{ROOT}/README.md") as f:
        return yaml.safe_load(f.read().split("---")[1])


def _dockerfile() -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (INSTRUCTION, arguments), comments and blank lines left out."""
    with open(f"{ROOT}/Dockerfile") as f:
        lines = [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def test_the_space_is_built_from_the_dockerfile_and_serves_on_its_port():
    front, steps = _front_matter(), _dockerfile()
    assert front["sdk"] == "docker", "a Gradio-SDK Space never uses the Dockerfile"
    assert not {"sdk_version", "app_file", "python_version"} & set(front), "Gradio-SDK keys mean nothing to Docker"
    env = " ".join(args for op, args in steps if op == "ENV")
    assert f"PORT={front['app_port']}" in env and ("EXPOSE", str(front["app_port"])) in steps
    assert "GRADIO_SERVER_NAME=0.0.0.0" in env, "a Space reaches the app on its container's address, not loopback"
    home = re.search(r"GRPO_PANEL_HOME=(\S+)", env).group(1)
    workdir = next(args for op, args in steps if op == "WORKDIR")
    assert not home.startswith(workdir), "the data lives outside the app folder (the layout test_browser_home runs)"


def test_the_image_runs_as_user_1000_and_installs_the_panel_only():
    steps = _dockerfile()
    ops = [op for op, _ in steps]
    assert any(op == "RUN" and re.search(r"useradd\b.*-u 1000\b", args) for op, args in steps), "Spaces run as 1000"
    user = next(args for op, args in steps if op == "USER")
    assert ops.index("USER") < ops.index("CMD") and user in ("user", "1000")
    installs = [args for op, args in steps if op == "RUN" and "pip install" in args]
    assert installs == [installs[0]] and "-r requirements.txt" in installs[0], installs
    assert "requirements-runtime" not in " ".join(args for _, args in steps), "the image has no training runtime"
    assert ("CMD", '["python", "app.py"]') in steps


def _dockerignored(patterns: list[str], path: str) -> bool:
    """Whether `docker build` leaves `path` (relative to the context) out: the last pattern matching the path or
    a folder above it decides, `!` patterns put back; `*` stays within a name, `**` spans folders."""
    def matches(pattern: str, candidate: str) -> bool:
        regex = re.escape(pattern.strip("/")).replace(r"\*\*/", "(.*/)?").replace(r"\*\*", ".*")
        return re.fullmatch(regex.replace(r"\*", "[^/]*").replace(r"\?", "[^/]"), candidate) is not None

    parts = path.split("/")
    left_out = False
    for pattern in patterns:
        keep = pattern.startswith("!")
        if any(matches(pattern.lstrip("!"), "/".join(parts[:i])) for i in range(1, len(parts) + 1)):
            left_out = not keep
    return left_out


def test_a_local_build_copies_no_data_folder_repository_or_caches_into_the_image():
    with open(f"{ROOT}/.dockerignore") as f:
        patterns = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    for path in ("data/secrets/key", "data/jobs/run--trainer--abc123/job.json", ".git/config",
                 "backend/__pycache__/spec.cpython-311.pyc", ".venv/bin/python", "tests/_artifacts/shot.png",
                 ".pytest_cache/v/cache/lastfailed", ".gpu-stage/wheels/x.whl"):
        assert _dockerignored(patterns, path), f"{path} would be copied into the image"
    for path in ("app.py", "requirements.txt", "backend/runtime/trainer/train.py", "panel/ui.py"):
        assert not _dockerignored(patterns, path), f"{path} is needed in the image"


def test_without_the_local_training_runtime_the_form_opens_on_hf_jobs_and_offers_no_local_runs(tmp_path,
                                                                                              monkeypatch):
    """`docker run` of the image: no torch, TRL or PEFT, so a local preset could never run."""
    import importlib.util

    from panel.presets import PRESETS
    from panel.ui import build_ui

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("torch", "trl", "peft") else real_find_spec(name, *a))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    panel = Panel(Deployment(home=str(tmp_path), on_space=False, host="0.0.0.0"))
    try:
        demo = build_ui(panel)
    finally:
        panel.shutdown()
    props = {c["props"].get("elem_id"): c["props"] for c in demo.config["components"]}
    assert PRESETS[props["preset"]["value"]]["executor"] == "hf_jobs", props["preset"]["value"]
    assert all(PRESETS[name]["executor"] == "hf_jobs" for name, _ in props["preset"]["choices"])
    assert [value for _, value in props["f-executor"]["choices"]] == ["hf_jobs"]
    assert props["f-executor"]["value"] == "hf_jobs"


def test_an_exposed_panel_lends_no_host_token_unless_its_operator_opts_in(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_" + "hostTokenOfTheMachine0000000000")
    home = str(tmp_path)
    assert acting_token(Visitor(), Deployment(home=home, on_space=False, host="127.0.0.1"))
    exposed = Deployment(home=home, on_space=False, host="0.0.0.0")
    assert acting_token(Visitor(), exposed) is None
    assert any("GRPO_PANEL_AUTH" in note for note in exposed.startup_notes())
    assert acting_token(Visitor(), Deployment(home=home, on_space=False, host="0.0.0.0", auth=("ops", "pw")))
    assert acting_token(Visitor(), Deployment(home=home, on_space=False, host="0.0.0.0", allow_host_token=True))


def test_local_runs_on_a_space_are_off_by_default_and_the_form_opens_on_hf_jobs(tmp_path):
    space = Deployment(home=str(tmp_path), on_space=True)
    assert "off on this Space" in local_runs_problem(Visitor("hf_oauth_someoneElse000000000"), space)
    panel = Panel(space)
    try:
        names, first = presets_for(panel)
        from panel.presets import PRESETS

        assert all(PRESETS[n]["executor"] == "hf_jobs" for n in names) and PRESETS[first]["executor"] == "hf_jobs"
    finally:
        panel.shutdown()
    assert local_runs_problem(Visitor(), Deployment(home=str(tmp_path), on_space=False)) is None


def test_a_closed_panel_exits_even_when_a_thread_would_keep_it_alive():
    """After the server closed, a non-daemon thread left busy (by a library, say) does not keep the process up."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = (f"import sys, threading, time; sys.path.insert(0, {root!r}); import app; "
            "threading.Thread(target=time.sleep, args=(600,), name='stuck-worker').start(); "
            "app.exit_within(0.5)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "waiting for threads: stuck-worker" in done.stderr, done.stderr[-2000:]


def test_the_panel_waits_for_its_own_slow_page_where_gradios_check_would_give_up(monkeypatch, free_port):
    """Gradio's launch() exits ("localhost is not accessible") when its own page takes over 3 s to answer, as the
    first render did on a loaded machine; the panel's check waits, and still fails where nothing answers."""
    import http.server
    import threading
    import time

    from gradio import networking

    import app

    class SlowPage(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            time.sleep(4)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), SlowPage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    monkeypatch.setattr(networking, "url_ok", networking.url_ok)   # restored after the test
    try:
        assert not networking.url_ok(url), "Gradio's own check gives up on a page slower than 3 s"
        app.patient_self_check(wait_s=20)
        assert networking.url_ok(url)
        app.patient_self_check(wait_s=1)
        assert not networking.url_ok(f"http://127.0.0.1:{free_port}/"), "a port nothing listens on still fails"
    finally:
        server.shutdown()
        server.server_close()


def test_mcp_callers_are_visitors_by_the_uis_rules_and_a_panel_login_guards_the_tools(tmp_path):
    from panel.mcp_tools import caller

    space = SimpleNamespace(settings=Deployment(home=str(tmp_path), on_space=True))
    own, via_header = "hf_" + "visitorsOwnToken" + "0" * 14, "hf_" + "viaTheSpacesHeader" + "0" * 12   # made up
    assert caller({"authorization": f"Bearer {own}"}, space).token == own, "on a Space, the token's owner"
    assert caller({"x-hf-authorization": f"Bearer {via_header}"}, space).token == via_header, \
        "as clients of private Spaces send it"
    for anonymous in ({}, {"authorization": "Bearer "}, {"authorization": "Basic b3BzOnMzY3JldA=="}):
        with pytest.raises(Refused, match="Bearer"):
            caller(anonymous, space)
    local = SimpleNamespace(settings=Deployment(home=str(tmp_path), on_space=False))
    assert caller({"authorization": "Bearer hf_" + "someoneElse" + "0" * 19}, local).token is None, \
        "a local panel's caller is its UI's visitor: the host's token where lent, never one a caller brings"
    guarded = SimpleNamespace(settings=Deployment(home=str(tmp_path), on_space=False, host="0.0.0.0",
                                                  auth=("ops", "s3cret")))
    good = "Basic " + base64.b64encode(b"ops:s3cret").decode()
    assert caller({"authorization": good}, guarded).token is None
    for wrong in ("", "Basic " + base64.b64encode(b"ops:guess").decode(), "Bearer hf_x", "Basic !!!"):
        with pytest.raises(Refused, match="login"):
            caller({"authorization": wrong}, guarded)


REFUSED_SETTINGS = [
    ({"GRPO_PANEL_MAX_UPLOAD_MB": "lots"}, "GRPO_PANEL_MAX_UPLOAD_MB='lots' is not a positive number"),
    ({"GRPO_PANEL_MAX_UPLOAD_MB": "-5"}, "GRPO_PANEL_MAX_UPLOAD_MB='-5' is not a positive number"),
    ({"GRPO_PANEL_TASK_CHECK_TIMEOUT_S": "0"},
     "GRPO_PANEL_TASK_CHECK_TIMEOUT_S='0' is not a positive number of seconds"),
    ({"GRPO_PANEL_ALLOW_UNSANDBOXED": "1", "GRADIO_SERVER_NAME": "0.0.0.0"},
     "GRPO_PANEL_ALLOW_UNSANDBOXED=1 is refused on a panel listening on 0.0.0.0"),
    ({"GRPO_PANEL_ALLOW_UNSANDBOXED": "1", "SPACE_ID": "acme/panel"},
     "GRPO_PANEL_ALLOW_UNSANDBOXED=1 is refused on a Space"),
    ({"GRPO_PANEL_HUB_LIST_S": "soon"}, "GRPO_PANEL_HUB_LIST_S='soon' is not a positive number of seconds"),
]


def _clean_env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith(("GRPO_PANEL_", "SPACE_", "GRADIO_SERVER"))}


@pytest.mark.parametrize("env, words", REFUSED_SETTINGS)
def test_a_limit_or_protection_the_panel_cannot_honour_is_a_startup_problem(tmp_path, monkeypatch, env, words):
    for name in [k for k in os.environ if k.startswith(("GRPO_PANEL_", "SPACE_", "GRADIO_SERVER"))]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert [p for p in Deployment(home=str(tmp_path)).startup_problems() if words in p]


@pytest.mark.parametrize("env, words", [REFUSED_SETTINGS[0], REFUSED_SETTINGS[4]])
def test_the_panel_refuses_to_start_with_a_limit_or_protection_it_cannot_honour(tmp_path, free_port, env, words):
    """Fail closed at start-up: `python app.py` with an unreadable upload limit, or with the unsandboxed opt-in on a
    panel that serves others, exits 2 with the fix and serves nothing (no port opened, no home written)."""
    home = tmp_path / "home"
    done = subprocess.run([sys.executable, "app.py"], cwd=ROOT, capture_output=True, text=True, timeout=180,
                          env={**_clean_env(), "GRPO_PANEL_HOME": str(home), "GRADIO_SERVER_PORT": str(free_port),
                               **env})
    assert done.returncode == 2, done.stderr[-3000:]
    assert words in done.stderr, done.stderr[-3000:]
    assert "Running on" not in done.stdout + done.stderr
    assert not home.exists() or not any(home.iterdir())


def test_a_positive_upload_limit_and_the_opt_in_on_a_loopback_panel_start(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_PANEL_MAX_UPLOAD_MB", "2.5")
    monkeypatch.setenv("GRPO_PANEL_ALLOW_UNSANDBOXED", "1")
    deployment = Deployment(home=str(tmp_path), on_space=False, host="127.0.0.1")
    assert deployment.startup_problems() == [] and deployment.max_upload_mb == 2.5


@pytest.mark.parametrize("value, seconds", [(None, 15.0), ("4", 4.0), ("0", 15.0), ("soon", 15.0)])
def test_the_task_checks_time_limit_per_reward_call_is_read_from_the_environment(monkeypatch, value, seconds):
    if value is None:
        monkeypatch.delenv("GRPO_PANEL_TASK_CHECK_TIMEOUT_S", raising=False)
    else:
        monkeypatch.setenv("GRPO_PANEL_TASK_CHECK_TIMEOUT_S", value)
    assert Deployment().task_check_timeout_s == seconds
