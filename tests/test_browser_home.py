"""The panel laid out as its Dockerfile lays it out, in a real browser: the app in one folder, its home (runs, buckets,
the webhook key) in another, neither of them Gradio's working folder or the system's temp dir. Gradio serves only
files under those two (or under `allowed_paths`), so every file the panel hands a visitor must come from a place
it may serve without opening the home itself.

The run is a synthetic finished run folder in the project's own format (see test_browser_views.py).
"""

import io
import os
import re
import zipfile

import pytest

from benchmarks.dashboard_scale import SyntheticRun
from tests.browser_helpers import CHROMIUM, panel_page, running_panel, wait_for_text

pytestmark = [pytest.mark.browser, pytest.mark.full,
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian chromium is not installed")]

ADAPTER_CONFIG = b'{"r": 8, "lora_alpha": 16}'


def _finished_run(home: str) -> SyntheticRun:
    """A run that completed at step 8 with its final adapter in the bucket."""
    run = SyntheticRun(home, 8)
    final = os.path.join(run.run_dir, "final")
    os.makedirs(final)
    for name, data in (("adapter_config.json", ADAPTER_CONFIG), ("adapter_model.safetensors", b"w" * 1024)):
        with open(os.path.join(final, name), "wb") as f:
            f.write(data)
    return run.complete()


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """The panel with its home outside its working folder and outside its temp dir (TMPDIR of its own)."""
    base = tmp_path_factory.mktemp("dockerfile-layout")
    home, system_tmp = base / "data", base / "system-tmp"
    system_tmp.mkdir()
    run = _finished_run(str(home))
    with running_panel("app.py", {"TMPDIR": str(system_tmp)}, home,
                       unset=("SPACE_ID", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "GRADIO_TEMP_DIR")) as url:
        yield url, home, system_tmp, run


@pytest.fixture
def page(app, request):
    url, home, *_ = app
    with panel_page(url, home, request) as page:
        yield page


def test_a_finished_run_opens_and_its_adapter_and_log_download_with_the_home_outside_cwd_and_tmp(app, page):
    url, home, system_tmp, run = app
    run_id = run.spec.run_id
    assert not str(home).startswith(str(system_tmp)) and not str(home).startswith(os.getcwd())
    page.goto(f"{url}/?run={run_id}")
    status = wait_for_text(page, "run-status", re.escape(run_id), 60000)
    assert "Error" not in status.splitlines()[0]
    wait_for_text(page, "runs-table", re.escape(run_id))
    page.wait_for_function("() => { const b = document.querySelector('#final-btn'); "
                           "return b && !b.disabled && !b.querySelector('[disabled]'); }", timeout=30000)
    with page.expect_download(timeout=30000) as download:
        page.locator("#final-btn").click()
    with open(download.value.path(), "rb") as f:
        archive = zipfile.ZipFile(io.BytesIO(f.read()))
    assert archive.read("adapter_config.json") == ADAPTER_CONFIG
    with page.expect_download(timeout=30000) as download:
        page.locator("#log-btn").click()
    with open(download.value.path()) as f:
        assert "step 8/" in f.read()
