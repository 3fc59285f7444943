"""One run id, one run (`backend/runs/run_ids.py`): the panel's book of launched ids, how an action picks the run an
id names among the namespaces a visitor reaches, and which labelled jobs are a run's own."""

import threading
from types import SimpleNamespace

import pytest

from backend.plan.jobspec import JobRecord
from backend.runs.launch import RunIdTaken
from backend.runs.registry import own_jobs
from backend.runs.run_ids import RunIdBook, pick_owner, where_label

pytestmark = pytest.mark.unit
RUN = "20260101-120000-ab12cd"


def test_an_id_is_claimed_once_for_the_whole_panel(tmp_path):
    book = RunIdBook(str(tmp_path))
    book.claim(RUN, "hf_jobs", "bob", "bob/grpo-runs")
    for elsewhere in (("hf_jobs", "bob", "bob/grpo-runs"), ("hf_jobs", "acme", "acme/grpo-runs"),
                      ("hf_jobs", "bob", "bob/other"), ("local", None, "b")):
        with pytest.raises(RunIdTaken, match="already names a run on this panel"):
            book.claim(RUN, *elsewhere)
    book.release(RUN, "hf_jobs", "acme")                        # not the claimant's: kept
    assert book.owner(RUN)["namespace"] == "bob"
    book.release(RUN, "hf_jobs", "bob")
    assert book.owner(RUN) is None
    with pytest.raises(RunIdTaken, match="not a valid run id"):
        book.claim("../escape", "hf_jobs", "bob", "bob/grpo-runs")


def test_two_launches_racing_for_one_id_cannot_both_win(tmp_path):
    book, won, lost = RunIdBook(str(tmp_path)), [], []
    start = threading.Barrier(8)

    def claim(n: int) -> None:
        start.wait()
        try:
            book.claim(RUN, "hf_jobs", f"ns{n % 2}", f"ns{n % 2}/grpo-runs")     # also two into one place
            won.append(n)
        except RunIdTaken:
            lost.append(n)

    threads = [threading.Thread(target=claim, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(won) == 1 and len(lost) == 7 and book.owner(RUN)["namespace"] == f"ns{won[0] % 2}"


def registry(namespace, executor="hf_jobs", label="Hugging Face Jobs"):
    return SimpleNamespace(namespace=namespace, executor=SimpleNamespace(name=executor),
                           engine=SimpleNamespace(label=label))


def test_an_id_reached_in_several_namespaces_resolves_to_its_owner_or_to_nothing():
    acme, bob, other = registry("acme"), registry("bob"), registry("other-org")
    assert pick_owner(RUN, [acme], "bob", None) is acme, "the only run the visitor reaches"
    assert pick_owner(RUN, [acme, bob], "bob", {"executor": "hf_jobs", "namespace": "acme"}) is bob, \
        "the visitor's own namespace first"
    assert pick_owner(RUN, [acme, other], "bob", {"executor": "hf_jobs", "namespace": "other-org"}) is other, \
        "else the one this panel launched the id in"
    assert pick_owner(RUN, [acme, other], "bob", None) is None, "else none: the caller refuses"
    assert where_label(acme) == "acme on Hugging Face Jobs"
    assert where_label(registry(None, "local", "local processes")) == "local processes"


def test_a_runs_jobs_are_those_writing_its_first_jobs_bucket():
    def job(job_id, bucket, at):
        return JobRecord(job_id, RUN, "trainer", "RUNNING", at, bucket=bucket)

    newest_first = [job("twin", "acme/other", 3.0), job("resumed", "acme/grpo-runs", 2.0),
                    job("first", "acme/grpo-runs", 1.0)]
    assert [r.job_id for r in own_jobs(newest_first)] == ["resumed", "first"]
    assert own_jobs([job("a", None, 1.0)])[0].job_id == "a"


def test_preview_and_launch_refuse_an_id_that_names_a_run_anywhere_the_panel_serves(panel):
    """A run of another namespace holds the id (this panel launched it there): a local preview or launch under the
    same id is refused, naming the field and what to do, and nothing is launched."""
    from panel.presets import TINY_DEMO, preset_values

    panel.runs.run_ids.claim(RUN, "hf_jobs", "someone-else", "someone-else/grpo-runs")
    values = preset_values(TINY_DEMO)
    shown = panel.preview(values, run_id=RUN)
    assert shown.fields == ("run_id",) and shown.fingerprint is None, shown
    assert "already names a run on this panel" in shown.markdown and "preview again" in shown.markdown
    result = panel.launch(values, run_id=RUN)
    assert result.run_id is None and result.fields == ("run_id",) and "Nothing was launched" in result.message
    assert panel.local_runs.list_runs(fresh=True) == [], "nothing was launched"
    fresh = panel.preview(values)
    assert fresh.fields == () and fresh.run_id != RUN, "a preview without an id gets a new one"
