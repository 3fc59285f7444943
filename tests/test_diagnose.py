"""The bottleneck verdict and the alerts: pure functions over metric windows in TRL's own names."""

import pytest

from backend.executors.base import ResourceSample
from backend.view.diagnose import (
    RATIO_BAND,
    STALL_FLOOR_S,
    gpu_idle_alert,
    job_alerts,
    ratio_alert,
    stale_drop_alert,
    stall_alert,
    verdict,
)

pytestmark = pytest.mark.unit

SPEC = {"mode": "distributed", "queue_maxsize": 64, "max_inflight_tasks": 8, "adapter_every": 1,
        "max_staleness": 1, "replicas": 2, "gradient_checkpointing": False, "max_tokens_per_batch": 4096,
        "per_device_batch_size": 8}


def window(n=20, **metrics):
    return [{"step": i, "time": 100.0 + i, **metrics} for i in range(1, n + 1)]


def test_a_trainer_waiting_on_rollouts_with_in_flight_at_its_cap_is_generation_bound_raise_the_cap():
    v = verdict(window(**{"perf/step_s": 2.0, "perf/rollout_wait_s": 1.2, "rollout/inflight": 8.0,
                          "sample/rollout_queue_size": 0.0, "perf/weight_sync_s": 0.05}), SPEC)
    assert v.kind == "generation-bound" and "60%" in v.line and "8 of 8" in v.line
    assert v.change == {"max_inflight_tasks": 16}


def test_generation_bound_below_the_in_flight_cap_means_the_replicas_are_saturated():
    v = verdict(window(**{"perf/step_s": 2.0, "perf/rollout_wait_s": 1.0, "rollout/inflight": 3.0,
                          "perf/weight_sync_s": 0.05}), SPEC)
    assert v.kind == "generation-bound" and v.change == {"replicas": 3}


def test_a_trainer_that_never_waits_with_a_full_queue_is_trainer_bound():
    rows = window(**{"perf/step_s": 4.0, "perf/rollout_wait_s": 0.01, "sample/rollout_queue_size": 60.0,
                     "rollout/inflight": 8.0, "perf/weight_sync_s": 0.1})
    v = verdict(rows, SPEC)
    assert v.kind == "trainer-bound" and "60 of 64" in v.line and v.change == {"max_tokens_per_batch": 8192}
    assert verdict(rows, {**SPEC, "gradient_checkpointing": True}).change == {"gradient_checkpointing": False}


def test_sync_taking_a_large_share_of_wall_time_is_sync_bound_and_the_interval_grows():
    v = verdict(window(**{"perf/step_s": 2.0, "perf/rollout_wait_s": 0.1, "perf/weight_sync_s": 1.5,
                          "sample/rollout_queue_size": 10.0}), SPEC)
    assert v.kind == "sync-bound" and "75% of wall time" in v.line
    assert v.change == {"adapter_every": 8, "max_staleness": 8}


def test_a_balanced_run_is_healthy_and_a_colocated_or_young_run_gets_no_verdict():
    healthy = window(**{"perf/step_s": 2.0, "perf/rollout_wait_s": 0.2, "sample/rollout_queue_size": 20.0,
                        "rollout/inflight": 5.0, "perf/weight_sync_s": 0.1})
    assert verdict(healthy, SPEC).kind == "healthy" and verdict(healthy, SPEC).change == {}
    assert verdict(healthy, {**SPEC, "mode": "colocated"}).kind == "unknown"
    assert verdict([], SPEC).kind == "unknown"


def test_the_ratio_alert_fires_on_a_drift_the_old_band_never_saw():
    assert ratio_alert(window(ratio=1.0003)) is None
    drift = ratio_alert(window(ratio=1.0 + 3 * RATIO_BAND))
    assert drift and drift.key == "ratio" and "1.0300" in drift.message
    assert 3 * RATIO_BAND < 0.1, "a drift the previous +-0.1 warning never reported"


def test_a_run_with_no_new_step_for_ten_step_times_and_the_floor_has_stalled():
    rows = window(n=10)           # one step a second, last at t=110
    assert stall_alert(rows, now=125.0, running=True) is None, "ten step times, but under the floor in seconds"
    assert stall_alert(rows, now=110.0 + STALL_FLOOR_S + 1, running=True).key == "stall"
    assert stall_alert(rows, now=110.0 + STALL_FLOOR_S + 1, running=False) is None, "a finished run is not stalled"
    slow = [{**r, "time": 100.0 + 30 * (r["time"] - 100.0)} for r in rows]    # 30 s steps: ten of them is the limit
    assert stall_alert(slow, now=slow[-1]["time"] + 290, running=True) is None
    assert stall_alert(slow, now=slow[-1]["time"] + 301, running=True).key == "stall"


def test_stale_drops_above_a_share_of_scored_samples_alert():
    assert stale_drop_alert(window(n=10, **{"sample/dropped_stale_total": 5.0}), SPEC) is None
    assert stale_drop_alert(window(n=10, **{"sample/dropped_stale_total": 40.0}), SPEC).key == "stale-drops"


def test_a_failed_trainer_and_a_failed_replica_alert_differently():
    alerts = job_alerts({"trainer": "RUNNING", "vllm-1": "ERROR"}, {"vllm-1": "exited with code 137"})
    assert [(a.kind, a.key) for a in alerts] == [("replica-down", "replica-down-vllm-1")]
    assert "137" in alerts[0].message


def test_gpus_idle_for_minutes_while_training_alert():
    idle = [ResourceSample(time=t, gpu_util=(1.0, 0.0)) for t in range(0, 301, 10)]
    assert gpu_idle_alert("trainer", idle, now=300.0, running=True).key == "gpu-idle-trainer"
    busy = idle[:-1] + [ResourceSample(time=300.0, gpu_util=(50.0, 0.0))]
    assert gpu_idle_alert("trainer", busy, now=300.0, running=True) is None
    assert gpu_idle_alert("trainer", idle[-5:], now=300.0, running=True) is None, "not idle long enough yet"
