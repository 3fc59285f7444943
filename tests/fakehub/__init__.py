"""A loopback fake of the Hugging Face Hub REST protocol, driven through the real `huggingface_hub` client.

It is a real HTTP/1.1 server (stdlib `ThreadingHTTPServer`, a free port on 127.0.0.1, a background thread)
that speaks the paths and JSON shapes `huggingface_hub` 2.4 uses: Jobs (create, list by label, inspect,
cancel, logs and metrics as server-sent events, hardware), `whoami-v2`, and Buckets (create, info, tree,
paths-info). Every call needs `Authorization: Bearer <known token>` (401 otherwise), and a token only
reaches the namespaces of its user and orgs (403 otherwise).

Pointing the real client at it: `huggingface_hub.constants.ENDPOINT` is read from `HF_ENDPOINT` once, when
huggingface_hub is first imported, so setting the env variable later changes nothing. `HfApi.__init__`
copies `constants.ENDPOINT` each time an `HfApi` is built, so patch the constant before building one:

    hub = FakeHub().start()
    hub.patch_endpoint(monkeypatch)          # monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", hub.url)
    api = HfApi(token=hub.token)             # or HfApi(endpoint=hub.url, token=hub.token)

Module-level helpers (`huggingface_hub.whoami`, `huggingface_hub.list_jobs`, ...) are bound to an `HfApi`
built at import time and keep the real endpoint; `HfApi.list_jobs` without `namespace=` calls that
module-level `whoami`. Call methods on an `HfApi` instance and always pass `namespace=`. (The client also
GETs `/api/agent-harnesses` once, unauthenticated, to detect coding agents: the fake answers 401 and the
client ignores it.)

Bucket file bytes travel over Xet in the real client, which this fake does not speak:
`install_bucket_transfers(monkeypatch)` replaces `HfApi.batch_bucket_files` and
`HfApi.download_bucket_files` with functions that read and write the fake's in-memory files (recorded in
`transfers`). Listing (`/tree`, `/paths-info`) stays HTTP, served from the same files.

Model repos: create (`/api/repos/create`), card metadata check (`/api/validate-yaml`), `preupload` (regular or
LFS per file), `commit` (the ndjson body `create_commit` sends) and model info. File bytes that `preupload` sends
to LFS travel over Xet or LFS in the real client: `install_repo_transfers(monkeypatch)` replaces
`huggingface_hub._commit_api._upload_files` with a function that stores them in the fake (`lfs_objects`), and the
commit refuses an LFS pointer to bytes it never received, as the Hub does.

It also answers the dataset viewer API (datasets-server: `/splits`, `/rows`) from `datasets`, with the JSON
shapes of its OpenAPI description: public datasets need no token, a private one answers 401 to anonymous
callers and 404 to others (both with the viewer's "does not exist, or is not accessible" error), an unknown
config or split 404 "Not found.", a bad parameter 422. `patch_endpoint` points huggingface_hub's
`DATASETS_SERVER_ENDPOINT` constant at the fake too. A public stand-in for "trl-lib/DeepMath-103K" (three
rows: a conversational `prompt` and a `solution`) is there from the start; `put_dataset` adds others.

Task-check jobs (label `grpo-panel-role=task-check`) run as Jobs would run them, on a "machine" of their own
(tests/check_runner.py): their log and stage come from the real check they run. Every other job is the test's to
drive. Test controls: `set_stage`, `append_logs`, `append_metrics`, `drop_log_streams` (cut every open log
stream of a job mid-way, optionally refusing the next reconnects), `fail_nth_post`,
`fail_nth_job_submission`, `create_then_fail_nth_job_submission` (the job exists, the answer is a 504),
`hold_nth_job_submission` (the creation waits for the test's go: a panel can be killed while it waits),
`bucket_read_error` (bucket listings fail), `list_lag_s` (a new job shows in job listings only that many seconds
after its creation), `expose_url_format`, `hardware_error`, `page_size` (Link-header
pagination), `requests` (every call, Authorization header removed), `clock` (the Hub's time: job timestamps and
`durations` follow it; a RUNNING job whose `timeoutSeconds` have passed on it ends ERROR, "Job timeout").

Platform features as `run_job`'s docstring describes them: `attempts` (a job set to ERROR with attempts left goes
back to SCHEDULING as its next attempt, same id; JobInfo reports `retry` = attempts - 1, and `durations.runningSecs`
counts every attempt), `network` (group and aliases checked as documented and reported back in JobInfo;
`network_members` lists a group's live members of one namespace and resource group by alias) and `resourceGroupId`
(accepted only for a group of the job's namespace in `resource_groups`, id -> org, else 404; recorded in the job's
spec).

The package, by concern: `server` (the HTTP server, authentication, routing, SSE streams, `FakeHub`), `jobs`, `buckets`,
`repos`, `datasets` (the viewer), `common` (replies, recorded requests, users, `wait_until`). Import from the package:
`from tests.fakehub import FakeHub, FakeUser, wait_until`. The shared `hub` fixture (tests/conftest.py) starts one.
"""

from tests.fakehub.buckets import FakeBucket, FakeObject, install_remote_bucket_transfers
from tests.fakehub.common import (
    DEFAULT_TOKEN,
    TOKEN_SHAPES,
    FakeUser,
    RecordedRequest,
    Reply,
    utc_stamp,
    wait_until,
)
from tests.fakehub.datasets import DEEPMATH_STAND_IN, FakeDataset
from tests.fakehub.jobs import HARDWARE, TERMINAL, FakeJob
from tests.fakehub.repos import LFS_SUFFIXES, FakeRepo, install_remote_repo_transfers
from tests.fakehub.server import FakeHub
from tests.helpers import panel_factory  # where it was before the split; tests/helpers.py is its home

__all__ = [
    "DEEPMATH_STAND_IN",
    "DEFAULT_TOKEN",
    "HARDWARE",
    "LFS_SUFFIXES",
    "TERMINAL",
    "TOKEN_SHAPES",
    "FakeBucket",
    "FakeDataset",
    "FakeHub",
    "FakeJob",
    "FakeObject",
    "FakeRepo",
    "FakeUser",
    "RecordedRequest",
    "Reply",
    "install_remote_bucket_transfers",
    "install_remote_repo_transfers",
    "panel_factory",
    "utc_stamp",
    "wait_until",
]
