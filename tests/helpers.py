"""Plain helpers shared by test files (fixtures: tests/conftest.py; browser helpers: tests/browser_helpers.py)."""

import contextlib
import os
import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 free right now (the OS picks it): a test never assumes a fixed port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def files_under(path) -> list[str]:
    """Every file below `path`, as paths."""
    return [os.path.join(d, f) for d, _, files in os.walk(path) for f in files]


def launch_reviewed(panel, form: dict, visitor=None):
    """Preview, then launch exactly what was previewed, as a visitor ticking the review box does. Returns (the launch's
    result, the preview shown)."""
    shown = panel.preview(form, visitor)
    assert shown.fingerprint, shown.markdown
    return panel.launch(form, visitor, confirmed=shown.fingerprint, run_id=shown.run_id), shown


@contextlib.contextmanager
def panel_factory(home: str, **defaults):
    """`make(**settings)` builds a Panel over `home` (a second one is the panel after a restart), off a Space, on
    loopback, with `defaults`; every panel made is shut down at the end."""
    from panel.actions import Panel, Settings

    made = []

    def make(**settings):
        made.append(Panel(Settings(**{"home": home, "on_space": False, "host": "127.0.0.1", **defaults, **settings})))
        return made[-1]

    try:
        yield make
    finally:
        for panel in made:
            panel.shutdown()


@contextlib.contextmanager
def small_tmpfs(folder: str, size: str):
    """`folder` (made here) on a tmpfs of `size` of its own, unmounted on the way out: a full disk for a test (root
    ignores file modes, not a full disk). Skips the test where this machine cannot mount one."""
    import subprocess

    import pytest

    os.makedirs(folder)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", folder], capture_output=True,
                            text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", folder], check=False)


@contextlib.contextmanager
def served(panel):
    """The panel's page on a real Gradio server in this process, and a client of it; both closed at the end."""
    from gradio_client import Client

    from panel.ui import build_ui

    demo = build_ui(panel)
    port = free_port()
    demo.queue().launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                        run_history=False)
    client = None
    try:
        client = Client(f"http://127.0.0.1:{port}", verbose=False)
        client.url = f"http://127.0.0.1:{port}"
        yield client
    finally:
        if client is not None:
            client.close()
        demo.close()
