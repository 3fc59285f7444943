"""The panel's handlers without a browser: bad input changes nothing, anonymous Space visitors only look."""

import os

import pytest

from panel.actions import Panel, Settings
from tests.helpers import files_under

pytestmark = pytest.mark.unit


def test_bad_input_is_refused_and_changes_nothing(panel, tmp_path):
    result = panel.launch({"lora_r": 0, "learning_rate": -1, "bucket": "nope"})
    message = result.message
    assert result.run_id is None
    assert "nothing was launched" in message
    for field in ("lora_r", "learning_rate", "bucket"):
        assert f"**{field}**" in message
    assert panel.local.list_jobs() == []
    assert files_under(os.path.join(panel.settings.home, "buckets")) == []


def test_unknown_fields_and_wrong_types_are_refused(panel):
    result = panel.launch({"max_steps": "many"})
    assert result.run_id is None and "**max_steps**" in result.message


def test_a_space_runs_nothing_locally_unless_its_owner_turns_local_runs_on(tmp_path):
    panel = Panel(Settings(home=str(tmp_path / "home"), on_space=True))
    try:
        result = panel.launch({})
        assert result.run_id is None and "Local runs are off on this Space" in result.message
        assert panel.local.list_jobs() == []
        assert "local" in panel.preview({}).markdown, "looking (the preview) stays allowed"
    finally:
        panel.shutdown()


def test_preview_lists_the_jobs_and_never_a_token(panel, monkeypatch):
    token = "hf_" + "x" * 34
    monkeypatch.setenv("HF_TOKEN", token)
    form = {"mode": "distributed", "replicas": 2, "eval_source": "split", "eval_max_inflight": 3}
    text = panel.preview(form).markdown
    assert text.count("```bash") == 3 and "runtime.trainer.train_async" in text and "--max-loras 3" in text
    assert ("Held-out evaluation: split `test` of `builtin:count-to-ten`, up to 64 prompts, greedy, at every "
            "published adapter version, at most 3 requests in flight; the base model first, as version 0; the best "
            "version by the trained rewards' weighted score (ties: the earliest), if it beats version 0.") in text
    assert "-- vllm serve " in text and "trackio" not in text
    assert token not in text
    tracked = panel.preview({"trackio": True, "name": "tracked"}).markdown
    assert "Also logs to trackio: project `grpo-panel`, run `tracked`, in the run's own folder" in tracked


def test_the_ui_builds_with_every_control(panel):
    from panel.ui import build_ui

    demo = build_ui(panel)
    ids = {getattr(block, "elem_id", None) for block in demo.blocks.values()}
    wanted = {"preset", "f-lora_r", "f-flavor", "f-trackio", "f-trackio_space", "confirm", "launch-btn", "run-pick",
              "cancel-btn", "resume-btn", "reward-plot", "staleness-plot", "util-plot", "ratio-plot", "adapters-table",
              "replicas-table", "final-btn", "log-query", "log-btn", "log-box"}
    assert wanted <= ids, wanted - ids
    by_id = {getattr(block, "elem_id", None): block for block in demo.blocks.values()}
    assert by_id["f-lora_r"].label == "Rank r" and by_id["f-lora_r"].info.endswith("; 1 to 512")
    assert by_id["f-num_generations"].info.endswith("at least 2"), "each whole number shows its valid range"


def _visible_text(markdown: str) -> str:
    """What a reader sees of `markdown` once rendered (CommonMark, as the browser's Markdown renderer reads it)."""
    import html
    import re

    from markdown_it import MarkdownIt

    return html.unescape(re.sub(r"<[^>]+>", "", MarkdownIt("commonmark").render(markdown)))


def test_a_refusal_shows_the_fields_label_and_message_as_written(panel):
    """The reward code's label holds `**kwargs` and `<name>`: in the refusal's Markdown they used to vanish."""
    from panel.task_form import CODE_LABEL

    panel.field_labels = {"reward_code": CODE_LABEL, "learning_rate": "Learning rate"}
    shown = panel.preview({"reward_code": "def f(completions):\n    return [0.0] * len(completions)\n",
                           "rewards": []})
    seen = _visible_text(shown.markdown)
    assert CODE_LABEL in seen, seen
    assert "def name(completions, **kwargs) -> list[float]" in seen and "rewards/<name>" in seen
    assert "f has no **kwargs" in seen, seen


def test_a_value_of_the_wrong_type_is_refused_saying_what_to_write(panel):
    result = panel.preview({"learning_rate": None, "reward_weights": "digits: 1", "max_steps": "many"})
    seen = _visible_text(result.markdown)
    assert "expected" not in seen, seen
    assert "learning_rate" in seen and "enter a number, e.g. 4e-05 (the field is empty)" in seen, seen
    assert "write name=weight pairs separated by commas, e.g. accuracy_reward=1, think_format_reward=0.2" in seen
    assert "enter a whole number (got 'many')" in seen, seen


def test_code_naming_an_identifier_that_starts_with_hf_is_no_token_but_a_token_in_code_is(panel):
    code = ("from transformers import AutoTokenizer as hf_Tokenizer2\n\n\n"
            "def f(completions, **kwargs):\n    return [0.0] * len(completions)\n")
    shown = panel.preview({"reward_code": code, "rewards": []})
    assert shown.fingerprint and "token" not in shown.markdown.lower(), shown.markdown
    planted = "hf_" + "QwErTyUiOpAsDfGhJkLzXcVbNmQwErTyUi"           # a user token's shape: hf_ + 34 letters
    for leak in (planted, "hf_oauth_" + "Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2", "api_org_" + "QwErTyUiOpAsDfGhJkLzXcVb"):
        shown = panel.preview({"reward_code": f"KEY = '{leak}'\n{code}", "rewards": []})
        assert shown.fingerprint is None and "looks like a Hugging Face token" in shown.markdown, shown.markdown
        assert leak not in shown.markdown
