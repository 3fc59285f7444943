"""No token ever reaches a person: every shape the Hub issues, every token the process was given, everywhere."""

import json
import os
import re
import sys

import pytest

from backend.executors.local import LocalExecutor
from backend.plan.jobspec import JobSpec
from backend.runtime import layout, records
from backend.runtime.redact import REDACTED, looks_like_token, redact_record, redact_tokens, remember_secret
from tests.fakehub import TOKEN_SHAPES

pytestmark = pytest.mark.integration

USER = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz01234567"
OAUTH = "hf_oauth_" + "Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg0FeDc"
ORG = "api_org_" + "QwErTyUiOpAsDfGhJkLzXcVbNm"


@pytest.mark.parametrize("text, token", [
    (f"token={USER}", USER),
    (f"Authorization: Bearer {OAUTH}", OAUTH),
    (f"oauth access token {OAUTH} in a message", OAUTH),
    (f"MYVAR_{USER}", USER),                     # glued to a variable name by '_'
    (f"{USER}_x", USER),                         # and followed by one
    (f"export HF_TOKEN='{OAUTH}'", OAUTH),
    (f"legacy {ORG}", ORG),
    ("hf_" + "x" * 34, "hf_" + "x" * 34),        # a body of one letter is still a token
])
def test_every_token_shape_the_hub_issues_is_masked(text, token):
    masked = redact_tokens(text)
    assert token not in masked and REDACTED in masked
    assert looks_like_token(text)


@pytest.mark.parametrize("token", TOKEN_SHAPES)
@pytest.mark.parametrize("around", ["{}", "MYVAR_{}", "{}_x", "Authorization: Bearer {}", "'{}'", "key={}\n"])
def test_every_shape_is_masked_wherever_it_stands_and_refused_when_typed(token, around):
    text = around.format(token)
    masked = redact_tokens(text)
    assert token not in masked and REDACTED in masked, masked
    assert looks_like_token(text)


@pytest.mark.parametrize("token", TOKEN_SHAPES)
def test_a_record_is_masked_in_its_keys_as_well_as_its_values(token):
    record = {token: 1.0, "nested": [{f"rewards/{token}": token}], "step": 3}
    masked = json.dumps(redact_record(record))
    assert token not in masked and masked.count(REDACTED) == 3, masked


@pytest.mark.parametrize("token", TOKEN_SHAPES)
def test_a_token_typed_into_any_field_of_the_form_is_refused_naming_the_field(token):
    from backend.plan.spec import RunSpec

    for field, value in [("name", f"run {token}"), ("dataset", token), ("rewards", ["format", token]),
                         ("reward_weights", {token: 1.0})]:
        errors = RunSpec.from_dict({field: value}).validate()
        refused = [e for e in errors if e.field == field and "looks like a Hugging Face token" in e.message]
        assert refused, (field, errors)
        assert token not in repr(errors)


@pytest.mark.parametrize("text", ["pip install hf_transfer hf_xet", "python -m vllm.entrypoints.openai.api_server",
                                  "--api-key none --api-server-count 1", "openai_api_key", "fastapi_app",
                                  "HF_HUB_ENABLE_HF_TRANSFER=1",
                                  "import huggingface_hub.hf_api", "cached in hf_datasets"])
def test_identifiers_stay_readable(text):
    assert redact_tokens(text) == text and not looks_like_token(text)


def test_a_remembered_secret_of_any_shape_is_masked_everywhere_in_this_process():
    odd = "visitor-secret-" + "9" * 12              # no Hub token shape at all
    assert redact_tokens(f"echo {odd}") == f"echo {odd}"
    remember_secret(odd)
    assert redact_tokens(f"echo {odd}") == f"echo {REDACTED}"
    assert redact_record({"error": [f"failed with {odd}"], "step": 3}) == {"error": [f"failed with {REDACTED}"],
                                                                           "step": 3}


def test_events_written_by_a_job_are_masked_before_they_reach_the_bucket(tmp_path):
    records.write_event(str(tmp_path), "trainer", "failed", error=f"HTTPError: 401 for token {OAUTH}")
    [fragment] = os.listdir(tmp_path / layout.EVENTS_DIR)
    stored = (tmp_path / layout.EVENTS_DIR / fragment).read_text()
    assert OAUTH not in stored and REDACTED in json.loads(stored)["error"]


def test_a_local_job_does_not_inherit_the_panels_token(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", USER)
    monkeypatch.setenv("HUGGING_FACE_HUB_TOKEN", USER)
    executor = LocalExecutor(str(tmp_path))
    script = "import os; print('HF_TOKEN' in os.environ, 'HUGGING_FACE_HUB_TOKEN' in os.environ)"
    job = JobSpec(run_id="r1", role="trainer", image="local", command=[sys.executable, "-c", script],
                  flavor="local", timeout_s=60)
    job_id = executor.submit(job)
    assert executor.wait(job_id, 30).stage == "COMPLETED"
    assert executor.read_logs(job_id, 0)[0] == ["False False"]
    executor.cancel_all()


def test_a_failed_event_written_raw_into_the_bucket_is_shown_masked(tmp_path):
    from backend.storage.store import FolderStore
    from backend.view.runview import RunView
    from panel import run_header

    store = FolderStore(str(tmp_path))
    events = tmp_path / "runs" / "r1" / layout.EVENTS_DIR
    events.mkdir(parents=True)
    (events / "trainer-000000.jsonl").write_text(json.dumps(
        {"time": 1.0, "event": "failed", "error": f"OSError: token MYVAR_{OAUTH} refused"}) + "\n")

    class NoJobs:
        name = "local"

    view = RunView("r1", store, NoJobs(), {})
    view.refresh()
    status = run_header.status_markdown(view)
    shown = re.sub(r"\\(.)", r"\1", status)       # as Markdown renders it: escaped characters as themselves
    assert "OSError: token MYVAR_hf_***" in shown and OAUTH not in status


def test_a_whole_log_streams_masked_a_chunk_at_a_time_even_where_a_token_crosses_a_chunk(tmp_path):
    from backend.executors.wrapper_files import log_text

    token = "hf_" + "Q7w8E9r0T1" * 3
    lines = [f"step {i} reward 0.5" if i % 7 else f"401 for token {token} at step {i}" for i in range(200)]
    path = tmp_path / "log.txt"
    path.write_text("\n".join(lines) + "\nlast line without its newline")
    pieces = list(log_text(str(path), redact_tokens, chunk_bytes=64))    # tokens cut by every other chunk
    assert len(pieces) > 10 and all(piece.endswith("\n") for piece in pieces)
    text = "".join(pieces)
    assert token not in text and text.count("hf_***") == len([line for line in lines if token in line])
    assert text.splitlines() == [redact_tokens(line) for line in lines] + ["last line without its newline"]
