"""The runs list's cells."""

import pytest

from backend.plan.jobspec import run_stage
from panel.runs_list import progress_bar, run_badge, status_badge

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("stages, stage", [
    ({"trainer": "RUNNING", "vllm-0": "ERROR"}, "RUNNING"),        # a failed replica degrades, the trainer decides
    ({"vllm-0": "COMPLETED", "vllm-1": "ERROR"}, "ERROR"),
    ({"vllm-0": "ERROR", "vllm-1": "RUNNING"}, "RUNNING"),        # a sweep's fleet that still serves is running
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
    assert status_badge("RUNNING") == "● running" and status_badge("ERROR") == "✗ error"
    assert status_badge("SOMETHING") == "○ something"


def _is_emoji(char: str) -> bool:
    """A character a browser draws from an emoji font: the pictographs' planes, the emoji-by-default symbols of the
    BMP this project used (🕐-style clocks, ⏱, ⏳, ⏹, ⚪), or the emoji presentation selector."""
    code = ord(char)
    return code >= 0x1F000 or code == 0xFE0F or 0x23E9 <= code <= 0x23FA or code in (0x26AA, 0x26AB, 0x2705, 0x274C)


def test_every_mark_is_words_and_a_symbol_a_plain_text_font_draws():
    import shutil
    import subprocess

    from panel.marks import SYMBOLS
    for kind, symbol in SYMBOLS.items():
        assert len(symbol) == 1 and not _is_emoji(symbol), kind
        if shutil.which("fc-list"):     # the fonts of this machine, as Debian's chromium finds them
            fonts = subprocess.run(["fc-list", f":charset={ord(symbol):x}", "family"], capture_output=True,
                                   text=True, check=True).stdout
            assert fonts.strip() and "emoji" not in fonts.lower(), f"{kind} {symbol!r}: drawn by {fonts!r}"
    for stage in ("RUNNING", "SCHEDULING", "COMPLETED", "ERROR", "CANCELED", "SOMETHING"):
        badge = status_badge(stage, unreadable=True)
        assert not any(_is_emoji(c) for c in badge) and stage.lower() in badge and "unreadable" in badge, badge


class _Listed:
    """A run as the registry lists it: its jobs' stages by role, and its stage by `run_stage`."""

    def __init__(self, stages: dict[str, str]):
        self.stages, self.timed_out, self.unreadable = stages, set(), False
        self.stage = run_stage(stages)


def test_a_fleets_row_says_which_replicas_serve_and_which_ended():
    assert run_badge(_Listed({"vllm-0": "ERROR", "vllm-1": "RUNNING"})) == \
        "● serving on vllm-1 (1 of 2) · ▲ vllm-0 failed"
    assert run_badge(_Listed({"vllm-0": "CANCELED", "vllm-1": "RUNNING", "vllm-2": "RUNNING"})) == \
        "● serving on vllm-1, vllm-2 (2 of 3) · ▲ vllm-0 stopped"
    assert run_badge(_Listed({"vllm-0": "RUNNING", "vllm-1": "RUNNING"})) == "● running"
    assert run_badge(_Listed({"vllm-0": "ERROR", "vllm-1": "ERROR"})) == "✗ error"
    assert run_badge(_Listed({"trainer": "RUNNING", "vllm-0": "ERROR"})) == "● running", "a run's own trainer decides"
