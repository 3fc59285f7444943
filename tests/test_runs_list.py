"""The runs list's cells."""

import pytest

from backend.plan.jobspec import run_stage
from panel.runs_list import progress_bar, status_badge


@pytest.mark.parametrize("stages, stage", [
    ({"trainer": "RUNNING", "vllm-0": "ERROR"}, "RUNNING"),        # a failed replica degrades, the trainer decides
    ({"vllm-0": "COMPLETED", "vllm-1": "ERROR"}, "ERROR"),
    ({"vllm-0": "CANCELED", "vllm-1": "COMPLETED"}, "CANCELED"),
    ({}, "UNKNOWN"),
])
def test_a_runs_stage_is_its_trainers_or_the_most_telling_of_its_jobs(stages, stage):
    assert run_stage(stages) == stage


def test_progress_is_a_bar_of_ten_cells_with_the_steps():
    assert progress_bar(0, 200) == "░░░░░░░░░░ 0/200"
    assert progress_bar(150, 200) == "███████░░░ 150/200"
    assert progress_bar(205, 200) == "██████████ 205/200", "a resumed run may log past max_steps"
    assert progress_bar(None, 200) == "░░░░░░░░░░ 0/200"
    assert progress_bar(7, None) == "7" and progress_bar(None, None) == ""


def test_each_status_has_its_badge():
    assert status_badge("RUNNING") == "🟢 running" and status_badge("ERROR") == "❌ error"
    assert status_badge("SOMETHING") == "⚪ something"
