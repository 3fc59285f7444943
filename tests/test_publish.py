"""Push to Hub: a finished run's final adapter and a generated model card, into a model repo on the loopback fake
Hub through the real huggingface_hub client (create_repo, validate-yaml, preupload, LFS bytes, commit)."""

import json
import os
import zipfile

import pytest
import yaml

from backend.runs.access import Visitor
from panel import publish_view
from panel.actions import Panel
from tests.fakehub import FakeHub, FakeUser

ALICE = "hf_oauth_alicePushToken00000000000"
CAROL = "hf_oauth_carolPushToken00000000000"
DAVE = "hf_oauth_daveReadsAcmePush00000000"
FORM = {"executor": "hf_jobs", "name": "math-grpo", "model": "Qwen/Qwen2.5-0.5B-Instruct",
        "dataset": "trl-lib/DeepMath-103K", "bucket": "alice/grpo-runs", "flavor": "a10g-small", "rewards": ["format"],
        "max_steps": 3, "learning_rate": 2e-5, "lora_r": 16, "lora_alpha": 32, "reward_weights": "format=0.5"}
ADAPTER = {"adapter_config.json": json.dumps({"r": 16, "lora_alpha": 32, "peft_type": "LORA"}).encode(),
           "adapter_model.safetensors": b"\x00\x01weights-as-the-trainer-wrote-them"}


pytestmark = [pytest.mark.integration,
              pytest.mark.fake_hub(users={ALICE: FakeUser("alice", {"acme": "write"}), CAROL: FakeUser("carol"),
                                          DAVE: FakeUser("dave", {"acme": "read"})}),
              pytest.mark.panel_settings(budget_check_s=0)]


def finished_hub_run(hub: FakeHub, panel: Panel, visitor=None) -> str:
    """An HF Jobs run whose trainer finished: three logged steps and final/ in its bucket."""
    shown = panel.preview(FORM, visitor)
    run_id = panel.launch(FORM, visitor, confirmed=shown.fingerprint, run_id=shown.run_id).run_id
    assert run_id, shown.markdown
    records = [{"step": s, "time": 100.0 + s, "reward": 0.25 * s, "rewards/format": 0.1 * s} for s in (1, 2, 3)]
    hub.put_file("alice/grpo-runs", f"runs/{run_id}/metrics/trainer-000000.jsonl",
                 "".join(json.dumps(r) + "\n" for r in records).encode())
    for name, data in ADAPTER.items():
        hub.put_file("alice/grpo-runs", f"runs/{run_id}/final/{name}", data)
    [job] = hub.run_jobs.values()
    hub.set_stage(job.id, "RUNNING")
    hub.set_stage(job.id, "COMPLETED")
    return run_id


def test_the_final_adapter_and_a_card_of_the_run_are_pushed_to_a_private_repo(hub, make_panel):
    panel = make_panel()
    run_id = finished_hub_run(hub, panel)
    alice = Visitor(ALICE, "alice")
    repo_id = publish_view.suggested_repo_id(panel, run_id, alice)
    assert repo_id == "alice/math-grpo-lora"
    message = publish_view.push(panel, run_id, repo_id, True, alice)
    assert message.startswith(f"Pushed the final adapter of run {run_id} (alice on Hugging Face Jobs) to "
                              "[alice/math-grpo-lora]"), message
    assert "(private): 3 file(s) and a model card" in message, "the adapter's two files and its version.json"

    repo = hub.repos["alice/math-grpo-lora"]
    assert repo.private and repo.type == "model"
    assert {p: repo.files[p] for p in ADAPTER} == ADAPTER, "the bucket's bytes, unchanged"
    assert json.loads(repo.files["version.json"])["run_id"] == run_id, "which version it is, also from final/"
    assert repo.lfs == {"adapter_model.safetensors"}, "weights went through the LFS/Xet path"
    assert ("lfs-upload", "alice/math-grpo-lora", "adapter_model.safetensors") in hub.transfers
    posts = [r.path for r in hub.requests if r.method == "POST" and "/api/" in r.path]
    assert posts[-4:] == ["/api/repos/create", "/api/validate-yaml", "/api/models/alice/math-grpo-lora/preupload/main",
                          "/api/models/alice/math-grpo-lora/commit/main"]

    card = repo.files["README.md"].decode()
    meta = yaml.safe_load(card.split("---")[1])
    assert meta["base_model"] == "Qwen/Qwen2.5-0.5B-Instruct" and meta["library_name"] == "peft"
    assert meta["datasets"] == ["trl-lib/DeepMath-103K"] and "grpo" in meta["tags"]
    for text in ("| steps | 3 of 3 |", "| final reward (last logged step) | 0.75 |",
                 "| mean reward, last logged steps | 0.5 |", "| reward `format` (last step) | 0.3 |",
                 "r=16, alpha=32, dropout=0.0, target modules q_proj, k_proj, v_proj, o_proj",
                 "learning rate 2e-05, 3 steps", "format (weight 0.5)", "| Hardware | trainer on a10g-small |",
                 f"hf://buckets/alice/grpo-runs/runs/{run_id}", f"/jobs/alice/{next(iter(hub.run_jobs))}",
                 'PeftModel.from_pretrained(base, "alice/math-grpo-lora")',
                 "vllm serve Qwen/Qwen2.5-0.5B-Instruct --enable-lora --max-lora-rank 16",
                 "--lora-modules math-grpo-lora=alice/math-grpo-lora"):
        assert text in card, text
    assert ALICE not in card

    again = publish_view.push(panel, run_id, repo_id, True, alice)
    assert again.startswith("Pushed"), "pushing again to the same repo updates it"


def _evaluated(hub: FakeHub, run_id: str) -> None:
    """Three published versions, their held-out scores (the trainer's evals/ records), and best/ holding the best
    one, whose serving copy TRL has since deleted."""
    def put(path: str, data: bytes) -> None:
        hub.put_file("alice/grpo-runs", f"runs/{run_id}/{path}", data)

    events = [{"time": 100.0 + v, "event": "adapter_published", "name": f"trl-policy-v{v}", "step": v}
              for v in (1, 2, 3)]
    put("events/trainer-000000.jsonl", "".join(json.dumps(e) + "\n" for e in events).encode())
    for v in (1, 3):
        for name, data in ADAPTER.items():
            put(f"adapters/trl-policy-v{v}/{name}", _marked(name, data, f" v{v}"))
    scores = {1: 0.2, 2: 0.6, 3: 0.4}
    records = [{"time": 100.0 + v, "step": v, "policy_version": v, "n_prompts": 16, "samples_per_prompt": 1,
                "greedy": True, "score": s, "score_std": 0.1,
                "rewards": {"format": {"mean": s, "std": 0.1, "weight": 0.5, "solved": None},
                            "accuracy": {"mean": 0.25, "std": 0.4, "weight": 0.0, "solved": 0.25}}, "samples": []}
               for v, s in scores.items()]
    put("evals/trainer-000000.jsonl", "".join(json.dumps(r) + "\n" for r in records).encode())
    for name, data in ADAPTER.items():
        put(f"best/{name}", _marked(name, data, " best"))
    put("best/best.json", json.dumps({"policy_version": 2, "step": 2, "score": 0.6, "why": (
        "highest held-out score (weighted held-out reward: format x0.5) of 3 evaluated versions")}).encode())


def _marked(name: str, data: bytes, mark: str) -> bytes:
    """A copy's bytes told apart by `mark`: the weights end with it; the config stays JSON (it is shipped parsed)."""
    return data if name == "adapter_config.json" else data + mark.encode()


def test_the_best_version_is_pushed_by_default_from_the_page_with_a_card_saying_which_and_why(hub, make_panel):
    from tests.test_best_version import served

    panel = make_panel()
    run_id = finished_hub_run(hub, panel)
    _evaluated(hub, run_id)
    with served(panel) as client:
        message = client.predict(run_id, "alice/math-grpo-best", True, "", api_name="/on_push")
        assert message.startswith(f"Pushed the best version (trl-policy-v2) of run {run_id} (alice on Hugging Face "
                                  "Jobs) to [alice/math-grpo-best]")
        refused = client.predict(run_id, "alice/math-grpo-v9", True, "trl-policy-v9", api_name="/on_push")
        assert refused.startswith("**Not pushed.** version:") and "published no adapter 'trl-policy-v9'" in refused
        pruned = client.predict(run_id, "alice/math-grpo-v2", True, "trl-policy-v2", api_name="/on_push")
        assert pruned.startswith("Pushed trl-policy-v2"), "the best version's pruned copy is pushed from best/"
        third = client.predict(run_id, "alice/math-grpo-v3", True, "trl-policy-v3", api_name="/on_push")
        assert third.startswith(f"Pushed trl-policy-v3 of run {run_id}"), third
    assert set(hub.repos) == {"alice/math-grpo-best", "alice/math-grpo-v2", "alice/math-grpo-v3"}, \
        "nothing for the refused version"

    repo = hub.repos["alice/math-grpo-best"]
    assert repo.files["adapter_model.safetensors"] == ADAPTER["adapter_model.safetensors"] + b" best"
    card = repo.files["README.md"].decode()
    for text in ("## Which version", "| version | trl-policy-v2 |", "| step | 2 |",
                 ("the best version, trl-policy-v2 at step 2: highest held-out score (weighted held-out reward: "
                  "format x0.5) of 3 evaluated versions (equal scores: the earliest version wins); held-out score "
                  "0.600 ± 0.100 (best by the trained rewards' weighted score)"),
                 "| best version by (the rule) | the trained rewards' weighted score |",
                 "| held-out score by the rule | 0.600 ± 0.100 |",
                 "| trained score (held-out) | 0.6 ± 0.1 (weighted held-out reward: format x0.5) |",
                 "| held-out `accuracy` | mean 0.25, solved 25% (watched, weight 0) |"):
        assert text in card, (text, card[card.find("## Which version"):][:1500])
    assert hub.repos["alice/math-grpo-v2"].files["adapter_model.safetensors"].endswith(b" best")
    card3 = hub.repos["alice/math-grpo-v3"].files["README.md"].decode()
    assert "trl-policy-v3 at step 3, picked by hand: held-out score 0.400 ± 0.100" in card3
    assert "the best is trl-policy-v2 (0.600 ± 0.100)" in card3
    assert hub.repos["alice/math-grpo-v3"].files["adapter_model.safetensors"].endswith(b" v3")


def test_pushes_the_visitor_may_not_make_are_refused_and_create_nothing(hub, make_panel):
    panel = make_panel(on_space=True)
    alice = Visitor(ALICE, "alice")
    run_id = finished_hub_run(hub, panel, alice)
    cases = [(Visitor(), "alice/x-lora", "Sign in with Hugging Face to push"),
             (alice, "no-namespace", "repo_id: write it as 'namespace/name'"),
             (alice, "alice/bad--name", "repo_id: must not contain '--'"),
             (alice, "carol/stolen-lora", "You cannot write to carol; you can push to: acme, alice."),
             (Visitor(DAVE, "dave"), "acme/x-lora", "You cannot write to acme; you can push to: dave."),
             (Visitor(CAROL, "carol"), "carol/x-lora", f"no run '{run_id}' that you can see")]
    for visitor, repo_id, expected in cases:
        message = publish_view.push(panel, run_id, repo_id, True, visitor)
        assert message.startswith("**Not pushed.**") and expected in message, (repo_id, message)
    assert hub.repos == {}


def test_a_run_without_a_final_adapter_is_not_pushed(hub, make_panel):
    panel = make_panel()
    shown = panel.preview(FORM)
    run_id = panel.launch(FORM, confirmed=shown.fingerprint, run_id=shown.run_id).run_id
    message = publish_view.push(panel, run_id, "alice/early-lora", True, Visitor(ALICE, "alice"))
    assert "has no final adapter yet" in message and hub.repos == {}


@pytest.mark.full   # tier 2 only (~45 s loaded)
def test_a_local_runs_pushed_adapter_loads_with_peft(hub, make_panel):
    import torch
    from peft import PeftModel, get_peft_model_state_dict
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    panel = make_panel()
    result = panel.launch({"executor": "local", "name": "tiny-push", "max_steps": 6, "adapter_every": 3,
                           "checkpoint_every": 3})
    assert result.run_id, result.message
    view = panel.view(result.run_id)
    status = panel.local.wait(view.jobs["trainer"].job_id, timeout=300)
    assert status.stage == "COMPLETED", (status, list(view.jobs["trainer"].logs)[-20:])

    message = publish_view.push(panel, result.run_id, "alice/tiny-push-lora", False, Visitor())
    assert message.startswith("Pushed") and "(public)" in message, message
    repo = hub.repos["alice/tiny-push-lora"]
    assert not repo.private
    card = repo.files["README.md"].decode()
    assert "builtin:tiny-qwen2" in card and "| steps | 6 of 6 |" in card and "base_model:" not in card
    assert f"`runs/{result.run_id}` in the panel's local bucket `local/grpo-runs`" in card
    config = json.loads(repo.files["adapter_config.json"])
    assert config["base_model_name_or_path"] == "builtin:tiny-qwen2", "named as the user named it, not its folder"
    zip_path, _ = panel.adapter_version_zip(result.run_id, "final")
    with zipfile.ZipFile(zip_path) as zipped:
        assert {n: zipped.read(n) for n in zipped.namelist()} == {n: repo.files[n] for n in zipped.namelist()}
        assert sorted(zipped.namelist()) == sorted(repo.files), "the zip holds what the push committed, card too"
    for name, data in repo.files.items():
        assert panel.settings.home.encode() not in data and b"/tmp/" not in data, f"{name} names a local path"

    pushed = os.path.join(panel.settings.home, "pushed")
    os.makedirs(pushed)
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        with open(os.path.join(pushed, name), "wb") as f:
            f.write(repo.files[name])
    run_dir = os.path.join(panel.local.bucket_root("local/grpo-runs"), "runs", result.run_id)
    base = AutoModelForCausalLM.from_pretrained(os.path.join(run_dir, "base-model"))
    model = PeftModel.from_pretrained(base, pushed)
    loaded = get_peft_model_state_dict(model)
    trained = load_file(os.path.join(run_dir, "final", "adapter_model.safetensors"))
    assert loaded.keys() == trained.keys() and len(trained) > 0
    assert all(torch.equal(loaded[k], trained[k]) for k in trained)
    assert any(k.endswith("lora_B.weight") and trained[k].abs().sum() > 0 for k in trained), "the adapter was trained"
