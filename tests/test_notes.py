"""A run's display name, notes and tags: saved in its folder (`runs/<id>/notes.json`) by who may cancel the run,
shown and found in the runs list (the name also heads the run's header); bad input refused with nothing written; a
file the panel did not write read with care."""

import json
import os

import pytest

from backend.runs.access import Visitor
from backend.runs.notes import (
    MAX_FILE_BYTES,
    MAX_NAME_CHARS,
    MAX_NOTE_CHARS,
    MAX_TAGS,
    NotesBook,
    notes_path,
    parse_notes,
    parse_tags,
)
from backend.storage.store import FolderStore
from panel import live
from panel.runs_list import RUNS_HEADERS
from tests.fakehub import FakeUser
from tests.helpers import launch_reviewed

ALICE = "hf_oauth_aliceNotesToken000000000"
DAVE = "hf_oauth_daveReadsAcmeNotes0000000"
FORM = {"executor": "hf_jobs", "model": "Qwen/Qwen2.5-0.5B-Instruct", "dataset": "trl-lib/DeepMath-103K",
        "bucket": "acme/grpo-runs", "flavor": "a10g-small", "rewards": ["format"], "max_steps": 100,
        "name": "math-lr"}

pytestmark = [pytest.mark.unit, pytest.mark.fake_hub(users={ALICE: FakeUser("alice", {"acme": "write"}),
                                          DAVE: FakeUser("dave", {"acme": "read"})}),
              pytest.mark.panel_settings(budget_check_s=0)]


@pytest.fixture
def space_run(hub, make_panel):
    """A Space panel and a run Alice launched in the acme org's bucket."""
    panel = make_panel(on_space=True)
    result, _ = launch_reviewed(panel, FORM, Visitor(ALICE, "alice"))
    assert result.run_id, result.message
    return panel, result.run_id


def stored(hub, run_id: str) -> dict | None:
    found = hub.buckets["acme/grpo-runs"].files.get(notes_path(run_id))
    return None if found is None else json.loads(found.data)


def listed(panel, visitor, query: str) -> list[tuple[str, str]]:
    """(run id, name cell) of the runs list's rows for the filter `query`."""
    return [(row[0], row[RUNS_HEADERS.index("name")]) for row in panel.runs_table(visitor, query=query)]


def test_the_runs_owner_saves_notes_and_tags_in_its_folder_and_the_list_finds_them(hub, space_run):
    panel, run_id = space_run
    alice = Visitor(ALICE, "alice")
    message = panel.save_notes(run_id, alice, "lr 5e-3 diverges after step 80", "baseline, #lr-sweep Baseline")
    assert message.startswith("Notes saved"), message
    record = stored(hub, run_id)
    assert record["text"] == "lr 5e-3 diverges after step 80" and record["tags"] == ["baseline", "lr-sweep"]
    assert panel.run_notes(run_id, alice).tags == ("baseline", "lr-sweep")
    [(shown, cell)] = listed(panel, alice, "")
    assert shown == run_id and cell.endswith("#baseline #lr-sweep"), cell
    assert listed(panel, alice, "lr-sweep") == listed(panel, alice, "#BASELINE") == [(run_id, cell)]
    assert listed(panel, alice, "ablation") == []


def test_a_visitor_who_cannot_cancel_the_run_cannot_write_its_notes(hub, space_run):
    panel, run_id = space_run
    assert panel.save_notes(run_id, Visitor(ALICE, "alice"), "mine", "kept").startswith("Notes saved")
    message = panel.save_notes(run_id, Visitor(DAVE, "dave"), "defaced", "spam")
    assert message.startswith("**Notes not saved.**") and "read-only" in message, message
    assert "Notes not saved" in panel.save_notes(run_id, Visitor(), "defaced", "spam")
    assert stored(hub, run_id)["text"] == "mine"


@pytest.mark.parametrize("text, tags, says", [
    ("fine", "two words, a/b", "Tag 'a/b'"),
    ("fine", "<script>", "Tag '\\<script\\>'"),
    ("fine", " ".join(f"t{i}" for i in range(MAX_TAGS + 1)), f"at most {MAX_TAGS}"),
    ("x" * (MAX_NOTE_CHARS + 1), "", f"keep it to {MAX_NOTE_CHARS:,}"),
    ("my token is " + "hf_" + "abcdefghijklmnopqrstuvwxyz0123", "", "looks like a token"),   # made up
])
def test_bad_notes_are_refused_saying_what_to_change_and_nothing_is_written(hub, space_run, text, tags, says):
    panel, run_id = space_run
    message = panel.save_notes(run_id, Visitor(ALICE, "alice"), text, tags)
    assert message.startswith("**Notes not saved.**") and says in message, message
    assert stored(hub, run_id) is None


def test_tags_are_split_on_commas_and_spaces_without_repeats():
    assert parse_tags(" baseline,#lr-sweep  v1.2:rc+1 BASELINE ,, ") == ("baseline", "lr-sweep", "v1.2:rc+1")
    assert parse_tags("") == ()


def test_a_notes_file_the_panel_did_not_write_gives_only_what_is_well_formed(tmp_path):
    store, book = FolderStore(str(tmp_path)), NotesBook()
    os.makedirs(tmp_path / "runs" / "r1")
    (tmp_path / "runs" / "r1" / "notes.json").write_text(json.dumps(
        {"text": "x" * (MAX_NOTE_CHARS + 50), "tags": ["ok", "not ok", 7, "<b>", "fine-too"]}))
    notes = book.read(store, "b", "r1")
    assert notes.tags == ("ok", "fine-too") and len(notes.text) == MAX_NOTE_CHARS
    os.makedirs(tmp_path / "runs" / "r2")
    (tmp_path / "runs" / "r2" / "notes.json").write_text(json.dumps({"text": "x" * MAX_FILE_BYTES, "tags": ["big"]}))
    (tmp_path / "runs" / "r3").mkdir()
    (tmp_path / "runs" / "r3" / "notes.json").write_text("[not json")
    assert book.read(store, "b", "r2").tags == () and book.read(store, "b", "r3").tags == ()
    assert book.read(store, "b", "absent").tags == ()


def test_the_runs_owner_renames_it_the_list_and_header_show_the_name_and_the_id_stays(hub, space_run):
    panel, run_id = space_run
    alice = Visitor(ALICE, "alice")
    assert panel.save_notes(run_id, alice, "lr 5e-3 diverges", "baseline").startswith("Notes saved")
    message = panel.rename_run(run_id, alice, "  lr 5e-3 · baseline (#2)  ")
    assert message.startswith(f"Run {run_id} (acme on Hugging Face Jobs) is now called `lr 5e-3 · baseline (#2)`"), \
        message
    record = stored(hub, run_id)
    assert record["name"] == "lr 5e-3 · baseline (#2)", record
    assert record["text"] == "lr 5e-3 diverges" and record["tags"] == ["baseline"], "a rename keeps the notes"
    [(shown, cell)] = listed(panel, alice, "")
    assert shown == run_id and cell == "lr 5e-3 · baseline (#2) · #baseline", cell
    assert listed(panel, alice, "baseline (#2)") == [(run_id, cell)], "the filter finds the new name"
    header = live.run_update(panel, run_id, {}, alice).values["status"]
    assert header.startswith(f"### lr 5e-3 · baseline (\\#2) · Run `{run_id}` — **"), header
    assert panel.save_notes(run_id, alice, "changed", "").startswith("Notes saved")
    assert stored(hub, run_id)["name"] == "lr 5e-3 · baseline (#2)", "saving notes keeps the name"
    assert panel.view(run_id, alice).run_id == run_id, "the run is still found by its id"
    # An empty name goes back to the name the run was launched with.
    assert "the name it was launched with" in panel.rename_run(run_id, alice, "")
    assert stored(hub, run_id)["name"] == "" and "(#2)" not in listed(panel, alice, "")[0][1]
    assert live.run_update(panel, run_id, {}, alice).values["status"].startswith(f"### math-lr · Run `{run_id}`")


def test_a_visitor_who_cannot_cancel_the_run_cannot_rename_it(hub, space_run):
    panel, run_id = space_run
    assert panel.rename_run(run_id, Visitor(ALICE, "alice"), "mine").startswith(f"Run {run_id} (")
    message = panel.rename_run(run_id, Visitor(DAVE, "dave"), "defaced")
    assert message.startswith("**Not renamed.**") and "read-only" in message, message
    assert panel.rename_run(run_id, Visitor(), "defaced").startswith("**Not renamed.**")
    assert stored(hub, run_id)["name"] == "mine"


@pytest.mark.parametrize("name, says", [
    ("x" * (MAX_NAME_CHARS + 1), f"keep it to {MAX_NAME_CHARS}"),
    ("two\nlines", "control or invisible character"),
    ("tab\there", "control or invisible character"),
    ("zero\u200bwidth", "control or invisible character"),
    ("evil\u202egnp.exe", "control or invisible character"),
    ("<img src=x onerror=alert(1)>", "not HTML"),
    ("a <b>bold</b> name", "not HTML"),
    ("run of " + "hf_" + "abcdefghijklmnopqrstuvwxyz0123", "looks like a token"),   # made up
])
def test_a_bad_name_is_refused_saying_what_to_change_and_nothing_is_written(hub, space_run, name, says):
    panel, run_id = space_run
    message = panel.rename_run(run_id, Visitor(ALICE, "alice"), name)
    assert message.startswith("**Not renamed.**") and says in message, message
    assert stored(hub, run_id) is None


def test_a_name_in_a_file_that_could_not_have_been_saved_is_not_shown():
    assert parse_notes(json.dumps({"name": "fine name", "tags": ["a"]}).encode()).name == "fine name"
    for bad in ("<script>x</script>", "a\nb", "x" * (MAX_NAME_CHARS + 1), 7, None):
        notes = parse_notes(json.dumps({"name": bad, "tags": ["a"]}).encode())
        assert notes.name == "" and notes.tags == ("a",), bad


def test_a_renamed_run_is_named_by_its_new_name_in_compare_mcp_and_the_run_pickers(hub, space_run):
    """Wherever a run is named, a rename shows: Compare's lines and settings, MCP's list_runs and run_status, the run
    pickers' choices (their values stay the run ids)."""
    from panel.compare_view import compare
    from panel.mcp_tools import PanelTools
    from panel.runs_view import run_choices

    panel, run_id = space_run
    alice = Visitor(ALICE, "alice")
    other, _ = launch_reviewed(panel, {**FORM, "name": "math-lr-2", "learning_rate": 2e-5}, alice)
    for each in (run_id, other.run_id):
        hub.put_file("acme/grpo-runs", f"runs/{each}/metrics/trainer-000000.jsonl",
                     "".join(json.dumps({"step": s, "time": 1_800_000_000.0 + s, "reward": 0.1 * s}) + "\n"
                             for s in (1, 2, 3)).encode())
    assert panel.rename_run(run_id, alice, "lr 5e-3 baseline").startswith(f"Run {run_id} (")

    figures, diff, _, _ = compare(panel, [run_id, other.run_id], "step", alice)
    names = [trace.name for trace in figures["reward"].data]
    assert names == [f"lr 5e-3 baseline · {run_id}", f"math-lr-2 · {other.run_id}"], names
    [name_row] = diff[diff["setting"] == "name"].values.tolist()
    assert name_row == ["name", "lr 5e-3 baseline", "math-lr-2"], name_row

    tools = PanelTools(panel)
    tools.visitor = lambda ctx: alice
    rows = {r["run"]: r["name"] for r in tools.list_runs(None)["runs"]}
    assert rows[run_id] == "lr 5e-3 baseline", rows
    status = tools.run_status(None, run_id)
    assert status["name"] == "lr 5e-3 baseline" and status["launch_name"] == "math-lr", status

    choices = {value: label for label, value in run_choices(panel, alice)}
    assert choices == {run_id: f"lr 5e-3 baseline · {run_id}", other.run_id: other.run_id}, choices
