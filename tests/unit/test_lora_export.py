"""Every LoRA recipe of docs/lora.md exports, as a PEFT folder and merged, from any folder, and each reloads in
plain transformers / PEFT to the trained policy (issue 37: a run given a relative model.path recorded it as
the base, and the demo recipe, whose adapted output head is tied to the embedding, did not export at all:
"its LoRA adapter has 31 tensors, this model's 30")."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from relm.cli import main as relm_main
from relm.config.loader import load_config
from relm.config.translate import translate
from relm.learner.lora import lora_layers
from relm.models.loading import resolve_model_dir
from relm.trainer.checkpoint import save_checkpoint
from relm.trainer.components import build_components

peft = pytest.importorskip("peft")

RECIPES = {
    "all-linear": [],
    "demo, output head included": [
        "actor_rollout_ref.model.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,lm_head]"
    ],
}
"""docs/lora.md's recipes: the default targets, and the demo's (every Linear and the tied `lm_head`)."""
IDS = torch.tensor([[2, 40, 41, 42, 3, 2, 50, 51]])


@pytest.fixture(params=list(RECIPES), scope="module")
def lora_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """A LoRA run's checkpoint, trained from a model given by a RELATIVE path, with adapters moved off zero.

    Returns (run folder, base model folder, logits of the trained policy on IDS).
    """
    root = tmp_path_factory.mktemp("lora")
    base = root / "models" / "tiny"
    shutil.copytree(resolve_model_dir("zoo:tiny/qwen2"), base)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)  # model.path=models/tiny, as a user in their project folder writes it
        cfg = load_config(["data.train_batch_size=4", "actor_rollout_ref.rollout.n=2",
                           "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                           "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
                           "actor_rollout_ref.model.path=models/tiny", "actor_rollout_ref.model.lora_rank=8",
                           *RECIPES[request.param], f"trainer.default_local_dir={root / 'run'}"])  # fmt: skip
        c = build_components(translate(cfg)[0], resolve_model_dir(cfg.actor_rollout_ref.model.path))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _, layer in lora_layers(c.actor.module):
            weight = layer.lora_B["default"].weight
            weight.copy_(0.05 * torch.randn(weight.shape, generator=generator))
        logits = c.actor.module(input_ids=IDS).logits
    save_checkpoint(c, 1)
    return root / "run", base, logits


def test_both_exports_reload_in_plain_transformers_from_another_folder(lora_run, tmp_path, monkeypatch):
    run_dir, base, expected = lora_run
    adapter_config = json.loads((run_dir / "global_step_1" / "actor" / "adapter_config.json").read_text())
    assert adapter_config["base_model_name_or_path"] == str(base)  # absolute, not models/tiny
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert relm_main(["export", str(run_dir), "adapter"]) == 0
    assert relm_main(["export", str(run_dir), "merged", "--merge"]) == 0
    assert not (elsewhere / "merged" / "adapter_config.json").exists()
    with torch.no_grad():
        merged = AutoModelForCausalLM.from_pretrained(elsewhere / "merged").eval()(input_ids=IDS).logits
        via_transformers = (
            AutoModelForCausalLM.from_pretrained(elsewhere / "adapter").eval()(input_ids=IDS).logits
        )
        plain_base = AutoModelForCausalLM.from_pretrained(base)
        via_peft = (
            peft.PeftModel.from_pretrained(plain_base, elsewhere / "adapter").eval()(input_ids=IDS).logits
        )
        base_logits = AutoModelForCausalLM.from_pretrained(base).eval()(input_ids=IDS).logits
    assert (expected - base_logits).abs().max() > 1e-3  # the adapters change the policy
    torch.testing.assert_close(via_transformers, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(via_peft, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(merged, expected, rtol=1e-5, atol=1e-5)


def test_a_base_that_is_not_found_names_base(lora_run, tmp_path, monkeypatch, capsys):
    """A checkpoint naming its base by a relative path (as relm wrote them before) exports from elsewhere only
    with --base, and says so in one line; --base also goes into the exported PEFT folder's config."""
    run_dir, base, expected = lora_run
    old_run = tmp_path / "old_run"
    shutil.copytree(run_dir, old_run)
    config_file = old_run / "global_step_1" / "actor" / "adapter_config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, "base_model_name_or_path": "models/tiny"}))
    monkeypatch.chdir(tmp_path)
    # `models/tiny` also reads as a Hub id: no download attempt, whatever the network.
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    capsys.readouterr()
    assert relm_main(["export", str(old_run), "merged", "--merge"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "--base" in err and "models/tiny" in err and "\n" not in err, err
    assert relm_main(["export", str(old_run), "merged", "--merge", "--base", str(base)]) == 0
    assert relm_main(["export", str(old_run), "adapter", "--base", str(base)]) == 0
    exported = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert exported["base_model_name_or_path"] == str(base)
    with torch.no_grad():
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()(input_ids=IDS).logits
    torch.testing.assert_close(merged, expected, rtol=1e-5, atol=1e-5)
