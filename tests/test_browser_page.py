"""The page at a laptop's size (1440x900) in a real browser: what a newcomer sees first and what a run shows first.

The Launch button is on the first screen, without scrolling; the task check's tables are hidden until a check fills
them. An opened run's header and key charts are on the first screen (the runs list folds away), with a jump bar to
its sections and only the actions its state allows. The run is a synthetic finished run folder in the project's own
format (see test_browser_views.py).
"""

import csv
import io
import json
import os
import re

import pytest

from backend.outcome import try_it
from backend.runtime import layout
from benchmarks.dashboard_scale import SyntheticRun
from panel import notes_view
from tests.browser_helpers import (
    CHROMIUM,
    keep_value,
    open_runs_list,
    pick_run,
    running_panel,
    table_rows,
    tail,
    text_of,
    wait_for_text,
)
from tests.helpers import served

pytestmark = [pytest.mark.browser, pytest.mark.full,
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian chromium is not installed")]

SCREEN = {"width": 1440, "height": 900}


def _finished_run(home: str) -> SyntheticRun:
    """A run that completed at step 30."""
    return SyntheticRun(home, 30).complete()


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    home = tmp_path_factory.mktemp("page-home")
    run = _finished_run(str(home))
    # No Hugging Face login at all (an empty HF_HOME): a local user's panel, as a newcomer has it.
    with running_panel("app.py", {"HF_HOME": str(home / "hf-home")}, home,
                       unset=("SPACE_ID", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")) as url:
        yield url, home, run



@pytest.fixture
def screen(app, browser, request):
    """A fresh page at 1440x900 on the panel, once its form is up (a full-page screenshot left on failure)."""
    url, home, _ = app
    page = browser.new_page(viewport=SCREEN)
    page.goto(url)
    page.locator("#launch-btn").wait_for(state="visible", timeout=60000)
    yield page
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        page.screenshot(path=os.path.join(str(home), f"{request.node.name}.png"), full_page=True)
        print(f"--- panel log tail:\n{tail(os.path.join(str(home), 'app.log'))}")
    page.close()


def box(page, elem_id: str) -> dict | None:
    """The element's box in the viewport (top, bottom), None where it is absent or hidden."""
    return page.evaluate("""(id) => {
        const e = document.getElementById(id);
        if (!e || e.offsetParent === null) return null;
        const r = e.getBoundingClientRect();
        return {top: r.top, bottom: r.bottom};
    }""", elem_id)


def on_first_screen(page, elem_id: str) -> bool:
    shown = box(page, elem_id)
    return shown is not None and shown["bottom"] <= SCREEN["height"] and page.evaluate("() => window.scrollY") == 0


def test_launch_and_the_settings_changed_first_are_on_the_first_screen(screen):
    for elem_id in ("preset", "f-name", "f-model", "f-max_steps", "f-learning_rate", "f-executor", "preview-btn",
                    "launch-btn"):
        assert on_first_screen(screen, elem_id), f"#{elem_id} at {box(screen, elem_id)}, below 900 px"
    labels = screen.locator("#f-executor label").all_inner_texts()
    assert [label.strip() for label in labels] == ["This machine", "Hugging Face Jobs"], labels
    values = screen.locator("#f-executor input").evaluate_all("(els) => els.map(e => e.value)")
    assert values == ["local", "hf_jobs"], "the words are labels; the spec keeps the executor's name"


def test_the_task_checks_tables_show_only_once_a_check_fills_them(screen):
    for elem_id in ("task-scores", "task-rows", "task-prompt"):
        assert box(screen, elem_id) is None, f"#{elem_id} shows before any check"
    screen.locator("#check-task-btn").click()
    screen.locator("#task-rows").wait_for(state="visible", timeout=120000)
    assert "prompt" in screen.locator("#task-rows").inner_text(), "the dataset's first rows, with their columns"


def test_an_opened_run_shows_its_header_and_key_charts_on_the_first_screen_with_the_actions_it_allows(app, screen):
    _, _, run = app
    pick_run(screen, run.spec.run_id)
    screen.wait_for_function("() => !!document.querySelector('#reward-plot .js-plotly-plot .main-svg')",
                             timeout=30000)
    screen.evaluate("() => window.scrollTo(0, 0)")
    assert "COMPLETED" in text_of(screen, "run-status")
    for elem_id in ("run-status", "jump-bar", "reward-plot", "heldout-plot"):
        assert on_first_screen(screen, elem_id), f"#{elem_id} at {box(screen, elem_id)}, below 900 px"
    assert box(screen, "runs-table") is None, "the runs list folds away once a run is open"
    assert box(screen, "cancel-btn") is None and box(screen, "resume-btn") is None, "a completed run: no actions"
    links = screen.locator("#jump-bar a").evaluate_all("(els) => els.map(e => e.getAttribute('href'))")
    assert all(screen.locator(href).count() == 1 for href in links) and len(links) >= 5, links
    screen.locator("#jump-bar a", has_text="Log").click()
    screen.wait_for_function("() => window.scrollY > 900", timeout=30000)
    bar = screen.evaluate("() => document.getElementById('jump-bar').getBoundingClientRect().toJSON()")  # fixed: no
    log_box = box(screen, "log-box")                                                         # offsetParent
    assert screen.locator("#jump-bar").is_visible() and bar["height"] > 0, bar
    assert 0 <= bar["top"] and bar["bottom"] <= SCREEN["height"], f"jump bar at {bar}: scrolled off"
    assert log_box["top"] >= bar["bottom"] - 1, f"the section ({log_box}) starts below the bar ({bar}), not under it"
    open_runs_list(screen)
    wait_for_text(screen, "runs-table", re.escape(run.spec.run_id))


# Characters no font on the machine draws come out as the same empty box (.notdef) as a private-use character.
UNDRAWN = """([chars, family]) => {
    const canvas = document.createElement('canvas');
    canvas.width = 48; canvas.height = 48;
    const g = canvas.getContext('2d');
    const draw = (ch) => {
        g.clearRect(0, 0, 48, 48); g.font = `28px ${family}`; g.fillText(ch, 4, 36);
        return g.getImageData(0, 0, 48, 48).data.join(',');
    };
    const box = draw('\\uE000');
    return chars.filter((ch) => draw(ch) === box);
}"""


def undrawn(page, elem_id: str) -> list[str]:
    """The characters of the element's text that the page's fonts cannot draw (empty boxes on the screen)."""
    chars = sorted({c for c in text_of(page, elem_id) if ord(c) > 0x7F})
    family = page.evaluate("(id) => getComputedStyle(document.getElementById(id)).fontFamily", elem_id)
    return page.evaluate(UNDRAWN, [chars, family])


def test_status_badges_read_in_words_with_symbols_the_pages_fonts_draw(app, screen):
    _, _, run = app
    pick_run(screen, run.spec.run_id)
    open_runs_list(screen)
    row = wait_for_text(screen, "runs-table", re.escape(run.spec.run_id))
    assert "✓ completed" in row, row
    emoji = ["\U0001F7E2", "\u2705"]
    assert screen.evaluate(UNDRAWN, [emoji, "sans-serif"]) == emoji, "the check sees an emoji as a box"
    for elem_id in ("runs-table", "run-status"):
        assert undrawn(screen, elem_id) == [], f"#{elem_id} draws empty boxes"


def test_a_phone_shows_each_charts_title_and_no_toolbar_over_it(app, browser):
    url, _, run = app
    page = browser.new_page(viewport={"width": 390, "height": 844})
    try:
        page.goto(url)
        page.locator("#launch-btn").wait_for(state="visible", timeout=60000)
        pick_run(page, run.spec.run_id)
        for elem_id in ("reward-plot", "heldout-plot"):
            page.wait_for_function("(id) => !!document.querySelector(`#${id} .js-plotly-plot .gtitle`)", arg=elem_id,
                                   timeout=30000)
            page.locator(f"#{elem_id} .js-plotly-plot").hover()
            # Below 640 px the toolbar is not shown at all (it covered the charts there: issue 45); the title is.
            page.wait_for_timeout(500)
            shown = page.evaluate("""(id) => {
                const plot = document.getElementById(id);
                const bar = plot.querySelector('.modebar-container');
                const title = plot.querySelector('.gtitle').getBoundingClientRect();
                return {bar: !!bar && getComputedStyle(bar).display !== 'none', title: title.width > 0};
            }""", elem_id)
            assert shown == {"bar": False, "title": True}, f"#{elem_id}: {shown}"
    finally:
        page.close()


def _brightness(png: bytes) -> float:
    """The mean brightness of an image, 0 (black) to 1 (white)."""
    from PIL import Image, ImageStat

    return ImageStat.Stat(Image.open(io.BytesIO(png)).convert("L")).mean[0] / 255


@pytest.mark.parametrize("theme", ["dark", "light"])
def test_charts_follow_the_pages_theme(app, browser, theme):
    url, _, run = app
    page = browser.new_page(viewport=SCREEN)
    try:
        page.goto(f"{url}/?__theme={theme}")
        page.locator("#launch-btn").wait_for(state="visible", timeout=60000)
        pick_run(page, run.spec.run_id)
        page.wait_for_function("() => !!document.querySelector('#reward-plot .js-plotly-plot .main-svg')",
                               timeout=30000)
        page.wait_for_timeout(500)      # plotly's last paint
        shade = _brightness(page.locator("#reward-plot").screenshot())
        assert (shade < 0.35) if theme == "dark" else (shade > 0.8), f"{theme} page, chart brightness {shade:.2f}"
    finally:
        page.close()


def _bucket_steps(run: SyntheticRun) -> dict[int, dict]:
    """The run's logged steps as its trainer wrote them to the bucket, by step."""
    steps = {}
    for name in sorted(n for n in os.listdir(run.metrics) if n.startswith("trainer-")):
        with open(os.path.join(run.metrics, name)) as f:
            for line in f:
                row = json.loads(line)
                if "step" in row:
                    steps[row["step"]] = row
    return steps


def test_a_runs_metrics_download_as_a_csv_whose_rows_are_the_buckets(app, screen):
    _, _, run = app
    pick_run(screen, run.spec.run_id)
    with screen.expect_download(timeout=30000) as download:
        screen.locator("#metrics-btn").click()
    with open(download.value.path(), newline="") as f:
        rows = list(csv.DictReader(f))
    wanted = _bucket_steps(run)
    assert [int(r["step"]) for r in rows] == sorted(wanted) and len(rows) == 30
    for row in rows:
        logged = wanted[int(row["step"])]
        assert {key: float(row[key]) for key in ("reward", "kl", "ratio", "time")} == \
            pytest.approx({key: logged[key] for key in ("reward", "kl", "ratio", "time")})


def test_a_tag_set_in_the_page_is_saved_in_the_runs_folder_and_filters_the_list(app, screen):
    _, _, run = app
    run_id = run.spec.run_id
    pick_run(screen, run_id)
    screen.locator("#jump-bar a", has_text="Notes").click()
    screen.locator("#notes-section").get_by_text(notes_view.SECTION, exact=True).click()
    screen.locator("#notes-tags textarea, #notes-tags input").first.fill("baseline, #lr-sweep baseline")
    screen.locator("#notes-text textarea").fill("reward flat after step 20")
    screen.locator("#notes-save").click()
    wait_for_text(screen, "notes-msg", "Notes saved")
    with open(os.path.join(run.run_dir, "notes.json")) as f:
        saved = json.load(f)
    assert saved["tags"] == ["baseline", "lr-sweep"] and saved["text"] == "reward flat after step 20", saved
    open_runs_list(screen)
    wait_for_text(screen, "runs-table", "#baseline #lr-sweep")
    query = screen.locator("#runs-query textarea, #runs-query input").first
    for typed, listed in (("lr-sweep", True), ("#baseline", True), ("ablation", False)):
        query.fill(typed)
        query.press("Enter")
        if listed:
            wait_for_text(screen, "runs-table", re.escape(run_id))
        else:
            screen.wait_for_function("(id) => !document.getElementById('runs-table').innerText.includes(id)",
                                     arg=run_id, timeout=30000)
    screen.reload()     # kept in the run's folder: a new page (the run in its address) shows them
    wait_for_text(screen, "run-status", re.escape(run_id), 60000)
    screen.locator("#notes-section").get_by_text(notes_view.SECTION, exact=True).click()
    screen.wait_for_function("() => document.querySelector('#notes-text textarea')?.value.includes('flat')",
                             timeout=30000)


X_AXIS_OF = """(id) => {
    const gd = document.querySelector(`#${id} .js-plotly-plot`);
    const axis = gd && gd.layout && gd.layout.xaxis;
    return axis ? {auto: axis.autorange === true, range: axis.range ? axis.range.slice() : null,
                   kind: gd.layout.meta && gd.layout.meta.x_axis} : null;
}"""


def x_axis(page, elem_id: str) -> dict | None:
    """The x axis of the chart `#elem_id` as plotly holds it now: autoranged or not, its range, its kind."""
    return page.evaluate(X_AXIS_OF, elem_id)


def wait_for_x_axis(page, elem_id: str, test: str, timeout_ms: int = 30000) -> dict:
    """The chart's x axis once the JS expression `test` (over `axis`, as `x_axis` returns it) holds."""
    page.wait_for_function(f"(id) => {{ const axis = ({X_AXIS_OF})(id); return !!axis && ({test}); }}", arg=elem_id,
                           timeout=timeout_ms)
    return x_axis(page, elem_id)


def test_a_zoom_on_one_chart_zooms_the_runs_charts_on_that_axis_and_a_reset_on_another_resets_them(app, screen):
    _, _, run = app
    pick_run(screen, run.spec.run_id)
    steps = ("reward-plot", "heldout-plot", "kl-plot", "lr-plot")      # all on the step axis
    for elem_id in (*steps, "util-plot"):
        wait_for_x_axis(screen, elem_id, "axis.auto")
    assert x_axis(screen, "util-plot")["kind"] == "time", "resource charts keep wall time on the step axis"
    drag = screen.locator("#reward-plot .nsewdrag").first.bounding_box()
    y = drag["y"] + drag["height"] / 2
    screen.mouse.move(drag["x"] + drag["width"] * 0.3, y)
    screen.mouse.down()
    screen.mouse.move(drag["x"] + drag["width"] * 0.45, y, steps=5)
    screen.mouse.move(drag["x"] + drag["width"] * 0.6, y, steps=5)
    screen.mouse.up()
    zoomed = wait_for_x_axis(screen, "reward-plot", "!axis.auto")["range"]
    assert 0 < zoomed[0] < zoomed[1] < 30 and zoomed[1] - zoomed[0] < 20, zoomed
    for elem_id in steps[1:]:
        got = wait_for_x_axis(screen, elem_id, "!axis.auto")["range"]
        assert got == pytest.approx(zoomed), f"#{elem_id}'s x range {got}, not the zoomed chart's {zoomed}"
    assert x_axis(screen, "util-plot")["auto"], "a chart on another kind of x axis keeps its own range"
    screen.locator("#kl-plot").scroll_into_view_if_needed()
    screen.locator("#kl-plot .nsewdrag").first.dblclick()
    for elem_id in steps:
        wait_for_x_axis(screen, elem_id, "axis.auto")


def _sync_bound_run(home: str, live: bool = False) -> SyntheticRun:
    """A distributed run whose last 20 steps spend most of their time syncing weights (sync-bound): completed, or
    `live` (its jobs stand for this test process, as SyntheticRun's do) with its engine line and an importance ratio
    off 1 (the panel raises its alert)."""
    run = SyntheticRun(home, 50 if live else 40)
    sync_s = 0.9 * run.spec.adapter_every
    rows = [{"step": step, "time": run.t0 + step, "reward": 0.5, "perf/step_s": 1.0, "step_time": 1.0,
             "perf/rollout_wait_s": 0.1, "perf/weight_sync_s": sync_s, "weight_sync_s": sync_s,
             **({"ratio": 1.05} if live else {})} for step in range(run.step + 1, run.step + 21)]
    run._fragment(run.metrics, "trainer", run.fragment, rows)       # the trainer's next fragment
    if not live:
        return run.complete()
    run._fragment(run.events, "trainer", 0, [{"time": run.t0, "event": "engine", "replicas": 2, "healthy": 2,
                                              "engine": "vLLM replicas behind the LoRA-aware proxy (2/2 healthy at "
                                                        "start, adapter-only sync)"}])
    return run


def test_a_sync_bound_runs_sync_chart_stands_beside_its_key_charts_on_the_first_screen(app, screen):
    _, home, finished = app
    run = _sync_bound_run(str(home))
    pick_run(screen, run.spec.run_id)
    wait_for_text(screen, "run-status", "Bottleneck:.*Sync-bound")
    screen.wait_for_function("() => !!document.querySelector('#bottleneck-plot .js-plotly-plot .gtitle')",
                             timeout=30000)
    screen.evaluate("() => window.scrollTo(0, 0)")
    title = screen.locator("#bottleneck-plot .gtitle").text_content()     # an SVG text
    assert title.startswith("Bottleneck: Weight sync"), title
    for elem_id in ("reward-plot", "heldout-plot", "bottleneck-plot"):
        assert on_first_screen(screen, elem_id), f"#{elem_id} at {box(screen, elem_id)}, below 900 px"
    rows = {box(screen, elem_id)["top"] for elem_id in ("reward-plot", "heldout-plot", "bottleneck-plot")}
    assert len(rows) == 1, f"the bottleneck's chart is not in the key charts' row: tops {rows}"
    open_runs_list(screen)                      # folded away once a run opened
    pick_run(screen, finished.spec.run_id)      # no verdict (too few timed steps): the key charts alone
    screen.locator("#bottleneck-plot").wait_for(state="hidden", timeout=30000)


def test_a_live_runs_key_charts_stay_on_the_first_screen_below_an_engine_line_an_alert_and_a_verdict(app, screen):
    _, home, _ = app
    run = _sync_bound_run(str(home), live=True)
    pick_run(screen, run.spec.run_id)
    status = wait_for_text(screen, "run-status", "Alert:.*ratio")
    assert all(words in status for words in ("RUNNING", "Generation engine:", "Bottleneck:")), status
    screen.wait_for_function("() => !!document.querySelector('#bottleneck-plot .js-plotly-plot .gtitle')",
                             timeout=30000)
    screen.evaluate("() => window.scrollTo(0, 0)")
    for elem_id in ("run-status", "reward-plot", "heldout-plot", "bottleneck-plot"):
        assert on_first_screen(screen, elem_id), f"#{elem_id} at {box(screen, elem_id)}, below 900 px"
    assert box(screen, "cancel-btn") is not None, "a live run can be cancelled"


def test_a_local_user_without_a_hub_token_sees_their_runs_and_no_token_notice(app, screen):
    _, _, run = app
    screen.get_by_role("tab", name="Runs").click()
    wait_for_text(screen, "runs-table", re.escape(run.spec.run_id))
    screen.wait_for_timeout(2500)       # a tick or more: the hint is sent with the list
    page_text = screen.evaluate("() => document.body.innerText")
    assert "token" not in page_text.lower(), "a local run needs no Hugging Face token: no notice about one"


def test_a_runs_held_out_scores_download_as_a_csv_whose_rows_are_its_evaluation_records(app, screen):
    _, home, _ = app
    run = SyntheticRun(str(home), 60, evals=True).complete()
    records = []
    for name in sorted(os.listdir(run.evals)):
        with open(os.path.join(run.evals, name)) as f:
            records += [json.loads(line) for line in f if line.strip()]
    pick_run(screen, run.spec.run_id)
    screen.locator("#jump-bar a", has_text="Adapters").click()
    with screen.expect_download(timeout=30000) as download:
        screen.locator("#heldout-btn").click()
    with open(download.value.path(), newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(records) >= 3 and rows[0]["adapter"] == "base model", rows[:2]
    by_version = {r["policy_version"]: r for r in records}
    for row in rows:
        record = by_version[int(row["version"])]
        assert int(row["step"]) == record["step"] and float(row["trained_score"]) == pytest.approx(record["score"])
        # The run's rule is the default (the trained score): its held-out score is the trained one.
        assert float(row["held_out_score"]) == pytest.approx(record["score"]) and row["best_by"]
        for name, reward in record["rewards"].items():
            assert float(row[f"{name} mean"]) == pytest.approx(reward["mean"]), (row, name)
    assert sum(row["best"] == "yes" for row in rows) <= 1


def _open_section(page, elem_id: str, title: str) -> None:
    """Open the run's accordion `#elem_id` (its title `title`) unless it is open."""
    page.locator(f"#{elem_id}").scroll_into_view_if_needed()
    page.locator(f"#{elem_id}").get_by_text(title, exact=False).first.click()


def test_a_run_renamed_in_the_page_keeps_the_name_in_its_folder_and_the_list_and_header_show_it(app, screen):
    _, home, _ = app
    run = SyntheticRun(str(home), 33).complete()      # its own run: another test tags the app's
    run_id = run.spec.run_id
    pick_run(screen, run_id)
    screen.locator("#jump-bar a", has_text="Notes").click()
    _open_section(screen, "notes-section", notes_view.SECTION)
    name = screen.locator("#run-name textarea, #run-name input").first
    keep_value(screen, name, "<b>bold</b>", "the run's name")
    screen.locator("#rename-btn").click()
    wait_for_text(screen, "notes-msg", "Not renamed")
    assert "not HTML" in text_of(screen, "notes-msg")
    assert not os.path.exists(os.path.join(run.run_dir, "notes.json")), "a refused name writes nothing"
    keep_value(screen, name, "lr 3e-4 · warm-up 10", "the run's name")
    screen.locator("#rename-btn").click()
    wait_for_text(screen, "notes-msg", "is now called")
    with open(os.path.join(run.run_dir, "notes.json")) as f:
        assert json.load(f)["name"] == "lr 3e-4 · warm-up 10"
    status = wait_for_text(screen, "run-status", re.escape("lr 3e-4 · warm-up 10 · Run " + run_id))
    assert "<b>" not in status
    open_runs_list(screen)
    wait_for_text(screen, "runs-table", re.escape("lr 3e-4 · warm-up 10"))
    [row] = [r for r in table_rows(screen, "runs-table") if r and r[0] == run_id]
    assert row[1] == "lr 3e-4 · warm-up 10", row
    screen.reload()     # kept in the run's folder: a new page (the run in its address) shows it
    wait_for_text(screen, "run-status", re.escape("lr 3e-4 · warm-up 10 · Run " + run_id), 60000)


# The ★ of the best version in the adapters table, where the page draws it: its box, and the right edges of the
# table and the window it must stand within.
STAR_BOX = """() => {
    const table = document.getElementById('adapters-table');
    const walker = document.createTreeWalker(table, NodeFilter.SHOW_TEXT);
    for (let n = walker.nextNode(); n; n = walker.nextNode()) {
        const i = n.textContent.indexOf('\u2605');
        if (i < 0) continue;
        const range = document.createRange();
        range.setStart(n, i); range.setEnd(n, i + 1);
        const r = range.getBoundingClientRect();
        return {left: r.left, right: r.right, table: table.getBoundingClientRect().right, window: window.innerWidth};
    }
    return null;
}"""


def test_the_best_versions_star_is_in_view_in_the_adapters_table_on_a_phone(app, browser):
    url, home, _ = app
    run = SyntheticRun(str(home), 62, evals=True).complete()
    page = browser.new_page(viewport={"width": 390, "height": 844})
    try:
        page.goto(url)
        page.locator("#launch-btn").wait_for(state="visible", timeout=60000)
        pick_run(page, run.spec.run_id)
        page.locator("#jump-bar a", has_text="Adapters").click()
        page.wait_for_function(f"() => ({STAR_BOX})() !== null", timeout=30000)
        star = page.evaluate(STAR_BOX)
        assert 0 <= star["left"] and star["right"] <= min(star["table"], star["window"]), \
            f"the best version's star at {star}: off the table's visible width"
    finally:
        page.close()


def test_try_its_answers_show_every_picked_version_side_by_side_at_1440(panel, browser, monkeypatch, no_hub_login):
    """The page on a Gradio server in this process (its Try it answered by a stand-in for the model worker, as in
    test_best_version): three versions' long answers each get a column within the section's width."""
    def worker(box, scratch, base, adapters, with_base, messages, tokens, state, budget_s=None):
        for label in state.routes:
            state.answers[label] = f"{label}: " + "an answer that goes on about the problem at hand, " * 6
        yield state

    monkeypatch.setattr(try_it, "_run_worker", worker)
    run = SyntheticRun(panel.settings.home, 60, evals=True).complete()
    base = os.path.join(run.run_dir, layout.BASE_MODEL_DIR)
    os.makedirs(base)
    for name, data in (("config.json", b"{}"), ("model.safetensors", b"weights")):
        with open(os.path.join(base, name), "wb") as f:
            f.write(data)
    with served(panel) as client:
        page = browser.new_page(viewport=SCREEN)
        try:
            page.goto(f"{client.url}/?run={run.spec.run_id}")
            wait_for_text(page, "run-status", "COMPLETED", 60000)
            _open_section(page, "try-section", "Try it: one prompt")
            page.locator("#try-prompt textarea").fill("What is 2+2?")
            page.locator("#try-picks input").first.click()
            page.locator("#try-picks").get_by_text("trl-policy-v1 ·").click()
            page.keyboard.press("Escape")
            page.locator("#try-btn").click()
            wait_for_text(page, "try-msg", "done", 60000)
            page.locator("#try-answers").scroll_into_view_if_needed()
            heads = page.evaluate("""() => {
                const t = document.getElementById('try-answers').getBoundingClientRect();
                return Array.from(document.querySelectorAll('#try-answers [role=columnheader]')).map((c) => {
                    const r = c.getBoundingClientRect();
                    return {text: c.innerText.trim(), left: r.left, right: r.right, table: t.right,
                            window: window.innerWidth};
                });
            }""")
        finally:
            page.close()
    assert [h["text"] for h in heads][1:] == ["base model", "best", "trl-policy-v1"], heads
    for head in heads:
        assert 0 <= head["left"] and head["right"] <= min(head["table"], head["window"]) + 1, \
            f"column {head['text']!r} at {head}: cut off"


# Each header cell of the adapters table: its text and right edge, and the window's width.
HEADER_EDGES = """() => {
    const cells = [...document.querySelectorAll('#adapters-table thead th')];
    return {cells: cells.map(c => [c.innerText.trim(), c.getBoundingClientRect().right]), window: window.innerWidth};
}"""


def test_the_adapters_tables_monitor_columns_are_in_view_at_1440_and_no_chart_toolbar_covers_a_chart_at_390(app,
                                                                                                     browser):
    url, home, _ = app
    run = SyntheticRun(str(home), 64, evals=True).complete()
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    try:
        page.goto(url)
        page.locator("#launch-btn").wait_for(state="visible", timeout=60000)
        pick_run(page, run.spec.run_id)
        page.locator("#jump-bar a", has_text="Adapters").click()
        page.wait_for_function(f"() => ({HEADER_EDGES})().cells.some(c => c[0].includes('(monitor)'))",
                               timeout=30000)
        seen = page.evaluate(HEADER_EDGES)
        names = [name for name, _ in seen["cells"]]
        assert "note" not in names, f"an empty note column takes the width: {names}"
        monitors = [(name, right) for name, right in seen["cells"] if "(monitor)" in name]
        assert monitors and all(right <= seen["window"] for _, right in monitors), seen
        page.set_viewport_size({"width": 390, "height": 844})
        page.locator("#reward-plot").scroll_into_view_if_needed()
        page.locator("#reward-plot").hover()
        # Plotly draws its toolbar (zoom, pan, download) over the chart's top right corner, shown on hover.
        widths = page.evaluate("() => [...document.querySelectorAll('#reward-plot .modebar')]"
                               ".map(e => e.getBoundingClientRect().width)")
        assert widths and not any(widths), f"plotly's toolbar covers the chart on a phone: {widths}"
    finally:
        page.close()
