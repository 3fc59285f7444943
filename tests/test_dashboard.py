"""Dashboard tables from a RunView's data."""

from types import SimpleNamespace

import pytest

from backend.storage.adapters import AdapterVersion
from panel import adapters_table, dashboard, replicas_table, run_header, samples_table

pytestmark = pytest.mark.unit


def _view(**kw):
    base = dict(adapters={}, first_step={}, replica_stats=[], jobs={}, current_jobs={}, events=[], spec={},
                final_files=[], superseded={}, trainer_end={}, serving={}, samples=[], trainer_attempts=[])
    view = SimpleNamespace(**{**base, **kw})
    view.newest_adapters = lambda n: sorted(view.adapters.values(), key=lambda a: a.version, reverse=True)[:n]
    return view


def test_adapter_rows_show_step_and_which_replicas_hold_each_version():
    adapters = {v: AdapterVersion(v, f"trl-policy-v{v}", f"runs/r/.vllm_lora/trl-policy-v{v}", None, 0.0, 41_000)
                for v in (1, 2, 3)}
    first_step = {2: 1, 3: 2}       # RunView's: the first step trained with each policy version
    stats = [{"time": 1, "replicas": [
        {"url": "http://a", "healthy": True, "adapters": ["trl-policy-v2", "trl-policy-v3"]},
        {"url": "http://b", "healthy": True, "adapters": ["trl-policy-v3"]}]}]
    rows = adapters_table.adapter_rows(_view(adapters=adapters, first_step=first_step, replica_stats=stats,
                                        superseded={"trl-policy-v1": 4}))
    assert [(r[0], r[2], r[5]) for r in rows] == [
        ("trl-policy-v3", 2, "vllm-0, vllm-1"), ("trl-policy-v2", 1, "vllm-0"), ("trl-policy-v1", "-", "-")]
    assert rows[0][4] == 0.041
    assert [r[6] for r in rows] == ["", "", "superseded: the run resumed from step 4"]
    plain = _view(adapters=adapters, first_step=first_step, replica_stats=stats)
    assert "note" not in adapters_table.adapter_headers(plain), "an empty note column takes room from the rewards"
    assert len(adapters_table.adapter_rows(plain)[0]) == len(adapters_table.adapter_headers(plain)) == 6


def test_the_run_on_help_says_what_each_choice_means_never_a_name_as_its_own_meaning():
    from panel.launch_view import run_on_help

    said = run_on_help(["local", "hf_jobs"])
    assert said == "This machine: local processes · Hugging Face Jobs: billed per hour, with your Hugging Face token"


def test_a_replica_whose_job_ended_is_down_and_holds_no_adapters():
    from backend.plan.jobspec import JobStatus

    stats = [{"time": 1, "replicas": [
        {"url": "http://a", "healthy": True, "adapters": ["trl-policy-v3"]},
        {"url": "http://b", "healthy": True, "adapters": ["trl-policy-v3"]}]}]   # its last snapshot before it died
    jobs = {"vllm-0": SimpleNamespace(status=JobStatus("RUNNING")),
            "vllm-1": SimpleNamespace(status=JobStatus("ERROR", "killed by SIGKILL"))}
    adapters = {3: AdapterVersion(3, "trl-policy-v3", "runs/r/.vllm_lora/trl-policy-v3", 2, 0.0, 41_000)}
    view = _view(replica_stats=stats, current_jobs=jobs, adapters=adapters)
    assert [r[1] for r in replicas_table.replica_rows(view)] == ["up", "DOWN (job ERROR)"]
    assert [r[5] for r in replicas_table.replica_rows(view)] == ["trl-policy-v3", ""]
    assert adapters_table.adapter_rows(view)[0][5] == "vllm-0"
    # One that stopped by itself once the run finished is no fault: stopped, not DOWN, and it serves nothing.
    jobs["vllm-0"] = SimpleNamespace(status=JobStatus("COMPLETED"))
    assert [r[1] for r in replicas_table.replica_rows(view)] == ["stopped (job COMPLETED)", "DOWN (job ERROR)"]
    assert [r[5] for r in replicas_table.replica_rows(view)] == ["", ""]


def test_each_replica_row_carries_the_proxys_serving_proof_of_the_newest_version():
    stats = [{"time": 1, "replicas": [{"url": f"http://{h}", "healthy": True, "adapters": ["trl-policy-v7"]}
                                      for h in "abc"]}]
    serving = {"version": "trl-policy-v7", "replicas": [
        {"url": "http://a", "listed": True, "served": "trl-policy-v7", "delta_base": 0.4},
        {"url": "http://b", "listed": True, "served": "trl-policy-v7", "delta_base": 0.0},     # the base model
        {"url": "http://c", "error": "timed out"}]}
    rows = replicas_table.replica_rows(_view(replica_stats=stats, serving=serving))
    assert [r[0] for r in rows] == ["vllm-0", "vllm-1", "vllm-2"] and rows[0][-1] == "http://a"
    assert [r[6] for r in rows] == ["serves trl-policy-v7: yes · differs from base: yes",
                                    "serves trl-policy-v7: yes · differs from base: NO",
                                    "canary failed: timed out"]
    assert replicas_table.replica_rows(_view(replica_stats=stats, serving={}))[0][6] == "-", "no proof yet"


def test_the_servers_of_one_replica_job_are_named_by_it_and_show_their_own_rates():
    from backend.plan.jobspec import JobStatus

    load = {"gen_tok_s": 15200.0, "api_cpu": 0.97, "running": 250}
    stats = [{"time": 1, "replicas": [{"url": f"http://h{j}:{8000 + k}", "healthy": True, "adapters": ["trl-policy-v2"],
                                       **load} for j in range(2) for k in range(2)]}]
    jobs = {"vllm-0": SimpleNamespace(status=JobStatus("RUNNING")),
            "vllm-1": SimpleNamespace(status=JobStatus("ERROR", "killed"))}
    rows = replicas_table.replica_rows(_view(replica_stats=stats, current_jobs=jobs))
    assert [r[0] for r in rows] == ["vllm-0/0", "vllm-0/1", "vllm-1/0", "vllm-1/1"]
    assert [r[1] for r in rows] == ["up", "up", "DOWN (job ERROR)", "DOWN (job ERROR)"], "a job's end downs its servers"
    assert [(r[7], r[8]) for r in rows] == [(15200.0, 0.97)] * 2 + [("-", "-")] * 2
    assert rows[1][-1] == "http://h0:8001"


def test_samples_of_the_latest_step_or_a_chosen_one():
    samples = [{"step": s, "policy_version": s - 1, "prompt": f"p{s}", "completion": f"c{s}{i}",
                "rewards": {"reward": 0.5, "rewards/digits": 1.0}, "advantage": 0.25, "length": 12, "truncated": i == 1}
               for s in (3, 4) for i in range(2)]
    view = _view(samples=samples)
    assert samples_table.sample_steps(view) == [4, 3]
    rows = samples_table.sample_rows(view)
    assert [r[3] for r in rows] == ["c40", "c41"] and rows[0][1] == 3
    assert rows[0][4] == "reward 0.5 · digits 1" and rows[0][5] == 0.25 and [r[7] for r in rows] == ["no", "yes"]
    assert [r[3] for r in samples_table.sample_rows(view, 3)] == ["c30", "c31"]
    assert samples_table.sample_rows(_view(samples=[])) == []


def test_log_text_filters_case_insensitively_and_keeps_the_tail():
    job = SimpleNamespace(logs=[f"step {i} reward" for i in range(1000)] + ["ERROR boom"])
    view = _view(jobs={"trainer": job})
    assert dashboard.log_text(view, "trainer", "error") == "ERROR boom"
    assert dashboard.log_text(view, "trainer", "", tail=2).splitlines() == ["step 999 reward", "ERROR boom"]


def test_a_failed_jobs_cause_is_the_last_error_line_of_its_log_masked():
    from backend.plan.jobspec import JobStatus

    logs = ["step 1/20 reward 0.1", "Traceback (most recent call last):", '  File "x.py", line 3',
            "bash: /venv/bin/python: No such file or directory", "token hf_abcdefghijklmnopqrstuvwxyz12 printed"]
    jobs = {"trainer": SimpleNamespace(status=JobStatus("ERROR", "exited with code 127; see the log"), logs=logs),
            "vllm-0": SimpleNamespace(status=JobStatus("RUNNING"), logs=["ERROR not this one"])}
    cause = run_header.failure_cause(_view(current_jobs=jobs))
    assert cause == ("✗ Failed: **trainer: exited with code 127; see the log** — "
                     "`bash: /venv/bin/python: No such file or directory`")
    jobs["trainer"].logs = [*logs, "ValueError: bad token hf_abcdefghijklmnopqrstuvwxyz12"]
    cause = run_header.failure_cause(_view(current_jobs=jobs))
    assert "ValueError: bad token hf_***" in cause and "abcdefghij" not in cause, cause


def test_the_trainers_own_error_is_the_cause_and_a_healthy_run_has_none():
    from backend.plan.jobspec import JobStatus

    failed = {"event": "failed", "error": "RewardFunctionError: boom"}
    jobs = {"trainer": SimpleNamespace(status=JobStatus("ERROR", "exited with code 1"), logs=["ERROR other"])}
    cause = run_header.failure_cause(_view(current_jobs=jobs, trainer_end=failed))
    assert cause == "✗ Failed: **RewardFunctionError: boom**"
    running = {"trainer": SimpleNamespace(status=JobStatus("RUNNING"), logs=["Error in a warning"])}
    assert run_header.failure_cause(_view(current_jobs=running)) == ""


# Log tails as the jobs wrote them when they failed: the proxy's asyncio noise after the trainer was killed,
# and vLLM's access log of the trainer unloading an adapter from a replica that was already gone.
KILLED_TRAINER_LOG = [
    "step 41/500  reward 0.312  63.0s  staleness 0.50  policy v40",
    "2026-12-01 10:02:11,480 runtime.serving.proxy INFO replica http://127.0.0.1:41001 is healthy (3 adapters)",
    "Traceback (most recent call last):",
    '  File "/bucket/runs/r/code/runtime/trainer/train_async.py", line 301, in <module>',
    "    main()",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.11 GiB total capacity)",
    "2026-12-01 10:02:14,002 asyncio ERROR Unclosed connector",
    "connections: ['deque([(<aiohttp.client_proto.ResponseHandler object at 0x7f>, 1234.5)])']",
    "connector: <aiohttp.connector.TCPConnector object at 0x7f1c2c0d5e50>",
    "2026-12-01 10:02:14,003 asyncio ERROR Unclosed client session",
    "client_session: <aiohttp.client.ClientSession object at 0x7f1c2c0d5d10>",
]
KILLED_REPLICA_LOG = [
    "(APIServer pid=4242) INFO 12-01 10:03:00 [serving_models.py:210] Loaded new LoRA adapter: name 'trl-policy-v7'",
    '(APIServer pid=4242) INFO:     127.0.0.1:50514 - "POST /v1/load_lora_adapter HTTP/1.1" 200 OK',
    '(APIServer pid=4242) INFO:     127.0.0.1:50530 - "POST /v1/unload_lora_adapter HTTP/1.1" 404 Not Found',
    "(APIServer pid=4242) INFO 12-01 10:03:05 [launcher.py:80] Shutting down FastAPI HTTP server.",
]


def test_a_failed_jobs_cause_is_its_real_error_not_the_noise_after_it():
    from backend.plan.jobspec import JobStatus

    trainer = SimpleNamespace(status=JobStatus("ERROR", "exited with code 1"), logs=KILLED_TRAINER_LOG)
    cause = run_header.status_markdown(_header_view(current_jobs={"trainer": trainer}))
    assert "torch.OutOfMemoryError: CUDA out of memory" in cause and "Unclosed" not in cause, cause

    # A killed replica's status says how it ended; an INFO access-log line of its log is no cause.
    replica = SimpleNamespace(status=JobStatus("ERROR", "killed by SIGKILL (out of memory, or killed from outside)"),
                              logs=KILLED_REPLICA_LOG)
    cause = run_header.failure_cause(_view(current_jobs={"vllm-1": replica}))
    assert cause == "✗ Failed: **vllm-1: killed by SIGKILL (out of memory, or killed from outside)**", cause

    # Only noise after a kill: the status alone.
    noise = SimpleNamespace(status=JobStatus("ERROR", "killed by SIGKILL"), logs=KILLED_TRAINER_LOG[-5:])
    assert (run_header.failure_cause(_view(current_jobs={"trainer": noise}))
            == "✗ Failed: **trainer: killed by SIGKILL**")

    # The kernel's OOM kill as bash reports it beats an earlier, lesser error line.
    shell = SimpleNamespace(status=JobStatus("ERROR", "exited with code 137"),
                            logs=["ERROR could not reach the Hub, retrying", "bash: line 1:  4242 Killed  python -m x",
                                  "INFO: shutting down"])
    assert run_header.failure_cause(_view(current_jobs={"trainer": shell})).endswith(
        "`bash: line 1:  4242 Killed  python -m x`")


def test_a_local_jobs_exit_message_quotes_its_real_error_not_its_last_line(tmp_path):
    from backend.runtime.job.job_wrapper import LOG_FILE, exit_message

    (tmp_path / LOG_FILE).write_text("\n".join(KILLED_TRAINER_LOG) + "\n")
    assert exit_message(1, str(tmp_path)) == (
        "ERROR", ("exited with code 1: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB "
                  "(GPU 0; 79.11 GiB total capacity)"))
    (tmp_path / LOG_FILE).write_text("step 3/4 reward 0.1\nall done, exiting\n")
    assert exit_message(2, str(tmp_path)) == ("ERROR", "exited with code 2: all done, exiting")


def _header_view(**kw):
    from backend.storage.series import SeriesTable

    view = _view(**kw)
    extra = dict(run_id="r", stage="ERROR", degraded="", latest={}, engine="", history_pending=False,
                 open_alerts={}, table=SeriesTable(), unreadable={}, done=True)
    for key, value in extra.items():
        setattr(view, key, value)
    return view


def test_the_replica_table_counts_restarts_disconnects_and_canary_misses_each_as_itself_over_the_run(tmp_path):
    """The proxy's snapshots carry the run's counts; a proxy started again over the same folder goes on from the
    last one (by URL, else by place); the table and the header show each kind as itself."""
    from backend.runtime.layout import PROXY_WRITER, FragmentWriter
    from backend.runtime.serving.proxy_stats import carry_counts
    from backend.runtime.serving.replicas import Replica
    from backend.view.runview import RunView

    counts = {"restarted": 1, "reconnected": 2, "canary_missed": 3}
    FragmentWriter(str(tmp_path), PROXY_WRITER).write([
        {"time": 1, "replicas": [{"url": "http://a", "joined": 1, "restarted": 0}]},       # an older snapshot
        {"time": 2, "replicas": [{"url": "http://a", "joined": 4, **counts},
                                 {"url": "http://b", "joined": 1, "restarted": 0, "reconnected": 0,
                                  "canary_missed": 1}]}])
    (tmp_path / "proxy-000001.jsonl").write_text('{"time": 3, "repl')        # torn: the one before it is read
    same = [Replica("http://a"), Replica("http://b")]
    carry_counts(same, str(tmp_path))
    assert [(r.restarted, r.reconnected, r.canary_missed, r.joined) for r in same] == [(1, 2, 3, 0), (0, 0, 1, 0)]
    moved = [Replica("http://c"), Replica("http://d")]         # a resume's new replica jobs: by their place
    carry_counts(moved, str(tmp_path))
    assert moved[0].snapshot()["canary_missed"] == 3 and moved[1].snapshot()["canary_missed"] == 1
    fewer = [Replica("http://c")]
    carry_counts(fewer, str(tmp_path))
    assert fewer[0].snapshot()["restarted"] == 0, "neither its URL nor its place is known: it starts from 0"

    stats = [{"time": 2, "replicas": [r.snapshot() | {"healthy": True} for r in same]}]
    rows = replicas_table.replica_rows(_view(replica_stats=stats))
    assert [r[9] for r in rows] == ["restarted 1x · came back 2x · missed the canary 3x", "missed the canary 1x"]
    view = _view(replica_stats=stats)
    assert RunView.retries.fget(view) == ["vllm-0 taken back 1x after a restart",
                                          "vllm-0 stopped answering and came back 2x"], "a miss is not a retry"
    old = [{"time": 1, "replicas": [{"url": "http://a", "healthy": True, "joined": 3, "restarted": 1}]}]
    assert replicas_table.replica_rows(_view(replica_stats=old))[0][9] == "restarted 1x · came back 1x", \
        "a proxy from before the run's counts: its returns beyond its restarts were disconnects"


def test_a_starting_run_says_its_start_up_stage_with_elapsed_time_until_its_first_step():
    from collections import deque

    from backend.plan.jobspec import JobStatus
    from backend.storage.series import SeriesTable

    trainer = SimpleNamespace(status=JobStatus("SCHEDULING"), logs=deque())
    spec = {"model": "builtin:tiny-qwen2", "executor": "local", "eval_source": "split", "created_at": 1000.0}
    view = _view(current_jobs={"trainer": trainer}, spec=spec, table=SeriesTable(), launch_failure=None)

    def line(now=1041.0):
        return run_header.start_up_line(view, now)

    assert line() == "◌ Starting: **waiting for a machine (scheduling)**", "the cost line beside it says the time"
    trainer.status = JobStatus("RUNNING")
    assert "**starting the trainer job**" in line()
    view.events.append({"writer": "trainer", "event": "attempt", "role": "trainer", "time": 1010.0})
    assert line() == "◌ Starting: **building the model** for 31 s"
    trainer.logs.append("builtin:tiny-qwen2 ready at /tmp/m (3.2 s)")
    assert "**loading the data and the model** for 31 s" in line()
    view.events.append({"writer": "trainer", "event": "engine", "engine": "transformers", "time": 1030.0})
    assert "**importing TRL and building the trainer, then scoring the base model on the held-out set** for 11 s" \
        in line()
    view.events.append({"writer": "trainer", "event": "started", "step": 0, "max_steps": 200, "time": 1040.0})
    assert "**training the first step** for 1 s" in line()
    view.events.append({"writer": "trainer", "event": "attempt", "role": "trainer", "time": 1040.5})
    assert "**loading the data and the model**" in line(), "a retried attempt starts over"
    view.table.add({"step": 1, "time": 1041.0, "reward": 0.1})
    assert line() == "", "a run that logged a step says its step instead"


def test_a_distributed_run_waits_for_its_replicas_and_an_hf_jobs_run_installs_first():
    from collections import deque

    from backend.plan.jobspec import JobStatus
    from backend.storage.series import SeriesTable

    trainer = SimpleNamespace(status=JobStatus("RUNNING"), logs=deque(["builtin:tiny-qwen2 ready at /m (1 s)"]))
    jobs = {"trainer": trainer, "vllm-0": SimpleNamespace(status=JobStatus("RUNNING")),
            "vllm-1": SimpleNamespace(status=JobStatus("SCHEDULING"))}
    attempt = [{"writer": "trainer", "event": "attempt", "role": "trainer", "time": 5.0}]
    view = _view(current_jobs=jobs, spec={"model": "builtin:tiny-qwen2"}, table=SeriesTable(), launch_failure=None,
                 events=attempt)
    assert "waiting for the vLLM replicas (1/2 replica jobs running)" in run_header.start_up_line(view, 10.0)
    hub = _view(current_jobs={"trainer": SimpleNamespace(status=JobStatus("RUNNING"), logs=deque())},
                spec={"model": "Qwen/Qwen2.5-0.5B", "executor": "hf_jobs"}, table=SeriesTable(),
                launch_failure=None, events=attempt)
    assert "**installing the runtime and loading the model**" in run_header.start_up_line(hub, 10.0)
    hub.current_jobs["trainer"].status = JobStatus("COMPLETED")
    assert run_header.start_up_line(hub, 10.0) == ""
