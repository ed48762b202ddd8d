"""LoRA adapters: the reference is the base, merged weights reproduce the adapted model in a plain
copy, and a sync that does not reach the engine is caught."""

from __future__ import annotations

import pytest
import torch

from relm.learner.lora import (
    AdapterNotSynced,
    LoraSettings,
    adapters_disabled,
    add_lora,
    check_synced,
    has_lora,
    lora_layers,
    merged_weights,
    probe_name,
    without_adapters,
)
from relm.models.value_model import ValueModel
from relm.rollout.hf_engine import HFRolloutEngine
from tests.tiny_models import tiny_lm

pytest.importorskip("peft")

IDS = torch.tensor([[5, 9, 13, 2, 7], [1, 3, 3, 8, 60]])
RANK8 = LoraSettings(rank=8, alpha=16)


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits


def train_adapter(model: torch.nn.Module, seed: int = 1) -> None:
    """Stand in for optimizer steps: move every adapter matrix (B starts at zero)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, layer in lora_layers(model):
            for matrix in (layer.lora_A["default"].weight, layer.lora_B["default"].weight):
                matrix.add_(0.05 * torch.randn(matrix.shape, generator=generator))


def test_fresh_adapters_change_nothing_and_only_they_train():
    model, base = tiny_lm(), tiny_lm()
    trainable = add_lora(model, RANK8)
    # 7 adapted Linears a layer (q k v o gate up down), 2 layers, A [8, in] and B [out, 8] each.
    expected = sum(8 * (layer.in_features + layer.out_features) for _, layer in lora_layers(model))
    assert trainable == expected and len(list(lora_layers(model))) == 14
    assert all(("lora_" in n) == p.requires_grad for n, p in model.named_parameters())
    assert not any(name.startswith("lm_head") for name, _ in lora_layers(model))
    torch.testing.assert_close(logits(model), logits(base), rtol=0, atol=0)


def test_the_reference_is_the_base_with_adapters_off():
    model, base = tiny_lm(), tiny_lm()
    add_lora(model, RANK8)
    train_adapter(model)
    adapted = logits(model)
    assert (adapted - logits(base)).abs().max() > 1e-2
    with adapters_disabled(model):
        torch.testing.assert_close(logits(model), logits(base), rtol=0, atol=0)
    torch.testing.assert_close(logits(model), adapted, rtol=0, atol=0)


def test_a_plain_copy_synced_with_merged_weights_computes_the_adapted_model():
    model = tiny_lm()
    add_lora(model, RANK8)
    plain = without_adapters(model)
    assert not has_lora(plain) and has_lora(model)
    assert dict(plain.named_parameters()).keys() == dict(tiny_lm().named_parameters()).keys()
    engine = HFRolloutEngine(plain, pad_token_id=0, eos_token_ids=[1], device="cpu")

    train_adapter(model)
    name = probe_name(model)
    assert name == "model.layers.1.mlp.down_proj.weight"
    with pytest.raises(AdapterNotSynced, match="down_proj"):
        check_synced(model, plain, name)  # trained, not synced: the engine still holds the old policy
    engine.sync_weights(merged_weights(model))
    check_synced(model, plain, name)
    torch.testing.assert_close(logits(plain), logits(model), rtol=1e-5, atol=1e-5)


def test_the_check_catches_a_bf16_engine_that_missed_the_sync():
    model = tiny_lm()
    add_lora(model, RANK8)
    plain = without_adapters(model).to(torch.bfloat16)
    engine = HFRolloutEngine(plain, pad_token_id=0, eos_token_ids=[1], device="cpu")
    engine.sync_weights(merged_weights(model))
    check_synced(model, plain, probe_name(model))  # bit-equal after the cast, as the engine holds it
    train_adapter(model, seed=2)
    with pytest.raises(AdapterNotSynced):
        check_synced(model, plain, probe_name(model))


def test_a_critic_adapts_its_backbone_and_trains_its_whole_value_head():
    critic = ValueModel(tiny_lm())
    add_lora(critic.backbone, LoraSettings(rank=4, alpha=8, target_modules=["q_proj", "v_proj"]))
    trainable = {n for n, p in critic.named_parameters() if p.requires_grad}
    assert {"value_head.weight", "value_head.bias"} <= trainable
    assert all("lora_" in n for n in trainable - {"value_head.weight", "value_head.bias"})
    assert {n.rsplit(".", 1)[-1] for n, _ in lora_layers(critic)} == {"q_proj", "v_proj"}


def test_excluded_modules_keep_their_plain_layers():
    model = tiny_lm()
    add_lora(model, LoraSettings(rank=4, alpha=8, exclude_modules=["down_proj"]))
    names = {n.rsplit(".", 1)[-1] for n, _ in lora_layers(model)}
    assert "down_proj" not in names and "up_proj" in names


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("actor_rollout_ref.model.lora_rank=-1", "must be >= 0"),
        ("actor_rollout_ref.model.lora_adapter_path=/x", "set lora_rank to the adapter's rank"),
        ("critic.model.lora_alpha=0", None),  # rank 0: alpha is not read
        (
            "trainer.n_gpus_per_node=2 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "runs on one GPU for now",
        ),
    ],
)
def test_lora_settings_are_checked_before_anything_loads(override: str, message: str | None):
    from relm.config.loader import load_config
    from relm.config.validate import validate_config
    from relm.errors import UserError

    extra = (
        []
        if override.startswith(("actor_rollout_ref.model.lora_rank", "critic"))
        else ["actor_rollout_ref.model.lora_rank=8"]
    )
    if override.endswith("lora_adapter_path=/x"):
        extra = []
    cfg = load_config([*override.split(), *extra])
    if message is None:
        validate_config(cfg)
        return
    with pytest.raises(UserError, match=message):
        validate_config(cfg)
