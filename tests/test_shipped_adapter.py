"""What the panel ships of an adapter version (`publish.shipped_adapter`): the zip a visitor downloads and the
commit a push makes hold the same files and the same card, and no file names a path of the panel's machine
(PEFT writes the folder the trainer loaded the base model from into adapter_config.json)."""

import json
import zipfile
from types import SimpleNamespace

import pytest

from backend.outcome.best_version import FINAL, choose
from backend.outcome.publish import PublishError, base_model_name, portable_config, push_adapter, shipped_adapter
from backend.plan.engines import engine
from backend.runs.registry import write_adapter_zip
from backend.runtime import layout
from backend.storage.adapters import final_adapter_files
from backend.storage.store import FolderStore
from backend.view.runview import RunView
from tests.fakehub import FakeUser

ALICE = "hf_oauth_aliceShipsToken0000000000"
WEIGHTS = b"\x00\x01weights-as-the-trainer-wrote-them"

pytestmark = [pytest.mark.unit, pytest.mark.fake_hub(users={ALICE: FakeUser("alice")})]


def finished_local_run(tmp_path, model: str, loaded_from: str) -> RunView:
    """A local run's folder as its trainer leaves it: spec.json, a few steps, final/ whose adapter_config.json
    names the folder the base model was loaded from on this machine."""
    run = tmp_path / "bucket" / "runs" / "r1"
    (run / "final").mkdir(parents=True)
    spec = {"run_id": "r1", "name": "tiny", "model": model, "executor": "local", "mode": "colocated",
            "bucket": "local/grpo-runs", "rewards": ["digits"], "max_steps": 2, "lora_r": 8, "seed": 3}
    (run / "spec.json").write_text(json.dumps(spec))
    layout.FragmentWriter(str(run / "metrics"), layout.TRAINER_WRITER).write(
        [{"step": s, "time": float(s), "reward": 0.5 * s, "rewards/digits": 0.5 * s} for s in (1, 2)])
    config = {"r": 8, "lora_alpha": 16, "peft_type": "LORA", "base_model_name_or_path": loaded_from}
    (run / "final" / "adapter_config.json").write_text(json.dumps(config))
    (run / "final" / "adapter_model.safetensors").write_bytes(WEIGHTS)
    (run / "final" / "optimizer.pt").write_bytes(b"not the adapter's")
    view = RunView("r1", FolderStore(str(tmp_path / "bucket")), executor=None, jobs={})
    view.refresh()
    view.final_files = final_adapter_files(view.store, "r1")
    return view


def local_registry():
    """What the card asks of a run's registry: its job records (none listed here) and where it ran."""
    return SimpleNamespace(job_records=lambda run_id: [], engine=engine("local"))


def test_the_zip_and_the_push_ship_the_same_files_and_card_naming_the_builtin_model_not_this_machine(hub, tmp_path):
    here = str(tmp_path / "home" / "runs" / "r1" / "base-model")
    view = finished_local_run(tmp_path, "builtin:tiny-qwen2", here)
    registry, chosen = local_registry(), choose(view, FINAL)
    zipped = zipfile.ZipFile(write_adapter_zip(registry, view, chosen, str(tmp_path), "alice/tiny-lora"))
    in_zip = {name: zipped.read(name) for name in zipped.namelist()}

    push_adapter("r1", shipped_adapter(registry, view, chosen, "alice/tiny-lora"), "alice/tiny-lora", ALICE)
    pushed = hub.repos["alice/tiny-lora"].files
    assert sorted(in_zip) == ["README.md", "adapter_config.json", "adapter_model.safetensors",
                              "version.json"], "no optimizer.pt"
    said = json.loads(in_zip["version.json"])      # final/ held none: the panel writes what the records know
    assert said["name"] == chosen.name and said["run_id"] == "r1" and "panel" in said["written_by"]
    assert {name: pushed[name] for name in in_zip} == in_zip, "the zip holds exactly what the push committed"
    assert json.loads(in_zip["adapter_config.json"])["base_model_name_or_path"] == "builtin:tiny-qwen2"
    assert json.loads(in_zip["adapter_config.json"])["r"] == 8 and in_zip["adapter_model.safetensors"] == WEIGHTS
    card = in_zip["README.md"].decode()
    assert "# tiny-lora" in card and "| version | final |" in card and "python -m runtime.tiny_model" in card
    for data in in_zip.values():
        assert str(tmp_path).encode() not in data and b"/tmp/" not in data and b"/home/" not in data


def test_a_local_model_folder_is_named_by_its_folder_name_alone(tmp_path):
    folder = "/home/someone/models/my-qwen"
    view = finished_local_run(tmp_path, folder, folder + "/")
    files = shipped_adapter(local_registry(), view, choose(view, FINAL), "alice/tiny-lora")
    assert json.loads(files["adapter_config.json"])["base_model_name_or_path"] == "my-qwen"
    card = files["README.md"].decode()
    assert "/home/someone" not in card and "a local model folder named `my-qwen`" in card
    assert "| Base model | my-qwen (a local model folder) |" in card


def test_a_downloaded_zip_names_a_placeholder_repo_where_the_push_target_is_unknown(tmp_path):
    view = finished_local_run(tmp_path, "builtin:tiny-qwen2", "/tmp/x/base-model")
    path = write_adapter_zip(local_registry(), view, choose(view, FINAL), str(tmp_path), None)
    card = zipfile.ZipFile(path).read("README.md").decode()
    assert 'PeftModel.from_pretrained(base, "your-namespace/tiny-lora")' in card


def test_a_hub_models_config_is_shipped_as_written_and_a_broken_one_is_refused():
    spec = {"model": "Qwen/Qwen2.5-0.5B-Instruct"}
    written = json.dumps({"r": 8, "base_model_name_or_path": "Qwen/Qwen2.5-0.5B-Instruct"}).encode()
    assert portable_config(written, spec) is written and base_model_name(spec) == "Qwen/Qwen2.5-0.5B-Instruct"
    assert json.loads(portable_config(b'{"base_model_name_or_path": "/root/.cache/hub/x"}', spec)) == {
        "base_model_name_or_path": "Qwen/Qwen2.5-0.5B-Instruct"}
    for broken in (b"{not json", b"[1, 2]"):
        with pytest.raises(PublishError, match="adapter_config.json"):
            portable_config(broken, spec)
