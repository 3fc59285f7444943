"""The panel as a Hugging Face Space for an agent: its MCP tools (panel/mcp_tools.py), called by a real MCP client
through Gradio's request handling, on the same kind of Space as test_space_browser.py (tests/space_panel.py); no
browser, so this file is in the integration tier."""

import json
import time

import pytest

from backend.plan.jobspec import LABEL_RUN
from backend.runtime import layout
from panel.mcp_tools import TOOLS
from tests import space_panel
from tests.fakehub import wait_until
from tests.mcp_client import mcp_session
from tests.space_panel import ALICE, CAROL, PLANTED

pytestmark = pytest.mark.integration

hub, space = space_panel.hub, space_panel.space   # this file's fixtures: one Space and its fake Hub for every test


def as_alice(url: str, *calls) -> list:
    return mcp_session(url, list(calls), {"Authorization": f"Bearer {ALICE}"})


def test_an_agents_mcp_tools_are_the_panels_actions_and_no_ui_handler_is_one(space):
    url, _ = space
    names, launch_handler, hidden = mcp_session(url, [("tools/list", {}), ("on_launch", {}), ("on_preview", {})])
    assert sorted(names) == sorted(TOOLS)
    assert "Unknown tool" in launch_handler["error"] and "Unknown tool" in hidden["error"]


def test_anonymous_mcp_callers_of_a_space_get_nothing(space, hub):
    url, _ = space
    before = len(hub.job_posts())
    answers = mcp_session(url, [("list_runs", {}), ("preview_run", {}), ("launch_run", {"review_code": "x"}),
                                ("run_status", {"run_id": "20260101-000000-abcdef"})])
    assert all("Authorization: Bearer" in a.get("error", "") for a in answers), answers
    answers = mcp_session(url, [("list_runs", {})], {"Authorization": "Basic YWxpY2U6cHc="})
    assert "Authorization: Bearer" in answers[0]["error"], "a Space knows visitors by their Hugging Face token only"
    assert len(hub.job_posts()) == before


def test_an_agent_previews_launches_only_with_the_review_code_reads_and_cancels_over_mcp(space, hub):
    url, _ = space
    started = time.monotonic()
    settings = {"max_steps": 7, "name": "mcp-agent-run"}
    preview, unreviewed, wrong = as_alice(url, ("preview_run", {"settings": settings}),
                                          ("launch_run", {"settings": settings}),
                                          ("launch_run", {"settings": settings, "review_code": "0123456789"}))
    assert preview["ok"] and preview["review_code"] and "hf://buckets/alice/grpo-runs" in preview["preview"]
    assert not unreviewed["launched"] and unreviewed["review_code"] == preview["review_code"]
    assert not wrong["launched"] and "changed since the reviewed preview" in wrong["message"]
    assert not any(r.json["labels"].get(LABEL_RUN) == preview["run_id"] for r in hub.job_posts()), \
        "nothing is submitted without the review code"
    [launched] = as_alice(url, ("launch_run", {"settings": settings, "review_code": preview["review_code"],
                                                 "run_id": preview["run_id"]}))
    assert launched["launched"] and launched["run_id"] == preview["run_id"], launched
    run_id = launched["run_id"]
    [trainer] = [job_id for job_id, job in hub.run_jobs.items() if job.spec["labels"].get(LABEL_RUN) == run_id]

    # The trainer logs a step and publishes a version, as a job writes into the bucket.
    hub.set_stage(trainer, "RUNNING")
    run = f"{layout.RUNS_DIR}/{run_id}"
    hub.put_file("alice/grpo-runs", f"{run}/{layout.METRICS_DIR}/trainer-000000.jsonl",
                 json.dumps({"step": 3, "time": time.time(), "reward": 0.625}).encode() + b"\n")
    for name, data in (("adapter_config.json", b"{}"), ("adapter_model.safetensors", b"x" * 64),
                       (layout.ADAPTER_META_FILE, json.dumps({"version": 1, "step": 3}).encode())):
        hub.put_file("alice/grpo-runs", f"{run}/{layout.ADAPTERS_DIR}/trl-policy-v1/{name}", data)
    runs, status, adapters = as_alice(url, ("list_runs", {"query": "mcp-agent"}), ("run_status", {"run_id": run_id}),
                                      ("run_adapters", {"run_id": run_id}))
    assert [r["run"] for r in runs["runs"]] == [run_id] and runs["runs"][0]["name"] == "mcp-agent-run"
    assert status["stage"] == "RUNNING" and status["jobs"]["trainer"]["id"] == trainer
    assert status["latest_metrics"]["reward"] == 0.625 and status["max_steps"] == 7
    assert [(a["name"], a["step"]) for a in adapters["adapters"]] == [("trl-policy-v1", 3)]

    [refused_read, refused_cancel] = mcp_session(url, [("run_status", {"run_id": run_id}),
                                                       ("cancel_run", {"run_id": run_id})],
                                                 {"Authorization": f"Bearer {CAROL}"})
    assert "error" in refused_read and "error" in refused_cancel, "another visitor neither reads nor cancels it"
    assert hub.run_jobs[trainer].stage == "RUNNING"
    [cancelled] = as_alice(url, ("cancel_run", {"run_id": run_id}))
    assert cancelled["cancelled_jobs"] == [trainer]
    wait_until(lambda: hub.run_jobs[trainer].stage == "CANCELED")
    # Hostile settings: what the form does not have, a token typed into a field, someone else's namespace.
    hidden, planted, elsewhere = as_alice(url, ("preview_run", {"settings": {"image": "evil/miner", "run_id": run_id}}),
                                          ("preview_run", {"settings": {"name": PLANTED}}),
                                          ("preview_run", {"settings": {"bucket": "carol/runs"}}))
    assert not hidden["ok"] and hidden["fields_to_fix"] == ["image", "run_id"], hidden
    assert not planted["ok"] and planted["fields_to_fix"] == ["name"] and PLANTED not in json.dumps(planted)
    [foreign] = as_alice(url, ("launch_run", {"settings": {"bucket": "carol/runs"},
                                              "review_code": elsewhere.get("review_code") or "",
                                              "run_id": elsewhere.get("run_id") or ""}))
    assert not foreign.get("launched") and "belong to someone else" in json.dumps([elsewhere, foreign]), foreign
    assert not any(r.json["labels"].get(LABEL_RUN) == elsewhere.get("run_id") for r in hub.job_posts())
    everything = json.dumps([preview, unreviewed, wrong, launched, runs, status, adapters, cancelled])
    assert ALICE not in everything
    print(f"preview, refused launches, launch, reads and cancel over MCP: {time.monotonic() - started:.1f} s")


def test_every_token_shape_is_masked_in_an_agents_run_status(space, hub):
    """run_status over MCP quotes the job's status message, its failure and the run's events: tokens of every shape
    the Hub has issued, planted in each, never come back."""
    from tests.fakehub import TOKEN_SHAPES

    url, _ = space
    settings = {"max_steps": 5, "name": "mcp-shapes-run"}
    [preview] = as_alice(url, ("preview_run", {"settings": settings}))
    [launched] = as_alice(url, ("launch_run", {"settings": settings, "review_code": preview["review_code"],
                                               "run_id": preview["run_id"]}))
    run_id = launched["run_id"]
    [trainer] = [job_id for job_id, job in hub.run_jobs.items() if job.spec["labels"].get(LABEL_RUN) == run_id]
    every = " ".join(TOKEN_SHAPES)
    hub.append_logs(trainer, f"Traceback: token {every}")
    hub.put_file("alice/grpo-runs", f"{layout.RUNS_DIR}/{run_id}/{layout.EVENTS_DIR}/trainer-000000.jsonl",
                 json.dumps({"time": time.time(), "event": "failed", "error": f"OSError: {every}"}).encode() + b"\n")
    hub.put_file("alice/grpo-runs", f"{layout.RUNS_DIR}/{run_id}/{layout.METRICS_DIR}/trainer-000000.jsonl",
                 json.dumps({"step": 1, "time": time.time(), TOKEN_SHAPES[4]: 1.0}).encode() + b"\n")
    hub.set_stage(trainer, "ERROR", message=f"exit code 1 ({every})")
    [status] = as_alice(url, ("run_status", {"run_id": run_id}))
    shown = json.dumps(status)
    assert status["jobs"]["trainer"]["stage"] == "ERROR" and "exit code 1" in shown and "OSError" in shown, shown
    for token in TOKEN_SHAPES:
        assert token not in shown, token


def test_an_agent_previews_launches_ranks_and_cancels_a_sweep_over_mcp(space, hub):
    """A sweep over MCP as on the page: refused shapes name their field and launch nothing, a launch needs the
    review code of exactly this sweep, sweep_status ranks its members, another visitor neither reads nor cancels it,
    cancel_sweep stops every member's trainer, then the fleet."""
    url, _ = space
    settings = {"mode": "distributed", "replicas": 1, "vllm_flavor": "l4x1", "max_steps": 5, "name": "mcp-sweep"}
    swept = {"learning_rate": [0.0001, 0.0005]}
    before = len(hub.job_posts())
    preview, unreviewed, fleet_field, hidden, shapeless, twice = as_alice(
        url, ("preview_sweep", {"swept": swept, "settings": settings}),
        ("launch_sweep", {"swept": swept, "settings": settings}),
        ("preview_sweep", {"swept": {"replicas": [1, 2]}, "settings": settings}),
        ("preview_sweep", {"swept": swept, "settings": {**settings, "image": "evil/miner"}}),
        ("preview_sweep", {"swept": ["learning_rate"], "settings": settings}),
        ("preview_sweep", {"swept": {"learning_rate": [0.0001, 0.0001]}, "settings": settings}))
    assert preview["ok"] and preview["review_code"] and len(preview["run_ids"]) == 2, preview
    assert preview["sweep_id"] in preview["preview"] and all(r in preview["preview"] for r in preview["run_ids"])
    assert not unreviewed["launched"] and unreviewed["review_code"] and not unreviewed["run_ids"], unreviewed
    assert not fleet_field["ok"] and "replicas" in fleet_field["fields_to_fix"], fleet_field
    assert not hidden["ok"] and hidden["fields_to_fix"] == ["image"], hidden
    assert "swept" in shapeless["error"], shapeless      # the tool's input schema (a dict) refuses it first
    assert not twice["ok"] and "learning_rate" in twice["fields_to_fix"], twice
    assert len(hub.job_posts()) == before, "no preview and no unreviewed launch submits a job"

    reviewed = {"swept": swept, "settings": settings, "review_code": preview["review_code"],
                "sweep_id": preview["sweep_id"], "run_ids": preview["run_ids"]}
    [changed] = as_alice(url, ("launch_sweep", {**reviewed, "settings": {**settings, "max_steps": 6}}))
    assert not changed["launched"] and len(hub.job_posts()) == before, changed
    [launched] = as_alice(url, ("launch_sweep", reviewed))
    assert launched["launched"] and launched["run_ids"] == preview["run_ids"], launched
    assert launched["sweep_id"] == preview["sweep_id"]
    posted = [r.json["labels"] for r in hub.job_posts()[before:]]
    assert [(labels[LABEL_RUN], labels["grpo-panel-role"]) for labels in posted] == [
        (preview["sweep_id"], "vllm-0"), *((run_id, "trainer") for run_id in preview["run_ids"])], \
        "one fleet, then each member's trainer"
    swept_runs = {preview["sweep_id"], *preview["run_ids"]}

    [status] = as_alice(url, ("sweep_status", {"run_id": preview["run_ids"][1]}))
    assert status["sweep_id"] == preview["sweep_id"] and status["early_stop_after"] == 0, status
    assert [(row["member"], row["run"]) for row in status["ranking"]] == list(zip(("m0", "m1"), preview["run_ids"]))
    assert "learning_rate=0.0005" in status["ranking"][1]["settings"], status["ranking"]
    refused = mcp_session(url, [("sweep_status", {"run_id": preview["run_ids"][0]}),
                                ("cancel_sweep", {"run_id": preview["run_ids"][0]})],
                          {"Authorization": f"Bearer {CAROL}"})
    assert all("error" in answer for answer in refused), refused
    assert all(job.stage != "CANCELED" for job in hub.run_jobs.values()
               if job.spec["labels"].get(LABEL_RUN) in swept_runs)
    [cancelled] = as_alice(url, ("cancel_sweep", {"run_id": preview["run_ids"][0]}))
    assert cancelled["sweep_id"] == preview["sweep_id"] and cancelled["fleet"]["run_id"] == preview["sweep_id"]
    assert sorted(cancelled["cancelled_jobs"]) == sorted(preview["run_ids"])
    assert all(len(ids) == 1 for ids in cancelled["cancelled_jobs"].values()), cancelled
    assert len(cancelled["fleet"]["cancelled_jobs"]) == 1, cancelled
    wait_until(lambda: all(job.stage == "CANCELED" for job in hub.run_jobs.values()
                           if job.spec["labels"].get(LABEL_RUN) in swept_runs), what="every member and the fleet")
    assert ALICE not in json.dumps([preview, unreviewed, launched, status, cancelled])


def test_an_agent_retrying_launch_sweep_with_the_same_review_code_gets_the_first_sweep_and_nothing_is_cancelled(
        space, hub):
    """The retry of an agent that lost launch_sweep's answer: the same call again answers with the sweep already
    launched (already_launched), submits no job and cancels none; the first sweep's fleet and members run on."""
    url, _ = space
    settings = {"mode": "distributed", "replicas": 1, "vllm_flavor": "l4x1", "max_steps": 5, "name": "mcp-retry"}
    swept = {"learning_rate": [0.0001, 0.0005]}
    [preview] = as_alice(url, ("preview_sweep", {"swept": swept, "settings": settings}))
    assert preview["ok"], preview
    reviewed = {"swept": swept, "settings": settings, "review_code": preview["review_code"],
                "sweep_id": preview["sweep_id"], "run_ids": preview["run_ids"]}
    [first] = as_alice(url, ("launch_sweep", reviewed))
    assert first["launched"] and not first.get("already_launched") and first["run_ids"] == preview["run_ids"], first
    swept_runs = {preview["sweep_id"], *preview["run_ids"]}
    jobs = [job_id for job_id, job in hub.run_jobs.items() if job.spec["labels"].get(LABEL_RUN) in swept_runs]
    assert len(jobs) == 3, jobs                     # the fleet's replica, each member's trainer
    for job_id in jobs:
        hub.set_stage(job_id, "RUNNING")
    posts, cancels = len(hub.job_posts()), [r for r in hub.requests if r.path.endswith("/cancel")]

    [again] = as_alice(url, ("launch_sweep", reviewed))
    assert again["launched"] and again["already_launched"], again
    assert again["sweep_id"] == preview["sweep_id"] and again["run_ids"] == preview["run_ids"], again
    assert "was launched already" in again["message"] and preview["sweep_id"] in again["message"], again
    assert len(hub.job_posts()) == posts, "the retry submits nothing"
    assert [r for r in hub.requests if r.path.endswith("/cancel")] == cancels, "and cancels nothing"
    assert {hub.run_jobs[job_id].stage for job_id in jobs} == {"RUNNING"}, "the first sweep runs on"
    [status] = as_alice(url, ("sweep_status", {"run_id": preview["run_ids"][0]}))
    assert status["sweep_id"] == preview["sweep_id"] and status["fleet"] == preview["sweep_id"], status
    [cancelled] = as_alice(url, ("cancel_sweep", {"run_id": preview["run_ids"][0]}))
    assert len(cancelled["fleet"]["cancelled_jobs"]) == 1, "one fleet, the first launch's"

