"""Tenants of one Space never cross (issue 46): one run id names one run, each visitor's actions on an id reach their
own run only, and a visitor's uploads are bounded by a quota. The panel runs as a Space process
(tests/space_panel.py) against the loopback fake Hub; visitors come through Gradio's own request path: an MCP client
with their token, and Gradio's HTTP API (gradio_client) with their signed-in session cookie, as the page's buttons
call it. No browser: integration tier."""

import json
import re
import time
import zipfile

import pytest
from huggingface_hub import HfApi, Volume

from backend.plan.jobspec import APP_LABEL_VALUE, LABEL_APP, LABEL_ROLE, LABEL_RUN
from tests import space_panel
from tests.browser_helpers import space_session_cookie
from tests.fakehub import wait_until
from tests.mcp_client import mcp_session
from tests.space_panel import ALICE, BOB, CAROL, CLIENT_SECRET, UPLOAD_QUOTA

pytestmark = pytest.mark.integration
hub, space = space_panel.hub, space_panel.space   # this file's fixtures: one Space and its fake Hub for every test

ADAPTER = {"adapter_config.json": b'{"r": 8, "peft_type": "LORA"}'}


def as_visitor(url: str, token: str, *calls) -> list:
    return mcp_session(url, list(calls), {"Authorization": f"Bearer {token}"})


def finished(hub, bucket: str, run_id: str, weights: bytes, name: str | None = None) -> None:
    """The run's trainer wrote final/ (its own weights) and a step; its name in spec.json where given."""
    folder = f"runs/{run_id}"
    if name is not None:
        spec = json.loads(hub.buckets[bucket].files[f"{folder}/spec.json"].data)
        hub.put_file(bucket, f"{folder}/spec.json", json.dumps({**spec, "name": name}).encode())
    hub.put_file(bucket, f"{folder}/metrics/trainer-000000.jsonl",
                 json.dumps({"step": 1, "time": time.time(), "reward": 0.5}).encode() + b"\n")
    hub.put_file(bucket, f"{folder}/final/adapter_config.json", ADAPTER["adapter_config.json"])
    hub.put_file(bucket, f"{folder}/final/adapter_model.safetensors", weights)


def jobs_of(hub, run_id: str, namespace: str) -> list:
    return [j for j in hub.jobs.values() if j.namespace == namespace and j.spec["labels"].get(LABEL_RUN) == run_id]


def launched_by_mcp(url: str, token: str, settings: dict) -> str:
    [preview] = as_visitor(url, token, ("preview_run", {"settings": settings}))
    assert preview["ok"], preview
    [launched] = as_visitor(url, token, ("launch_run", {"settings": settings, "review_code": preview["review_code"],
                                                        "run_id": preview["run_id"]}))
    assert launched["launched"], launched
    return launched["run_id"]


def twin_on_the_hub(hub, token: str, namespace: str, bucket: str, run_id: str, like_bucket: str) -> str:
    """A run made outside the panel under an id another namespace's run has (as a writer of `namespace` can submit
    any job straight to the Hub, or as a run launched before the panel kept one id per run): a trainer job labelled
    with the id, writing `bucket`, and a spec.json; its job id."""
    api = HfApi(endpoint=hub.url, token=token)
    api.create_bucket(bucket, private=True, exist_ok=True)
    spec = json.loads(hub.buckets[like_bucket].files[f"runs/{run_id}/spec.json"].data)
    hub.put_file(bucket, f"runs/{run_id}/spec.json", json.dumps({**spec, "bucket": bucket}).encode())
    job = api.run_job(
        image="python:3.12", command=["sleep", "3600"], namespace=namespace, flavor="cpu-basic", timeout=600,
        labels={LABEL_APP: APP_LABEL_VALUE, LABEL_RUN: run_id, LABEL_ROLE: "trainer"},
        volumes=[Volume(type="bucket", source=bucket, mount_path="/bucket")])
    return job.id


def page_client(url: str, token: str, username: str):
    """Gradio's HTTP API as the page calls it, signed in with the visitor's session cookie."""
    from gradio_client import Client

    cookie = space_session_cookie(CLIENT_SECRET, token, username, time.time() + 3600)
    return Client(url, verbose=False, headers={"Cookie": f"session={cookie}"})


def endpoint(client, name: str) -> str:
    """The API name of the page's event `name` that takes inputs (the orphan finder's cancel shares the name)."""
    endpoints = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    found = [api for api, info in endpoints.items()
             if re.fullmatch(rf"/{name}(_\d+)?", api) and info.get("parameters")]
    assert len(found) == 1, (name, sorted(endpoints))
    return found[0]


def test_a_reused_run_id_is_refused_and_each_visitors_actions_reach_their_own_run_only(space, hub):
    """Bob launches a private run in his own namespace. Alice (a writer of acme, as Bob is) launches an org run
    under his run's id through MCP: refused, nothing submitted. A run under that id made in acme behind the panel's
    back (jobs straight on the Hub) does not capture Bob's: through MCP and through the page, status, download, push
    and cancel of the id act on each visitor's own run, and every answer says which run it was."""
    url, _ = space
    bob_run = launched_by_mcp(url, BOB, {"max_steps": 7, "name": "bobs-private"})
    assert jobs_of(hub, bob_run, "bob"), "bob's run runs in his own namespace"

    [preview] = as_visitor(url, ALICE, ("preview_run", {"settings": {"bucket": "acme/grpo-runs", "name": "alices"}}))
    posts = len(hub.job_posts())
    [reused] = as_visitor(url, ALICE, ("launch_run", {"settings": {"bucket": "acme/grpo-runs", "name": "alices"},
                                                      "review_code": preview["review_code"], "run_id": bob_run}))
    assert not reused["launched"] and reused["fields_to_fix"] == ["run_id"], reused
    assert "already names a run" in reused["message"] and "Nothing was launched" in reused["message"], reused
    assert len(hub.job_posts()) == posts and not jobs_of(hub, bob_run, "acme"), "nothing was submitted"

    # The same id in acme, made outside the panel: both visitors reach acme, only Bob reaches bob.
    twin = twin_on_the_hub(hub, ALICE, "acme", "acme/grpo-runs", bob_run, like_bucket="bob/grpo-runs")
    [bob_trainer] = [j.id for j in jobs_of(hub, bob_run, "bob")]
    for job_id in (bob_trainer, twin):
        hub.set_stage(job_id, "RUNNING")
    finished(hub, "bob/grpo-runs", bob_run, b"bob's own weights", name="bobs-private")
    finished(hub, "acme/grpo-runs", bob_run, b"the acme twin's weights", name="acme-twin")

    # Once Bob's list shows both runs under the id (his namespace's and acme's), every action must choose.
    wait_until(lambda: len(as_visitor(url, BOB, ("list_runs", {"query": bob_run}))[0]["runs"]) == 2, timeout=60,
               interval=1.0, what="both runs under the id in bob's list")
    bob_status, alice_status = (as_visitor(url, token, ("run_status", {"run_id": bob_run}))[0]
                                for token in (BOB, ALICE))
    assert bob_status["namespace"] == "bob" and bob_status["name"] == "bobs-private", bob_status
    assert bob_status["jobs"]["trainer"]["id"] == bob_trainer
    assert alice_status["namespace"] == "acme" and alice_status["name"] == "acme-twin", alice_status
    assert alice_status["jobs"]["trainer"]["id"] == twin

    # Through the page: status, download and push of the id reach each visitor's own run.
    bob_page, alice_page = page_client(url, BOB, "bob"), page_client(url, ALICE, "alice")
    try:
        for client, weights, namespace in ((bob_page, b"bob's own weights", "bob"),
                                           (alice_page, b"the acme twin's weights", "acme")):
            path, message = client.predict(bob_run, "final", api_name="/on_version")
            with zipfile.ZipFile(path["value"] if isinstance(path, dict) else path) as zipped:
                assert zipped.read("adapter_model.safetensors") == weights, namespace
            assert f"run {bob_run} ({namespace} on Hugging Face Jobs)" in message, message
            repo = f"{'bob' if namespace == 'bob' else 'alice'}/tenant-{namespace}-lora"
            pushed = client.predict(bob_run, repo, True, "final", api_name="/on_push")
            assert pushed.startswith("Pushed the final adapter") and f"({namespace} on Hugging Face Jobs)" in pushed
            assert hub.repos[repo].files["adapter_model.safetensors"] == weights, "pushed another run's adapter"

        cancel = endpoint(alice_page, "on_cancel")
        said = alice_page.predict(bob_run, api_name=cancel)
        assert f"1 job(s) of run {bob_run} (acme on Hugging Face Jobs): {twin}" in said, said
        assert hub.jobs[twin].stage == "CANCELED" and hub.jobs[bob_trainer].stage == "RUNNING", \
            "alice's cancel stopped her run only"
    finally:
        bob_page.close()
        alice_page.close()

    [cancelled] = as_visitor(url, BOB, ("cancel_run", {"run_id": bob_run}))
    assert cancelled["cancelled_jobs"] == [bob_trainer] and cancelled["namespace"] == "bob", cancelled
    assert f"run {bob_run} (bob on Hugging Face Jobs)" in cancelled["message"]
    assert hub.jobs[bob_trainer].stage == "CANCELED"


def upload(url: str, cookie: str, *files: tuple[str, int]):
    """A real multipart POST to Gradio's upload route, as the page's Upload button sends it."""
    import httpx

    return httpx.post(f"{url}/gradio_api/upload", cookies={"session": cookie}, timeout=60,
                      files=[("files", (name, b"x" * size, "application/json")) for name, size in files])


def test_a_visitors_uploads_over_the_quota_are_refused_naming_it_and_nothing_is_kept(space):
    """Each signed-in visitor keeps at most GRPO_PANEL_UPLOAD_QUOTA_FILES files and GRPO_PANEL_UPLOAD_QUOTA_MB in the
    Space's cache: one more file, one more megabyte, or one request storing more files than are left, is refused with
    413 naming the quota, and no byte of it stays on disk; another visitor's quota is their own."""
    url, home = space
    cache = home / "gradio-cache"
    files, megabytes = UPLOAD_QUOTA
    cookies = {name: space_session_cookie(CLIENT_SECRET, token, name, time.time() + 3600)
               for name, token in (("bob", BOB), ("alice", ALICE), ("carol", CAROL))}

    def on_disk(prefix: str) -> list:
        return [p for p in cache.rglob(f"{prefix}*") if p.is_file()]

    for n in range(files):
        taken = upload(url, cookies["bob"], (f"bob-kept-{n}.jsonl", 1000))
        assert taken.status_code == 200, taken.text
    refused = upload(url, cookies["bob"], ("bob-one-too-many.jsonl", 1000))
    assert refused.status_code == 413, (refused.status_code, refused.text)
    assert f"quota is {files} file(s) and {megabytes:g} MB" in refused.text and "you keep 3 file(s)" in refused.text
    assert not on_disk("bob-one-too-many") and len(on_disk("bob-kept-")) == files

    near = int(0.9 * 2**20)     # under the 1 MB a file, over the 2.5 MB a visitor at the third
    for n in range(2):
        assert upload(url, cookies["alice"], (f"alice-big-{n}.jsonl", near)).status_code == 200
    refused = upload(url, cookies["alice"], ("alice-over-bytes.jsonl", near))
    assert refused.status_code == 413 and "2.5 MB" in refused.text, refused.text
    assert not on_disk("alice-over-bytes")

    # Four small files in one request, where the quota leaves three: Gradio stored them; none is kept.
    refused = upload(url, cookies["carol"], *[(f"carol-batch-{n}.jsonl", 100) for n in range(files + 1)])
    assert refused.status_code == 413 and "nothing of this upload was kept" in refused.text, refused.text
    assert not on_disk("carol-batch-"), "a refused upload left files on disk"
    assert upload(url, cookies["carol"], ("carol-after.jsonl", 100)).status_code == 200, "her quota is untouched"
