"""What the deployment decides before any click: the Space's packages, who gets a token, what the form offers."""

import os
import re
import subprocess
import sys

from backend.access import Deployment, Visitor, acting_token, local_runs_problem
from panel.actions import Panel
from panel.ui import _presets_for

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
        names, first = _presets_for(panel)
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
