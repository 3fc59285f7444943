"""The outcome of a run as the Runs tab shows it: held-out scores per adapter version, the best one marked and
chosen by default, any version downloaded through the page, "try it" refusing what it must, and one prompt followed
across steps and versions.

The evaluation's records are written here in the bucket format the trainer writes (`evals/` fragments, `best/`
with best.json: the contract in backend/outcome/best_version.py), into a synthetic live distributed run of 200 steps and
ten versions (benchmarks/dashboard_scale.py). Clicks go through a real Gradio server of the panel's own page
(gradio_client), in this process.
"""

import io
import json
import os
import shutil
import sys
import threading
import time
import urllib.request
import zipfile

import pytest
from gradio_client.exceptions import AppError

from backend.outcome.best_version import ChoiceError, choose, default_choice, version_choices
from backend.runs.access import Visitor
from backend.runtime import layout
from backend.runtime.check.try_adapter import AdapterRefused, lora_settings
from panel import adapters_table, chart_parts, dashboard, run_header, samples_table
from panel.actions import Panel, Settings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from dashboard_scale import SyntheticRun

from tests.helpers import answer_cells, served

SCORES = {1: 0.10, 2: 0.22, 3: 0.31, 4: 0.35, 5: 0.41, 6: 0.44, 7: 0.52, 8: 0.47, 9: 0.45, 10: 0.49}
BEST_BYTES = b"the best version's weights, kept in best/"


def write_evals(run: SyntheticRun, scores: dict[int, float] = SCORES, best: int = 7) -> None:
    """One evaluation record per version (two fragments, one torn record among them), and best/ as the trainer
    republishes it; the best version's serving copy then pruned, as TRL prunes old versions."""
    folder = os.path.join(run.run_dir, layout.EVALS_DIR)
    os.makedirs(folder)
    records = [{"time": run.t0 + 20 * v, "step": 20 * v, "policy_version": v, "n_prompts": 8, "samples_per_prompt": 1,
                "greedy": True, "score": s, "score_std": 0.05,
                "rewards": {"digits": {"mean": s, "std": 0.05, "weight": 1.0, "solved": None},
                            "accuracy": {"mean": s / 2, "std": 0.1, "weight": 0.0, "solved": 0.25}},
                "samples": [{"prompt_index": i, "prompt": f"held-out prompt {i}", "completion": f"v{v} says {i}",
                             "rewards": {"digits": s}} for i in range(2)]} for v, s in scores.items()]
    for seq, part in enumerate((records[:5], records[5:])):
        with open(os.path.join(folder, layout.fragment_name("trainer", seq)), "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in part) + ('{"score": "torn"}\n' if seq else ""))
    best_dir = os.path.join(run.run_dir, layout.BEST_DIR)
    os.makedirs(best_dir)
    for name, data in (("adapter_config.json", b'{"r": 8}'), ("adapter_model.safetensors", BEST_BYTES)):
        with open(os.path.join(best_dir, name), "wb") as f:
            f.write(data)
    with open(os.path.join(best_dir, "best.json"), "w") as f:
        json.dump({"policy_version": best, "step": 20 * best, "score": scores[best],
                   "why": f"highest held-out score (weighted held-out reward: digits x1) of {len(scores)} evaluated "
                          "versions"}, f)
    shutil.rmtree(os.path.join(run.run_dir, layout.ADAPTERS_DIR, layout.adapter_name(best)))


pytestmark = [pytest.mark.integration,
              pytest.mark.usefixtures("no_hub_login"), pytest.mark.panel_settings(budget_check_s=0)]


@pytest.fixture
def run(panel):
    run = SyntheticRun(panel.settings.home, 200)
    write_evals(run)
    return run


def downloaded(client, update) -> zipfile.ZipFile | None:
    """The file a download button was given, fetched from the server as the browser fetches it (None: no file)."""
    value = update.get("value") if isinstance(update, dict) else update
    if not value:
        return None
    path = value["path"] if isinstance(value, dict) else value
    with urllib.request.urlopen(f"{client.url}/gradio_api/file={path}", timeout=30) as response:
        return zipfile.ZipFile(io.BytesIO(response.read()))


def test_each_version_shows_its_held_out_score_and_the_best_is_marked_and_chosen_by_default(panel, run):
    view = panel.view(run.spec.run_id)
    view.refresh()
    rows = {row[0]: row for row in adapters_table.adapter_rows(view)}
    assert rows["trl-policy-v3"][1] == "0.310 ± 0.050"
    assert rows["trl-policy-v7"][1] == "★ best 0.520 ± 0.050"
    assert [name for name, row in rows.items() if "★" in row[1]] == ["trl-policy-v7"]
    assert "best **trl-policy-v7** (held-out 0.520 ± 0.050)" in run_header.status_markdown(view)
    assert view.unreadable[f"runs/{run.spec.run_id}/evals/trainer-000001.jsonl"] == 1, "the torn record is counted"
    assert default_choice(view) == "best"
    assert version_choices(view)[0] == ("best: trl-policy-v7 (held-out 0.520 ± 0.050)", "best")
    chosen = choose(view, None)
    assert chosen.name == "trl-policy-v7" and chosen.step == 140
    assert [os.path.basename(f.path) for f in chosen.files if f.path.endswith(".safetensors")] == [
        "adapter_model.safetensors"] and all("/best/" in f.path for f in chosen.files), "its serving copy is gone"
    assert "highest held-out score (weighted held-out reward: digits x1) of 10 evaluated versions" in chosen.why
    for bad in ("trl-policy-v99", "../../spec.json", "trl-policy-v1/../../x", "final"):
        with pytest.raises(ChoiceError):
            choose(view, bad)      # final/: the run has not finished


def test_any_version_downloads_through_the_page_and_a_version_the_run_never_published_is_refused(panel, run):
    run_id = run.spec.run_id
    with open(os.path.join(run.run_dir, "adapters", "trl-policy-v3", "adapter_model.safetensors"), "rb") as f:
        v3 = f.read()
    with served(panel) as client:
        button, message = client.predict(run_id, "trl-policy-v3", api_name="/on_version")
        zipped = downloaded(client, button)
        assert zipped.read("adapter_model.safetensors") == v3
        card = zipped.read("README.md").decode()      # the card a push writes, naming no path of this machine
        assert "| version | trl-policy-v3 |" in card and panel.settings.home not in card, card
        assert message.startswith("trl-policy-v3 at step 60, picked by hand: held-out score 0.310 ± 0.050")
        assert "the best is trl-policy-v7 (0.520 ± 0.050)" in message
        button, message = client.predict(run_id, "best", api_name="/on_version")
        assert downloaded(client, button).read("adapter_model.safetensors") == BEST_BYTES
        assert message.startswith("the best version, trl-policy-v7 at step 140: highest held-out score")
        for bad in ("trl-policy-v99", "../../../etc/passwd"):
            button, message = client.predict(run_id, bad, api_name="/on_version")
            assert downloaded(client, button) is None and "published no adapter" in message, message
        assert not [n for n in os.listdir(panel.downloads) if "v99" in n or "passwd" in n], "no file was built"
        button, message = client.predict("not-a-run", "best", api_name="/on_version")
        assert downloaded(client, button) is None and "No download" in message

        # "Try it": what it refuses before anything starts, and what it cannot answer.
        answer = client.predict(run_id, "x" * 5000, ["base"], 16, api_name="/on_try")
        assert answer[0] == "**Not tried.** Prompt: 5000 characters; at most 4000 can be tried.", answer
        with pytest.raises(AppError, match="greater than maximum value 256"):     # the slider's own bound
            client.predict(run_id, "2+2?", ["base"], 100000, api_name="/on_try")
        answer = client.predict(run_id, "2+2?", [], 16, api_name="/on_try")
        assert "Versions: pick" in answer[0]
        answer = client.predict("not-a-run", "2+2?", ["base"], 16, api_name="/on_try")
        assert answer[0].startswith("**Not tried.**") and "not-a-run" in answer[0]
        answer = client.predict(run_id, "2+2?", ["trl-policy-v99", "base"], 16, api_name="/on_try")
        assert answer[0].startswith("✅"), answer
        table = answer[1]
        cells = answer_cells(table)
        assert "published no adapter 'trl-policy-v99'" in cells["trl-policy-v99"][0]
        assert "base-model/ folder holds no model yet" in cells["base model"][0], cells


def test_one_prompt_is_followed_across_steps_and_versions(panel, run):
    samples = [{"time": run.t0 + s, "step": s, "policy_version": s // 20, "prompt": prompt, "completion": f"{s}",
                "rewards": {"digits": 0.5}, "advantage": 0.1, "length": 3, "truncated": False}
               for s in (10, 30, 50) for prompt in ("repeated prompt", f"once at {s}")]
    folder = os.path.join(run.run_dir, layout.SAMPLES_DIR)
    os.makedirs(folder)
    with open(os.path.join(folder, layout.fragment_name("trainer", 0)), "w") as f:
        f.write("".join(json.dumps(s) + "\n" for s in samples))
    view = panel.view(run.spec.run_id)
    view.refresh()
    prompts = dict(samples_table.sample_prompts(view))
    assert prompts["held-out #1: held-out prompt 1"] == "held-out:1"
    assert [label for label in prompts if label.startswith("training:")] == ["training: repeated prompt"]
    followed = samples_table.sample_rows(view, "latest", "held-out:1")
    assert [(r[0], r[1], r[3]) for r in followed] == [(20 * v, f"{v} (held-out)", f"v{v} says 1") for v in SCORES]
    training = samples_table.sample_rows(view, "latest", prompts["training: repeated prompt"])
    assert [(r[0], r[1], r[3]) for r in training] == [(10, 0, "10"), (30, 1, "30"), (50, 2, "50")]
    assert samples_table.sample_rows(view, "latest", "held-out:../x") == [] == samples_table.sample_rows(view, "latest",
                                                                                                  "training:nope")
    assert [r[3] for r in samples_table.sample_rows(view, "not a step")] == [], "a typed step that is no step"


def test_only_plain_lora_settings_are_taken_from_an_adapter_config():
    good = lora_settings({"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"], "peft_type": "LORA",
                          "base_model_name_or_path": "someone/huge-model", "init_lora_weights": "loftq",
                          "auto_mapping": {"base_model_class": "os.system"}})
    assert good["target_modules"] == ["q_proj", "v_proj"] and good["inference_mode"] is True
    assert not {"base_model_name_or_path", "init_lora_weights", "auto_mapping"} & set(good)
    hostile = {"a list": [], "peft_type": {"peft_type": "PREFIX_TUNING"}, "r": {"r": 10**9, "target_modules": ["q"]},
               "bool rank": {"r": True, "target_modules": ["q"]}, "alpha": {"lora_alpha": float("inf"),
                                                                            "target_modules": ["q"]},
               "modules": {"target_modules": ["q; import os"]}, "none": {"target_modules": []},
               "bias": {"bias": "all", "target_modules": ["q"]}}
    for case, config in hostile.items():
        with pytest.raises(AdapterRefused):
            lora_settings(config)
            pytest.fail(case)


def test_another_visitors_run_is_not_theirs_to_try_or_download(tmp_path, monkeypatch):
    """A panel that serves others (on a Space, local runs are its owner's): a visitor who is not the owner reaches
    neither the run's versions nor its "try it"."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    panel = Panel(Settings(home=str(tmp_path), on_space=True, local_runs="off", budget_check_s=0))
    try:
        run = SyntheticRun(str(tmp_path), 40)
        carol = Visitor("hf_oauth_carolTriesAliceRun000000", "carol")
        with pytest.raises(KeyError):
            panel.try_it(run.spec.run_id, carol, "hello", ["base"], 8)
        with pytest.raises(KeyError):
            panel.adapter_version_zip(run.spec.run_id, "trl-policy-v1", carol)
    finally:
        panel.shutdown()


def test_before_best_is_republished_the_highest_score_read_is_the_best_and_best_json_is_read_once_there(tmp_path,
                                                                                                      monkeypatch):
    from backend.outcome import held_out
    from backend.outcome.held_out import HeldOut
    from backend.storage.store import FolderStore

    monkeypatch.setattr(held_out, "BEST_RECHECK_S", 0.0)
    run = SyntheticRun(str(tmp_path), 200)
    write_evals(run)
    best_json = os.path.join(run.run_dir, layout.BEST_DIR, "best.json")
    os.rename(best_json, best_json + ".later")
    os.rename(os.path.join(run.run_dir, layout.BEST_DIR), os.path.join(run.run_dir, "_tmp-best"))
    held = HeldOut(FolderStore(os.path.join(str(tmp_path), "buckets", "local", "bench")), run.spec.run_id)
    assert held.refresh() and held.best_version == 7 and held.best_json == {} and held.best_files == []
    assert not held.refresh(), "nothing new"
    os.rename(os.path.join(run.run_dir, "_tmp-best"), os.path.join(run.run_dir, layout.BEST_DIR))
    os.rename(best_json + ".later", best_json)
    assert held.refresh(), "best/ arrived after the record that made it the best"
    assert held.best_json["policy_version"] == 7
    assert {os.path.basename(f.path) for f in held.best_files} == set(layout.ADAPTER_FILES), "not best.json"


def _outputs_until(job, seen, timeout_s: float = 120.0):
    """The job's newest message once `seen(message)` holds (a deadline against a hang, not a timing goal)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        messages = [out[0] for out in job.outputs() if isinstance(out, (list, tuple)) and out]
        if messages and seen(messages[-1]):
            return messages[-1]
        time.sleep(0.2)
    pytest.fail(f"never seen; last messages: {[out[0] for out in job.outputs()][-3:]}")


def test_visitors_tries_wait_in_line_through_the_page_each_seeing_their_place(panel, run, monkeypatch):
    """Three visitors (three page sessions) click "Try it" through Gradio's queue while one CPU try runs: a second
    try by the one running is refused, the others see their place as it moves, one who cancels gives it up, and
    the next gets an answer once the running try ends."""
    from gradio_client import Client

    from backend.outcome import try_it

    release, ran = threading.Event(), []

    def worker(box, scratch, base, adapters, with_base, messages, tokens, state, budget_s=None):
        prompt = messages[-1]["content"]
        ran.append(prompt)
        if prompt == "first":
            assert release.wait(120), "the test never released the first try"
        for label in state.routes:
            state.answers[label] = f"answer to {prompt}"
        yield state

    monkeypatch.setattr(try_it, "_run_worker", worker)
    base = os.path.join(run.run_dir, layout.BASE_MODEL_DIR)
    os.makedirs(base)
    for name, data in (("config.json", b"{}"), ("model.safetensors", b"weights")):
        with open(os.path.join(base, name), "wb") as f:
            f.write(data)
    run_id = run.spec.run_id
    with served(panel) as alice:
        # Visitors who are not signed in are counted by address: alice and bob come from this machine, carol (and
        # dave) from an address of their own, as uvicorn takes it from a proxy on loopback.
        bob = Client(alice.url, verbose=False)
        carol = Client(alice.url, verbose=False, headers={"X-Forwarded-For": "198.51.100.3"})
        dave = Client(alice.url, verbose=False)
        try:
            first = alice.submit(run_id, "first", ["base"], 8, api_name="/on_try")
            _outputs_until(first, lambda m: "Loading the base model" in m)
            _message, table = alice.predict(run_id, "again", ["base"], 8, api_name="/on_try")
            assert "one try at a time per visitor" in answer_cells(table)["base model"][0], table
            second = bob.submit(run_id, "second", ["base"], 8, api_name="/on_try")
            assert _outputs_until(second, lambda m: "in line" in m).startswith("⏳ 1st in line for this panel's CPU")
            _message, table = dave.predict(run_id, "a third from this address", ["base"], 8, api_name="/on_try")
            assert "2 tries from your address (127.0.0.1)" in answer_cells(table)["base model"][0], table
            third = carol.submit(run_id, "third", ["base"], 8, api_name="/on_try")
            assert _outputs_until(third, lambda m: "in line" in m).startswith("⏳ 2nd in line")
            second.cancel()        # bob leaves: carol moves up
            _outputs_until(third, lambda m: m.startswith("⏳ 1st in line"))
            release.set()
            message, table = third.result(timeout=120)
            assert message.startswith("✅"), message
            assert answer_cells(table)["base model"][0] == "answer to third"
            message, table = first.result(timeout=120)
            assert answer_cells(table)["base model"][0] == "answer to first"
            assert ran == ["first", "third"], "bob's try, given up in line, never ran; alice's second was refused"
        finally:
            release.set()
            for client in (bob, carol, dave):
                client.close()


def _write_records(run: SyntheticRun, scores: dict[int, float]) -> None:
    """One evaluation record per fragment, in version order (as the trainer writes them), without best/."""
    folder = os.path.join(run.run_dir, layout.EVALS_DIR)
    os.makedirs(folder, exist_ok=True)
    for seq, (version, score) in enumerate(sorted(scores.items())):
        with open(os.path.join(folder, layout.fragment_name("trainer", seq)), "w") as f:
            f.write(json.dumps({"time": run.t0 + version, "step": 20 * version, "policy_version": version,
                                "score": score, "rewards": {"digits": {"mean": score}}}) + "\n")


def test_the_runs_list_shows_each_runs_best_held_out_version_from_its_best_json_not_its_records(panel, run,
                                                                                                monkeypatch):
    from backend.outcome.best_version import change_best_by
    from backend.storage.store import FolderStore
    from panel.runs_list import RUNS_HEADERS

    hacked, fresh = SyntheticRun(panel.settings.home, 30), SyntheticRun(panel.settings.home, 20)
    _write_records(hacked, {0: 0.6, 1: 0.3, 2: 0.5})       # no version beats the base model: no best/
    _write_records(fresh, {0: 0.6})                         # only the base model evaluated so far
    read = []
    real_read = FolderStore.read_bytes
    monkeypatch.setattr(FolderStore, "read_bytes", lambda self, path, start=0: read.append(path) or real_read(
        self, path, start))

    def cells() -> dict[str, str]:
        return {row[0]: row[RUNS_HEADERS.index("best held-out")] for row in panel.runs_table()}

    assert cells() == {run.spec.run_id: "0.520 · v7", hacked.spec.run_id: "none beats base",
                       fresh.spec.run_id: ""}
    assert sorted(p for p in read if "/evals/" in p) == [
        f"runs/{r.spec.run_id}/evals/trainer-000000.jsonl" for r in sorted((hacked, fresh), key=lambda r: r.spec.run_id)
    ], "best.json, and where there is none the first record (the base model's), not every record"

    view = panel.view(run.spec.run_id)      # an open run: its held-out ranking, under the rule in force
    view.refresh()
    assert "held-out accuracy" in change_best_by(view, "accuracy")
    with open(os.path.join(run.run_dir, layout.BEST_DIR, "best.json"), "w") as f:
        json.dump({"policy_version": 3, "score": 0.0}, f)       # a stale best.json is not what an open run shows
    assert cells()[run.spec.run_id] == "0.260 · v7"


def _csv_rows(path: str) -> dict[str, dict]:
    import csv

    with open(path, newline="") as f:
        return {row["adapter"]: row for row in csv.DictReader(f)}


def test_one_number_per_version_in_the_header_the_table_the_picker_and_the_csv_under_the_runs_rule(panel, run):
    view = panel.view(run.spec.run_id)
    view.refresh()
    # A rule that weighs the monitor too: each version's score under it is 1.5 x its trained score.
    assert "**trl-policy-v7** (0.780, base model" not in panel.set_best_by(run.spec.run_id, "digits=1, accuracy=1")
    view.refresh()
    header = run_header.status_markdown(view)
    table = {row[0]: row[1] for row in adapters_table.adapter_rows(view)}
    picker = {value: label for label, value in version_choices(view)}
    csv_rows = _csv_rows(panel.heldout_csv(run.spec.run_id))
    assert "best **trl-policy-v7** (held-out 0.780) by held-out 1 x digits + 1 x accuracy" in header, header
    assert table["trl-policy-v7"] == "★ best 0.780" and table["trl-policy-v3"] == "0.465"
    assert picker["best"] == "best: trl-policy-v7 (held-out 0.780)"
    assert picker["trl-policy-v3"].endswith("held-out 0.465")
    assert f"{float(csv_rows['trl-policy-v7']['held_out_score']):.3f}" == "0.780"
    assert f"{float(csv_rows['trl-policy-v3']['held_out_score']):.3f}" == "0.465"
    v7 = csv_rows["trl-policy-v7"]
    assert v7["best_by"] == "held-out 1 x digits + 1 x accuracy" and v7["best"] == "yes"
    assert float(v7["trained_score"]) == 0.52, "the trained score is named so, apart from the rule's"
    assert float(v7["accuracy training weight"]) == 0.0 and float(v7["accuracy rule weight"]) == 1.0
    chart = dashboard.CHARTS["heldout"][1](view, chart_parts.ChartOptions())
    drawn = {trace["name"]: trace for trace in chart["data"]}
    held_line = drawn["held-out score (held-out 1 x digits + 1 x accuracy)"]
    assert held_line["y"][held_line["text"].index("v7")] == 0.78, "the chart draws the score that decided"
    assert "trained score" in drawn
    # The version line reads the current count: a version evaluated since the pick is counted.
    line = panel_version_line(view, "best")
    assert "of 10 evaluated versions" in line
    _write_records_after(run, {11: 0.30})
    view.refresh()
    assert "of 11 evaluated versions" in panel_version_line(view, "best")


def panel_version_line(view, choice: str) -> str:
    from panel.live import version_line

    _key, text = version_line(view, choice)
    return text()


def _write_records_after(run: SyntheticRun, scores: dict[int, float]) -> None:
    folder = os.path.join(run.run_dir, layout.EVALS_DIR)
    seq = len(os.listdir(folder))
    for version, score in sorted(scores.items()):
        with open(os.path.join(folder, layout.fragment_name("trainer", seq)), "w") as f:
            f.write(json.dumps({"time": run.t0 + version, "step": 20 * version, "policy_version": version,
                                "score": score, "score_std": 0.05,
                                "rewards": {"digits": {"mean": score, "std": 0.05, "weight": 1.0},
                                            "accuracy": {"mean": score / 2, "std": 0.1, "weight": 0.0}}}) + "\n")
        seq += 1


def test_when_no_version_beats_the_base_model_nothing_is_picked_and_final_says_the_alert_and_the_base_score(panel):
    hacked = SyntheticRun(panel.settings.home, 30)
    folder = os.path.join(hacked.run_dir, layout.EVALS_DIR)
    os.makedirs(folder)
    # The trained reward (digits) rises while the watched one (distinct) falls, and the rule weighs both: no version
    # beats the base model under it, and the newest one's answers are one digit repeated.
    with open(os.path.join(folder, layout.fragment_name("trainer", 0)), "w") as f:
        for v in range(6):
            digits, distinct = 0.1 + 0.15 * v, 0.9 - 0.16 * v
            f.write(json.dumps({
                "time": hacked.t0 + v, "step": 20 * v, "policy_version": v, "score": digits, "score_std": 0.05,
                "rewards": {"digits": {"mean": digits, "std": 0.1, "weight": 1.0},
                            "distinct": {"mean": distinct, "std": 0.1, "weight": 0.0}},
                "samples": [{"prompt_index": i, "prompt": f"p{i}",
                             "completion": "8888888888" if v == 5 else f"{i} 5 7 b"} for i in range(4)]}) + "\n")
    final = os.path.join(hacked.run_dir, layout.FINAL_DIR)
    os.makedirs(final)
    for name, data in (("adapter_config.json", b'{"r": 8}'), ("adapter_model.safetensors", b"gamed weights")):
        with open(os.path.join(final, name), "wb") as f:
            f.write(data)
    run_id = hacked.spec.run_id
    assert "no version beats the base model" in panel.set_best_by(run_id, "digits=1, distinct=1")
    view = panel.view(run_id)
    view.refresh()
    view.final_files = __import__("backend.storage.adapters", fromlist=["x"]).final_adapter_files(view.store, run_id)
    assert view.final_files and view.held_out.none_beats_base
    assert default_choice(view) is None, "nothing is picked for a download or a push"
    assert next(value for _label, value in version_choices(view)) == "final", "final/ can still be picked by hand"
    with pytest.raises(ChoiceError, match="no version beats the base model"):
        panel.adapter_version_zip(run_id, None)
    path, chosen = panel.adapter_version_zip(run_id, "final")
    assert "the base model's held-out score, best by held-out 1 x digits + 1 x distinct: 1.000" in chosen.why
    assert "No version beats the base model" in chosen.why and "Reward hacking suspected" in chosen.why, chosen.why
    card = zipfile.ZipFile(path).read("README.md").decode()
    assert "▲ **Warning:** reward hacking suspected" in card
    assert "| base model's held-out score by the rule | 1 |" in card
    assert "| best version by (the rule) | held-out 1 x digits + 1 x distinct |" in card
    assert "version.json" in zipfile.ZipFile(path).namelist()
