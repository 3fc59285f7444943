"""Dashboard tables from a RunView's data."""

from types import SimpleNamespace

from backend.observers import AdapterVersion
from panel import dashboard


def _view(**kw):
    base = dict(adapters={}, first_step={}, replica_stats=[], jobs={}, current_jobs={}, events=[], spec={},
                final_files=[], superseded={}, trainer_end={})
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
    rows = dashboard.adapter_rows(_view(adapters=adapters, first_step=first_step, replica_stats=stats,
                                        superseded={"trl-policy-v1": 4}))
    assert [(r[0], r[1], r[4]) for r in rows] == [
        ("trl-policy-v3", 2, "http://a, http://b"), ("trl-policy-v2", 1, "http://a"), ("trl-policy-v1", "-", "-")]
    assert rows[0][3] == 0.041
    assert [r[5] for r in rows] == ["", "", "superseded: the run resumed from step 4"]


def test_a_replica_whose_job_ended_is_down_and_holds_no_adapters():
    from backend.jobspec import JobStatus

    stats = [{"time": 1, "replicas": [
        {"url": "http://a", "healthy": True, "adapters": ["trl-policy-v3"]},
        {"url": "http://b", "healthy": True, "adapters": ["trl-policy-v3"]}]}]   # its last snapshot before it died
    jobs = {"vllm-0": SimpleNamespace(status=JobStatus("RUNNING")),
            "vllm-1": SimpleNamespace(status=JobStatus("ERROR", "killed by SIGKILL"))}
    adapters = {3: AdapterVersion(3, "trl-policy-v3", "runs/r/.vllm_lora/trl-policy-v3", 2, 0.0, 41_000)}
    view = _view(replica_stats=stats, current_jobs=jobs, adapters=adapters)
    assert [r[1] for r in dashboard.replica_rows(view)] == ["up", "DOWN (job ERROR)"]
    assert [r[5] for r in dashboard.replica_rows(view)] == ["trl-policy-v3", ""]
    assert dashboard.adapter_rows(view)[0][4] == "http://a"


def test_log_text_filters_case_insensitively_and_keeps_the_tail():
    job = SimpleNamespace(logs=[f"step {i} reward" for i in range(1000)] + ["ERROR boom"])
    view = _view(jobs={"trainer": job})
    assert dashboard.log_text(view, "trainer", "error") == "ERROR boom"
    assert dashboard.log_text(view, "trainer", "", tail=2).splitlines() == ["step 999 reward", "ERROR boom"]
