"""The Sweep tab in a real browser, over a sweep of synthetic live members (tests/helpers.synthetic_sweep: no
training; each member's jobs a process of its own obeying its stop orders): a member's *Open sweep view* opens it,
the ranking lists the members best first, *Stop this member* on the worst (picked by default) stops it alone, and
the best member's best version downloads in one click.

Starts `python app.py` as a real process on a free port and drives Debian's chromium with Playwright.
"""

import os
import re
import zipfile

import pytest

from tests.browser_helpers import CHROMIUM, panel_page, pick_run, running_panel, table_rows, wait_for_text
from tests.fakehub import wait_until
from tests.helpers import synthetic_sweep

pytestmark = [pytest.mark.browser, pytest.mark.full,
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian chromium is not installed")]
SCORES = {"m0": 0.5, "m1": 0.7, "m2": 0.3}


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    home = tmp_path_factory.mktemp("sweep-view-home")
    with synthetic_sweep(str(home), SCORES) as members, \
            running_panel("app.py", {}, home, unset=("SPACE_ID", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")) as url:
        yield url, home, members


def alive(member) -> bool:
    try:
        with open(f"/proc/{member.pid}/cmdline") as f:
            return "sweep_member_stub" in f.read()
    except OSError:
        return False


def test_the_sweep_view_ranks_the_members_and_stop_the_worst_stops_only_it(app, request, tmp_path):
    url, home, members = app
    with panel_page(url, home, request) as page:
        pick_run(page, members["m0"].run_id)
        page.locator("#open-sweep-btn").click()
        wait_for_text(page, "sweep-note", r"Sweep sweep-\S+: 3 member\(s\), 3 still training", 60000)
        assert "by hand only" in page.locator("#sweep-note").inner_text()
        rows = table_rows(page, "sweep-rank")
        assert [(r[0], r[1], r[7]) for r in rows] == [("1", "m1", "0.700"), ("2", "m0", "0.500"),
                                                       ("3", "m2", "0.300")], rows
        assert [r[2] for r in rows] == [members[t].run_id for t in ("m1", "m0", "m2")]
        picked = page.locator("#sweep-stop-pick input").first
        wait_until(lambda: picked.input_value().startswith("m2 "), timeout=10, what="the worst picked")

        with page.expect_download() as download:
            page.locator("#sweep-best-btn").click()
        path = str(tmp_path / "best.zip")
        download.value.save_as(path)
        with zipfile.ZipFile(path) as z:
            assert "adapter_config.json" in z.namelist()
        assert "Best: m1" in page.locator("#sweep-best-msg").inner_text()

        page.locator("#sweep-stop-btn").click()
        wait_for_text(page, "sweep-stop-msg", re.escape(f"Stopped m2 ({members['m2'].run_id}"), 30000)
        wait_until(lambda: not alive(members["m2"]), timeout=15, what="m2's job stopped")
        assert alive(members["m0"]) and alive(members["m1"]), "the others train on"
        wait_for_text(page, "sweep-note", r"2 still training", 30000)
        # the order is obeyed by m2 itself: "Ordered to stop" until a tick reads the stop its trainer recorded
        wait_for_text(page, "sweep-note", r"Stopped: m2 \(by hand\)", 30000)
        states = {r[1]: r[4] for r in table_rows(page, "sweep-rank")}
        assert states["m0"] == states["m1"] == "running" and states["m2"] != "running", states
