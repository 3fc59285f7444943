"""Links planted in a run's folder are never followed: a run's own jobs write that folder, so on a local bucket the
visitor's training code can plant links to files outside it (`/etc/passwd`, a secret of the panel's machine).

The store (`FolderStore`) lists, sizes and reads regular files inside the run folder only, and writes and deletes
through real folders only. A download (through the panel's page, on a real Gradio server) and a push (to the fake
Hub through the real huggingface_hub client, from the page too) take only the adapter's own files: with links in a
version folder, in `final/`, in `best/` and as a version folder, nothing from outside is zipped or pushed.
"""

import json
import os
import zipfile

import pytest

from backend.runtime import layout
from backend.storage.store import FolderStore
from tests.fakehub import FakeUser
from tests.helpers import answer_cells
from tests.test_best_version import SyntheticRun, downloaded, served, write_evals

SECRET = b"planted-outside-secret-" + b"Qx71" * 6
PASSWD = b"root:x:0:0"
ALICE = "hf_" + "aliceLinksHostToken" + "0" * 16
V3_WEIGHTS = b"the real weights of version 3 " * 8
pytestmark = [pytest.mark.integration,
              pytest.mark.fake_hub(users={ALICE: FakeUser("alice")})]     # alice's token is the host's


@pytest.fixture
def outside(tmp_path):
    """A folder outside every bucket, holding a secret and a whole fake adapter (to plant as a version folder)."""
    folder = tmp_path / "outside"
    (folder / "adapter").mkdir(parents=True)
    (folder / "secret.txt").write_bytes(SECRET)
    (folder / "adapter" / "adapter_config.json").write_bytes(b'{"r": 8, "secret": "' + SECRET + b'"}')
    (folder / "adapter" / "adapter_model.safetensors").write_bytes(SECRET * 4)
    return folder


def plant(folder: str, outside) -> None:
    """Links in `folder`: to /etc/passwd, to the secret under names the adapter's own files take, to a folder."""
    os.symlink("/etc/passwd", os.path.join(folder, "passwd"))
    os.symlink(str(outside / "secret.txt"), os.path.join(folder, "adapter_model.bin"))
    os.symlink(str(outside / "secret.txt"), os.path.join(folder, "tokenizer.json"))
    os.symlink(str(outside), os.path.join(folder, "more"))
    os.mkfifo(os.path.join(folder, "pipe"))
    with open(os.path.join(folder, "README.md"), "wb") as f:    # a regular file, but none of the adapter's own
        f.write(b"a job's own note " + SECRET)


def test_the_store_lists_and_reads_regular_files_inside_the_bucket_only(tmp_path, outside):
    store = FolderStore(str(tmp_path / "bucket"))
    run = tmp_path / "bucket" / "runs" / "r1"
    (run / "metrics").mkdir(parents=True)
    (run / "metrics" / "trainer-000000.jsonl").write_text('{"step": 1}\n')
    plant(str(run / "metrics"), outside)
    os.symlink(str(outside), str(run / "evals"))                      # a folder of the run that is a link
    os.symlink(str(outside), str(tmp_path / "bucket" / "runs" / "r2"))    # a whole run that is a link

    assert [f.path for f in store.list_files("runs")] == ["runs/r1/metrics/README.md",
                                                          "runs/r1/metrics/trainer-000000.jsonl"]
    assert store.list_files("runs/r1/evals") == [] and store.list_files("runs/r2") == []
    for path in ("runs/r1/metrics/passwd", "runs/r1/metrics/adapter_model.bin", "runs/r1/metrics/more/secret.txt",
                 "runs/r1/evals/secret.txt", "runs/r2/secret.txt", "runs/r1/metrics/pipe"):
        with pytest.raises(FileNotFoundError):
            store.read_bytes(path)
        assert store.sizes([path]) == {}, path
    for path in ("../outside/secret.txt", "runs/../../outside/secret.txt"):
        with pytest.raises(ValueError):
            store.read_bytes(path)
    assert store.read_bytes("runs/r1/metrics/trainer-000000.jsonl") == b'{"step": 1}\n'

    # Writes and deletions go through real folders only: nothing outside is written or removed.
    for path in ("runs/r1/evals/new.jsonl", "runs/r2/new.jsonl", "runs/r1/metrics/more/new.jsonl"):
        with pytest.raises(OSError):
            store.write_bytes(path, b"x")
    store.write_bytes("runs/r1/metrics/passwd", b"replaced")      # replaces the link itself, never its target
    assert os.path.isfile(run / "metrics" / "passwd") and not os.path.islink(run / "metrics" / "passwd")
    store.delete_folder("runs/r1/evals")          # the link goes, what it points to stays
    store.delete_folder("runs/r2/adapter")        # through a linked run: nothing
    store.delete_folder("runs/r1/metrics/more/adapter")
    assert not os.path.lexists(run / "evals") and (outside / "secret.txt").read_bytes() == SECRET
    assert sorted(os.listdir(outside)) == ["adapter", "secret.txt"]
    assert sorted(os.listdir(outside / "adapter")) == ["adapter_config.json", "adapter_model.safetensors"]


@pytest.fixture
def linked_run(tmp_path, outside, monkeypatch, hub, make_panel):
    """A local run with ten versions and held-out scores, its adapters' folders laced with links: version 3 holds
    links among its real files, final/ and best/ too, and version 5 is itself a link to a folder outside."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    panel = make_panel(budget_check_s=0)
    run = SyntheticRun(str(tmp_path / "home"), 200)
    write_evals(run)
    adapters = os.path.join(run.run_dir, layout.ADAPTERS_DIR)
    v3 = os.path.join(adapters, "trl-policy-v3")
    with open(os.path.join(v3, "adapter_model.safetensors"), "wb") as f:
        f.write(V3_WEIGHTS)
    plant(v3, outside)
    final = os.path.join(run.run_dir, layout.FINAL_DIR)
    os.makedirs(final)
    for name in layout.ADAPTER_FILES:      # the config stays JSON: it is shipped parsed (its base model renamed)
        with open(os.path.join(final, name), "wb") as f:
            f.write(b'{"r": 8}' if name == "adapter_config.json" else b"final " + name.encode())
    plant(final, outside)
    plant(os.path.join(run.run_dir, layout.BEST_DIR), outside)
    v5 = os.path.join(adapters, "trl-policy-v5")
    os.rename(v5, os.path.join(run.run_dir, "v5-moved-away"))
    os.symlink(str(outside / "adapter"), v5)
    return panel, run


def assert_only_the_adapters_own(files: dict[str, bytes], where: str, card: bool = False) -> None:
    assert set(files) <= set(layout.SHIPPED_ADAPTER_FILES) | ({"README.md"} if card else set()), (where, sorted(files))
    for name, data in files.items():
        assert SECRET not in data and PASSWD not in data, f"{where}: {name} holds a file from outside the bucket"


def test_downloads_and_pushes_from_the_page_take_only_the_adapters_own_files(linked_run, hub):
    panel, run = linked_run
    run_id = run.spec.run_id
    with served(panel) as client:
        zips = {}
        for choice in ("trl-policy-v3", "final", "best", "trl-policy-v5"):
            button, message = client.predict(run_id, choice, api_name="/on_version")
            archive = downloaded(client, button)
            zips[choice] = {n: archive.read(n) for n in archive.namelist()} if archive else None
            if archive:
                assert_only_the_adapters_own(zips[choice], f"the {choice} zip", card=True)
        assert zips["trl-policy-v3"]["adapter_model.safetensors"] == V3_WEIGHTS, "the real files are zipped"
        assert set(zips["trl-policy-v3"]) == {"adapter_config.json", "adapter_model.safetensors", "version.json",
                                              "README.md"}, "the adapter's own files and the card a push writes"
        # final/ and best/ hold no version.json of their own here: the panel writes what the run's records know.
        assert set(zips["final"]) == set(zips["best"]) == {*layout.ADAPTER_FILES, "version.json", "README.md"}
        assert "the panel" in json.loads(zips["final"]["version.json"])["written_by"]
        assert zips["trl-policy-v5"] is None, "a version folder that is a link is not there"

        pushed = {}
        for choice in ("trl-policy-v3", "final", "best", "trl-policy-v5"):
            repo_id = f"alice/links-{choice.replace('trl-policy-', '')}"
            message = client.predict(run_id, repo_id, True, choice, api_name="/on_push")
            pushed[choice] = message
            if message.startswith("Pushed"):
                assert_only_the_adapters_own(hub.repos[repo_id].files, f"the {choice} push", card=True)
        assert pushed["trl-policy-v3"].startswith("Pushed") and pushed["final"].startswith("Pushed"), pushed
        assert hub.repos["alice/links-v3"].files["adapter_model.safetensors"] == V3_WEIGHTS
        assert set(hub.repos["alice/links-final"].files) == {*layout.ADAPTER_FILES, "version.json", "README.md"}
        assert pushed["trl-policy-v5"].startswith("**Not pushed.**"), pushed["trl-policy-v5"]
        assert "alice/links-v5" not in hub.repos
    for name in os.listdir(panel.downloads):
        with zipfile.ZipFile(open(os.path.join(panel.downloads, name), "rb")) as archive:
            assert_only_the_adapters_own({n: archive.read(n) for n in archive.namelist()}, name, card=True)
    assert json.loads(zips["trl-policy-v3"]["version.json"])["version"] == 3


def test_try_it_never_loads_a_base_model_through_a_link_in_the_run_folder(linked_run, outside, monkeypatch):
    from backend.outcome import try_it

    panel, run = linked_run
    monkeypatch.setattr(try_it, "_run_worker", lambda *a, **k: pytest.fail("the try went ahead"))
    base = os.path.join(run.run_dir, layout.BASE_MODEL_DIR)
    os.makedirs(base)
    with open(os.path.join(base, "config.json"), "w") as f:
        f.write("{}")
    os.symlink(str(outside / "secret.txt"), os.path.join(base, "model.safetensors"))
    with served(panel) as client:
        _message, table = client.predict(run.spec.run_id, "2+2?", ["base"], 8, api_name="/on_try")
    cells = answer_cells(table)
    assert "base-model/ folder holds links, which a try never follows" in cells["base model"][0], cells
