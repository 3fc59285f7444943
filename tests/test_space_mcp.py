"""The panel as a Hugging Face Space for an agent: its MCP tools (panel/mcp_tools.py), called by a real MCP client
through Gradio's request handling, on the same kind of Space as test_space_browser.py (tests/space_panel.py); no
browser, so this file is in the integration tier."""

import json
import time

from backend.plan.jobspec import LABEL_RUN
from backend.runtime import layout
from panel.mcp_tools import TOOLS
from tests import space_panel
from tests.fakehub import wait_until
from tests.mcp_client import mcp_session
from tests.space_panel import ALICE, CAROL, PLANTED

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
