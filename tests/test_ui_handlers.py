"""The page's handlers as plain functions: what a click, a page load or a timer tick answers, without a browser.

A handler answers components by name (`panel.page`); the dashboard's state is the frame's and `live`'s, so what
a session is sent, and when, is read here from the same functions the page calls."""

import os
import sys
from types import SimpleNamespace

import gradio as gr
import pytest

from backend.plan.spec import LORA
from backend.runs.access import Visitor
from backend.runtime import layout
from backend.view import diagnose
from panel import dashboard, dashboard_view, launch_view, live, runs_view, samples_table, tick
from panel.page import Page

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from dashboard_scale import JOBS, SyntheticRun

ANYONE = Visitor()
SHOWN = ("trainer", "", "step", 0.0, "latest", "")   # role, log query, x axis, smoothing, sample step, prompt followed


pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("no_hub_login")]


@pytest.fixture
def run(panel):
    """A live distributed run of 60 steps, three jobs, with samples of nothing yet."""
    return SyntheticRun(panel.settings.home, 60)


def _finish(run) -> None:
    """The trainer writes final/ and says it finished."""
    final = os.path.join(run.run_dir, layout.FINAL_DIR)
    os.makedirs(final, exist_ok=True)
    for name in layout.ADAPTER_FILES:
        with open(os.path.join(final, name), "w") as f:
            f.write("{}")
    run._fragment(run.events, "trainer", run.event_fragment, [{"time": run.t0 + 61, "event": "finished"}])
    run.event_fragment += 1


def _sync_bound(run) -> None:
    """The run's next steps spend most of their time syncing weights: the verdict suggests syncing less often."""
    rows = [{"step": run.step + i, "time": run.t0 + run.step + i, "reward": 0.5, "perf/step_s": 1.0,
             "perf/rollout_wait_s": 0.1, "perf/weight_sync_s": 5.0} for i in range(1, diagnose.WINDOW + 1)]
    run.step += diagnose.WINDOW
    run._fragment(run.metrics, "trainer", run.fragment, rows)
    run.fragment += 1


# ---- one "send only what changed" rule

def test_a_component_is_sent_once_per_key_and_its_value_computed_only_when_sent():
    drawn, asked = {}, []
    parts = {"status": ("d1", "### running"), "log": (("trainer", "", 3), lambda: asked.append(1) or "tail")}
    assert live.send_changed(drawn, parts) == {"status": "### running", "log": "tail"} and asked == [1]
    assert live.send_changed(drawn, parts) == {}, "nothing new, nothing sent"
    assert asked == [1], "an unchanged log is not read again"
    parts["status"] = ("d2", "### finished")
    assert live.send_changed(drawn, parts) == {"status": "### finished"}
    assert live.send_changed(drawn, {"final": (None, None)}) == {"final": None}, "a first None is sent too"


def test_the_frame_holds_the_verdicts_change_the_sample_steps_the_job_roles_and_the_spec(panel, run):
    _sync_bound(run)
    view = panel.view(run.spec.run_id)
    view.refresh()
    frame = dashboard.build_frame(view)
    assert frame.change and frame.change["adapter_every"] > 1, frame.status
    assert frame.roles == sorted(JOBS)
    assert frame.config["run_id"] == run.spec.run_id and frame.config["mode"] == "distributed"
    assert frame.sample_steps == samples_table.sample_steps(view)[:samples_table.SAMPLE_STEPS]
    assert frame.change == diagnose.verdict(view.table.rows(last=diagnose.WINDOW), view.spec).change
    assert set(frame.digests) == set(frame.values)


def test_before_its_spec_is_read_a_frame_has_no_config_so_the_last_one_shown_stays(panel, run):
    os.remove(os.path.join(run.run_dir, layout.SPEC_FILE))
    view = panel.view(run.spec.run_id)
    view.refresh()
    assert not view.spec and "config" not in dashboard.build_frame(view).values


# ---- the open run: what a tick sends

def test_a_tick_sends_only_what_changed_and_the_final_adapter_once_it_is_written(panel, run):
    run_id = run.spec.run_id
    first = dashboard_view.draw(panel, ANYONE, run_id, *SHOWN, None)
    session = first["drawn"]
    assert first["change"] == gr.update(visible=False), "a run with no verdict yet has no change to suggest"
    assert {*dashboard.PLOTS, "status", "cost", "change", "sample_steps", "samples", "config", "final", "roles",
            live.LOG_KEY} <= set(first)
    assert isinstance(first["reward"], gr.components.plot.PlotData)
    assert first["final"] == gr.update(value=None, interactive=False)
    assert first["roles"] == gr.update(choices=sorted(JOBS), value="trainer")
    assert "local runs cost nothing" in first["cost"]
    panel.view(run_id).expire()
    again = dashboard_view.draw(panel, ANYONE, run_id, *SHOWN, session)
    assert set(again) <= {"cost"}, "an unchanged run sends nothing but the time passing (no state either)"
    _finish(run)
    panel.view(run_id).expire()
    finished = dashboard_view.draw(panel, ANYONE, run_id, *SHOWN, session)
    assert finished["final"]["interactive"] and finished["final"]["value"].endswith(".zip")
    assert "final adapter ready" in finished["status"]
    assert "config" not in finished and "roles" not in finished, "the spec and the jobs did not change"
    _sync_bound(run)
    panel.view(run_id).expire()
    assert dashboard_view.draw(panel, ANYONE, run_id, *SHOWN, session)["change"] == gr.update(visible=True)


def test_a_session_that_drew_another_run_or_a_new_log_search_is_sent_it(panel, run):
    run_id = run.spec.run_id
    drawn = dashboard_view.draw(panel, ANYONE, run_id, *SHOWN, None)["drawn"]
    searched = dashboard_view.draw(panel, ANYONE, run_id, "vllm-0", "step", "step", 0.0, "latest", "", drawn)
    assert live.LOG_KEY in searched and "roles" not in searched
    other = dashboard_view.draw(panel, ANYONE, run_id, *SHOWN, {"run_id": "another", "drawn": dict(drawn["drawn"])})
    assert "config" in other and "reward" in other, "a session that drew another run gets everything"


def test_the_roles_picker_keeps_the_picked_job_while_it_exists_and_the_change_button_shows_with_a_change():
    assert dashboard_view.present({"roles": ["trainer", "vllm-0"]}, "vllm-0")["roles"]["value"] == "vllm-0"
    assert dashboard_view.present({"roles": ["trainer"]}, "vllm-3")["roles"]["value"] == "trainer"
    assert dashboard_view.present({"change": {"max_staleness": 2}}, "trainer")["change"] == gr.update(visible=True)
    assert dashboard_view.present({"change": {}}, "trainer")["change"] == gr.update(visible=False)
    assert dashboard_view.present({"sample_steps": [7, 3]}, "trainer")["sample_steps"] == gr.update(
        choices=["latest", 7, 3])


def test_opening_a_run_draws_it_all_on_the_latest_samples_and_unticks_the_resume(panel, run):
    opened = dashboard_view.on_select(panel, ANYONE, run.spec.run_id, "trainer", "", "step", 0.0, "3", "")
    assert opened["resume_confirm"]["value"] is False and opened["resume_reviewed"] is None
    live = opened["cancel"]["visible"]
    assert opened["resume"]["visible"] is opened["resume_confirm"]["visible"] and not (live and
                                                                                      opened["resume"]["visible"])
    assert opened["sample_steps"]["value"] == "latest" and opened["drawn"]["run_id"] == run.spec.run_id
    assert "reward" in opened and opened["push.repo"] == "", "nobody signed in: no repo to suggest"
    assert dashboard_view.on_select(panel, ANYONE, None, *SHOWN) == {
        "resume_confirm": False, "resume_reviewed": None, "drawn": None, "cost": ""}
    unknown = dashboard_view.on_select(panel, ANYONE, "nope", *SHOWN)
    assert unknown["drawn"] is None and "nope" in unknown["status"]


def test_chart_options_without_a_run_change_nothing(panel):
    assert dashboard_view.on_options(panel, ANYONE, None, *SHOWN, None)["drawn"] == gr.skip()
    assert dashboard_view.on_options(panel, ANYONE, "nope", *SHOWN, None)["drawn"] == gr.skip()


def test_the_log_filter_keeps_matching_lines_and_a_tick_without_a_run_lists_the_runs(panel, run):
    panel.view(run.spec.run_id).refresh()
    log = dashboard_view.on_log_filter(panel, ANYONE, run.spec.run_id, "trainer", "STEP 5")[live.LOG_KEY]
    assert log.splitlines() and all(line.startswith("step 5") for line in log.splitlines()), log
    assert dashboard_view.on_log_filter(panel, ANYONE, None, "trainer", "") == {live.LOG_KEY: ""}
    tick = runs_view.on_tick(panel, ANYONE, None, *SHOWN, None, None, "", "all")
    assert tick["runs_table"][0][0] == run.spec.run_id and tick["listed"]["rows"] == tick["runs_table"]
    assert tick["run_pick"] == gr.update(choices=[(run.spec.run_id, run.spec.run_id)]) == tick["compare_picks"]
    assert "drawn" not in tick
    assert runs_view.list_update(panel, ANYONE, "", "all", tick["listed"]) == {}, "an unchanged list is not re-sent"


def _relist(panel) -> None:
    """As once the local runs' listing is older than its interval (5 s): the next tick lists them again."""
    for registry in panel.runs.registries(ANYONE):
        registry._listed = (0.0, registry._listed[1])


def test_the_timer_slows_while_nothing_shown_is_live_and_a_run_started_elsewhere_wakes_it(panel, run):
    """A finished run open, or the form with no live run listed: the timer ticks every IDLE_TICK_S (an idle page's
    ticks are its browser's cost); a live run listed or open, one launched from another tab among them, brings it
    back to TICK_S on the next tick; opening a live run here wakes it at once."""
    run_id = run.spec.run_id
    fast = gr.update(value=tick.TICK_S, active=True)
    slow = gr.update(value=tick.IDLE_TICK_S, active=False)     # the fast timer off: the idle check runs instead
    assert tick.IDLE_TICK_S > tick.TICK_S
    opened = dashboard_view.on_select(panel, ANYONE, run_id, *SHOWN)
    assert opened["timer"] == fast and opened["idle_timer"] == gr.update(active=False), \
        "a live run opened ticks at once at TICK_S, with no idle check"
    session = opened["drawn"]
    live_tick = runs_view.on_tick(panel, ANYONE, run_id, *SHOWN, session, None, "", "all", None, tick.TICK_S)
    assert "timer" not in live_tick, "a live run open: the tick's period stays"
    _finish(run)
    run.complete()
    panel.view(run_id).expire()
    _relist(panel)
    done = runs_view.on_tick(panel, ANYONE, run_id, *SHOWN, session, None, "", "all", None, tick.TICK_S)
    assert done["timer"] == slow and done["idle_timer"] == gr.update(active=True), \
        "the open run finished and none other is live: the fast timer stops, the idle check starts"
    again = runs_view.on_tick(panel, ANYONE, run_id, *SHOWN, session, None, "", "all", None, tick.IDLE_TICK_S)
    assert "timer" not in again, "already slow: nothing sent"
    assert "timer" not in dashboard_view.on_select(panel, ANYONE, run_id, *SHOWN), "a finished run opened: no wake"
    form = runs_view.on_tick(panel, ANYONE, None, *SHOWN, None, None, "", "all", None, tick.TICK_S)
    assert form["timer"] == slow, "the launch form with no live run listed slows too"
    other = SyntheticRun(panel.settings.home, 5)      # launched from another tab: live, unknown to this session
    _relist(panel)
    seen = runs_view.on_tick(panel, ANYONE, run_id, *SHOWN, session, None, "", "all", None, tick.IDLE_TICK_S)
    assert seen["timer"] == fast and seen["runs_table"][0][0] == other.spec.run_id, "listed and ticking fast again"
    assert seen["idle_timer"] == gr.update(active=False), "ticking fast: no idle check"
    hidden = runs_view.on_tick(panel, ANYONE, None, *SHOWN, None, None, run_id, "all", None, tick.IDLE_TICK_S)
    assert hidden["timer"] == fast, "a live run the list's filter hides is still live"


# ---- the runs list

def test_a_run_in_the_address_opens_on_the_runs_tab_if_the_visitor_may_see_it(panel, run):
    def address(**query):
        return SimpleNamespace(query_params=query)

    assert runs_view.on_url(panel, ANYONE, address()) == {"run_pick": gr.skip()}
    opened = runs_view.on_url(panel, ANYONE, address(run=f" {run.spec.run_id} "))
    assert opened["run_pick"] == run.spec.run_id and opened["tabs"].selected == "runs"
    refused = runs_view.on_url(panel, ANYONE, address(run="someone-elses"))
    assert "not one you can open here" in refused["action_msg"] and "run_pick" not in refused


def test_cancel_and_resume_without_a_run_ask_for_one_and_untick(panel):
    assert runs_view.on_cancel(panel, ANYONE, None) == {"action_msg": "Pick a run first."}
    assert runs_view.on_resume(panel, ANYONE, None, True, {"fingerprint": "f", "run_id": "r"}) == {
        "action_msg": "Pick a run first.", "resume_confirm": False, "resume_reviewed": None}


# ---- the launch form

def test_a_refused_field_is_marked_and_its_section_opened_until_a_preview_accepts_it(panel):
    refused = launch_view.on_preview(panel, ANYONE, {"lora_r": 0, "name": "x"}, [])
    assert refused["marks"] == ["lora_r"] and refused["reviewed"] is None and refused["confirm"] is False
    assert refused["form"]["lora_r"] == gr.update(elem_classes=["field-error"])
    assert list(refused["sections"]) == [LORA] and refused["sections"][LORA].open
    fixed = launch_view.on_preview(panel, ANYONE, {"lora_r": 8, "name": "x"}, refused["marks"])
    assert fixed["marks"] == [] and fixed["form"] == {"lora_r": gr.update(elem_classes=[])}
    assert fixed["sections"] == {} and "```bash" in fixed["launch_msg"]


def test_a_preset_fills_every_field_and_says_what_it_is(panel):
    name = next(iter(launch_view.presets_for(panel)[0]))
    answer = launch_view.on_preset(panel, ANYONE, name)
    assert answer["preset_info"] and {"name", "mode", "executor", "model", "lora_r"} <= set(answer["form"])
    assert [a.visible for a in launch_view.on_mode("distributed")] == [False, True]


def test_new_run_from_a_run_fills_the_form_from_its_spec_and_opens_the_launch_tab(panel, run):
    assert launch_view.on_new_run_from(panel, ANYONE, None) == {"action_msg": "Pick a run first."}
    filled = launch_view.on_new_run_from(panel, ANYONE, run.spec.run_id)
    assert filled["form"]["name"] == run.spec.name and filled["form"]["mode"] == "distributed"
    assert filled["launch_msg"].startswith(f"Filled from run `{run.spec.run_id}`")
    assert filled["tabs"].selected == "launch" and filled["reviewed"] is None and filled["sections"] == {}
    _sync_bound(run)
    panel.view(run.spec.run_id).refresh()
    changed = launch_view.on_new_run_with_change(panel, ANYONE, run.spec.run_id)
    assert changed["form"]["adapter_every"] > run.spec.adapter_every and "adapter_every" in changed["launch_msg"]
    opened = [title for title, held in launch_view.SECTIONS.items() if held & {"adapter_every", "max_staleness"}]
    assert list(changed["sections"]) == opened and len(opened) == 2, "the sections holding the changes open"
    assert launch_view.on_new_run_from(panel, ANYONE, "nope")["action_msg"]


def test_a_page_load_offers_the_visitors_runs_and_the_flavors_with_their_prices(panel, run):
    loaded = launch_view.on_load(panel, ANYONE, "local", "local/runs")
    assert loaded["run_pick"]["choices"] == [(run.spec.run_id, run.spec.run_id)]     # (label, value): not renamed
    assert loaded["form.bucket"] == "local/runs"
    assert loaded["form.flavor"]["choices"] and loaded["form.flavor"] == loaded["form.vllm_flavor"]
    assert all("/h" in label for label, _ in loaded["form.flavor"]["choices"])


# ---- the adapter between Gradio and the handlers

def test_a_page_wires_a_plain_handler_under_its_own_name_with_groups_by_member():
    def on_thing(panel, visitor, group, single):
        return {"out": f"{group['a']}{group['b']}{single}{visitor.username}", "group.b": "B", "group": {"zz": 1}}

    with gr.Blocks() as demo:
        page = Page(panel=None)
        page.add(group={"a": gr.Textbox(), "b": gr.Textbox()}, single=gr.Textbox(), out=gr.Markdown(),
                 button=gr.Button())
        page.on(page["button"].click, on_thing, ["group", "single"], ["out", "group.b"])
    dependency = demo.config["dependencies"][0]
    assert dependency["api_name"] == "on_thing" and len(dependency["inputs"]) == 3
    answer = demo.fns[0].fn(None, None, "1", "2", "3")
    assert answer == {page["out"]: "123None", page["group.b"]: "B"}, "a group ignores names it does not show"


def test_a_tick_shows_cancel_while_the_run_lives_and_resume_once_it_stopped_unfinished_sending_each_change_once():
    live_run = SimpleNamespace(stage="RUNNING", current_jobs={}, events=[], spec={})
    drawn: dict = {}
    opened = dashboard_view.run_actions(live_run, drawn)
    assert opened["cancel"]["visible"] is True and opened["resume"]["visible"] is False
    assert opened["cancel_sweep"]["visible"] is False, "a lone run has no sweep to cancel"
    assert dashboard_view.run_actions(live_run, drawn) == {}, "the same actions: nothing sent again"
    live_run.stage = "ERROR"        # it ended, unfinished, while open
    stopped = dashboard_view.run_actions(live_run, drawn)
    assert stopped["cancel"]["visible"] is False and stopped["resume"]["visible"] is True
    assert stopped["resume_confirm"] == gr.update(value=False, visible=True)
    member = SimpleNamespace(stage="COMPLETED", current_jobs={}, events=[], spec={"sweep_id": "sweep-1"})
    assert dashboard_view.run_actions(member)["cancel_sweep"]["visible"] is True, "its neighbours may still run"


def test_picking_ray_fills_a_mount_path_of_the_panels_home_or_none_and_keeps_one_the_user_typed(panel, monkeypatch):
    """No executor's default mount path lands outside the panel's own folders: Ray's is a folder of the panel's home
    for a cluster on this machine, none for a cluster elsewhere; the spec's /bucket stays the other executors'."""
    from panel.launch_view import on_executor
    monkeypatch.setenv("RAY_ADDRESS", "http://127.0.0.1:8265")
    ray = on_executor(panel, ANYONE, "ray", "/bucket")["form.mount_path"]
    assert ray == os.path.join(panel.settings.home, "ray-bucket") and os.path.isdir(ray)
    assert on_executor(panel, ANYONE, "local", ray)["form.mount_path"] == "/bucket", "back to the spec's default"
    assert "form.mount_path" not in on_executor(panel, ANYONE, "ray", "/shared/nfs"), "a typed path is kept"
    monkeypatch.setenv("RAY_ADDRESS", "http://10.1.2.3:8265")
    assert on_executor(panel, ANYONE, "ray", "/bucket")["form.mount_path"] == "", "a remote cluster: yours to name"


def test_an_answer_that_changes_nothing_reaches_gradio_as_skips_not_as_an_error(free_port):
    """Most timer ticks change nothing (no run open, the list as sent): through Gradio's real request handling the
    empty answer must skip every output, for one output, for several, and from a handler that yields."""
    from gradio_client import Client

    def nothing(panel, visitor, text):
        return {} if text == "same" else {"a": f"new {text}", "b": 1}

    def steps(panel, visitor, text):
        yield {}
        yield {"a": text}

    with gr.Blocks() as demo:
        page = Page(None)
        page.add(box=gr.Textbox(), a=gr.Textbox(value="old"), b=gr.Number(value=0), button=gr.Button(),
                 other=gr.Button())
        page.on(page["button"].click, nothing, ["box"], ["a", "b"], api_name="many")
        page.on(page["other"].click, nothing, ["box"], ["a"], api_name="one")
        page.on(page["box"].submit, steps, ["box"], ["a", "b"], api_name="steps")
    demo.queue().launch(server_name="127.0.0.1", server_port=free_port, prevent_thread_lock=True, quiet=True)
    client = None
    try:
        client = Client(f"http://127.0.0.1:{free_port}", verbose=False)
        skip = {"__type__": "update"}      # what Gradio sends for an output left as it is
        assert client.predict("x", api_name="/many") == ("new x", 1)
        assert client.predict("same", api_name="/many") == (skip, skip)
        assert client.predict("same", api_name="/one") == skip
        assert client.predict("z", api_name="/steps") == ("z", skip), "the last answer: a, and b left as it is"
    finally:
        if client is not None:
            client.close()
        demo.close()


def test_the_idle_checks_stamp_changes_when_a_runs_files_or_the_runs_list_change_and_only_then(panel, run):
    """The idle check (panel/tick.py) runs the full update only when the stamp for what the page shows changed: the
    open run's files (a new step, the run's end), the runs list (a run started elsewhere); not for another tick, nor
    for another session asking the same."""
    run_id = run.spec.run_id
    view = panel.view(run_id)

    def stamp(run_id=run_id, visitor=ANYONE) -> str:
        view.expire()       # as once the view's refresh interval has passed
        _relist(panel)
        return tick.stamp(panel, visitor, run_id)

    first = stamp()
    assert stamp() == first == tick.on_stamp(panel, ANYONE, run_id)["tick_stamp"], "nothing written: the same stamp"
    refreshes = view.refreshes
    tick.stamp(panel, ANYONE, run_id)
    tick.stamp(panel, Visitor(), run_id)
    assert view.refreshes == refreshes, "sessions asking within the view's interval share its last read"
    run.grow(3)
    grown = stamp()
    assert grown != first, "a new step written: another stamp"
    assert stamp() == grown
    _finish(run)
    run.complete()
    ended = stamp()
    assert ended != grown, "the run's end written: another stamp"
    form = stamp(None)
    assert form != ended and stamp(None) == form, "no run open: the runs list's stamp, the same while it is"
    SyntheticRun(panel.settings.home, 5)      # launched elsewhere: listed on the next listing
    assert stamp(None) != form and stamp() != ended, "a run started elsewhere: another stamp, run open or not"
    assert stamp("nope") == stamp(None), "a run this visitor does not reach stamps as no run"


def test_each_full_update_sends_the_stamp_of_what_it_drew_so_a_dropped_click_is_clicked_again(panel, run):
    """The idle check compares the panel's stamp with the one the page's last full update drew (`tick_seen`), not
    with the last stamp it asked for: a full update that never ran (its click dropped by Gradio while one was pending)
    leaves the old stamp on the page, and the next check clicks again. A full update sends its stamp only when the page
    does not hold it; one taken before a change sends the new stamp after it."""
    run_id = run.spec.run_id
    view = panel.view(run_id)
    view.expire()
    first = runs_view.on_tick(panel, ANYONE, run_id, *SHOWN, None, None, "", "all", None, tick.TICK_S, None)
    drawn = first["tick_seen"]
    assert drawn == tick.stamp(panel, ANYONE, run_id), "the first full update sends the stamp of what it drew"
    view.expire()
    again = runs_view.on_tick(panel, ANYONE, run_id, *SHOWN, first.get("drawn"), None, "", "all", None, tick.TICK_S,
                              drawn)
    assert "tick_seen" not in again, "nothing changed: the page holds the stamp already"
    run.grow(3)
    view.expire()
    _relist(panel)
    assert tick.stamp(panel, ANYONE, run_id) != drawn, "a step written: the check's stamp differs from the page's"
    grown = runs_view.on_tick(panel, ANYONE, run_id, *SHOWN, first.get("drawn"), None, "", "all", None, tick.TICK_S,
                              drawn)
    assert grown["tick_seen"] == tick.stamp(panel, ANYONE, run_id) != drawn
