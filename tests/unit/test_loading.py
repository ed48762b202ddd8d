"""Model loading: what is refused and how, random-weight folders, and the value model on top."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    BertConfig,
    LlamaConfig,
    LlavaConfig,
    PretrainedConfig,
    Qwen2Config,
    T5Config,
)

from relm.errors import UserError
from relm.models.loading import load_causal_lm, pick_dtype, resolve_model_dir
from relm.models.value_model import VALUE_HEAD_FILE, ValueModel, load_value_model
from tests.tiny_models import TINY_QWEN2

SMALL = TINY_QWEN2


def save_config(config: PretrainedConfig, folder: Path) -> str:
    config.save_pretrained(folder)
    return str(folder)


def save_model(config: PretrainedConfig, folder: Path, seed: int = 0) -> str:
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return str(folder)


def load(path: str, **kwargs):
    return load_causal_lm(path, dtype=torch.float32, device="cpu", **kwargs)


def test_missing_folders_are_named(tmp_path):
    for path in (str(tmp_path / "nope"), "./nope-relm-test", "~/nope-relm-test"):
        with pytest.raises(UserError, match="does not exist") as info:
            resolve_model_dir(path)
        assert path in str(info.value)


def test_folder_without_config_json(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(UserError, match="has no config.json") as info:
        resolve_model_dir(str(tmp_path))
    assert str(tmp_path) in str(info.value)
    with pytest.raises(UserError, match="is a file"):
        resolve_model_dir(str(tmp_path / "weights.bin"))


def test_hub_id_not_in_cache_says_so(monkeypatch: pytest.MonkeyPatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # no download attempt (test_hub_download.py)
    with pytest.raises(UserError, match="not in the local Hugging Face cache") as info:
        resolve_model_dir("relm-test-org/surely-not-cached-7f3a")
    assert "`relm-test-org/surely-not-cached-7f3a`" in str(info.value)


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        (
            BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4),
            "encoder-only",
        ),
        (Qwen2Config(**SMALL, architectures=["Qwen2ForMaskedLM"]), "encoder-only"),
        (T5Config(), "encoder-decoder"),
        (LlavaConfig(), "vision-language"),
    ],
)
def test_non_causal_models_are_refused(tmp_path, config, reason):
    with pytest.raises(UserError, match=reason):
        load(save_config(config, tmp_path))


def test_reward_model_checkpoint_is_accepted_as_a_decoder(tmp_path):
    config = Qwen2Config(**SMALL, architectures=["Qwen2ForSequenceClassification"])
    assert load(save_config(config, tmp_path)).config.model_type == "qwen2"


def test_overrides_apply_and_unknown_keys_are_named(tmp_path):
    folder = save_config(Qwen2Config(**SMALL), tmp_path)
    model = load(folder, override_config={"rms_norm_eps": 1e-3, "attn_implementation": "eager"})
    assert model.config.rms_norm_eps == 1e-3
    assert load(folder, override_config={"rope_theta": 5e5}).config.rope_parameters["rope_theta"] == 5e5
    assert model.config._attn_implementation == "eager"
    assert load(folder).config._attn_implementation == "sdpa"
    with pytest.raises(UserError, match="`rms_norm_epsilon`"):
        load(folder, override_config={"rms_norm_epsilon": 1e-3})


def test_config_only_folder_warns_and_builds_seeded_random_weights(tmp_path, caplog):
    folder = save_config(Qwen2Config(**SMALL, attention_dropout=0.1), tmp_path)
    rng_before = torch.random.get_rng_state()
    with caplog.at_level(logging.WARNING, logger="relm.models.loading"):
        first = load(folder, seed=3)
    assert "RANDOM weights" in caplog.text and folder in caplog.text
    assert torch.equal(torch.random.get_rng_state(), rng_before)  # the caller's RNG is left alone
    again, other = load(folder, seed=3), load(folder, seed=4)
    assert torch.equal(first.lm_head.weight, again.lm_head.weight)
    assert not torch.equal(first.lm_head.weight, other.lm_head.weight)
    assert first.config.attention_dropout == 0.0  # dropout off for deterministic logprobs
    assert load(folder, override_config={"attention_dropout": 0.2}).config.attention_dropout == 0.2


def test_folder_with_weights_loads_them_in_the_asked_dtype(tmp_path, caplog):
    folder = save_model(Qwen2Config(**SMALL), tmp_path / "m", seed=5)
    torch.manual_seed(5)
    reference = AutoModelForCausalLM.from_config(Qwen2Config(**SMALL))
    with caplog.at_level(logging.WARNING, logger="relm.models.loading"):
        model = load_causal_lm(folder, dtype=torch.bfloat16, device="cpu")
    assert "RANDOM" not in caplog.text
    assert model.dtype == torch.bfloat16
    assert torch.equal(model.lm_head.weight, reference.lm_head.weight.bfloat16())


def test_pick_dtype():
    assert pick_dtype("auto", "cpu") == torch.float32
    assert pick_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert pick_dtype("bfloat16", "cpu") == torch.bfloat16
    with pytest.raises(UserError, match="`float8`"):
        pick_dtype("float8", "cpu")


@pytest.mark.parametrize("config_class", [Qwen2Config, LlamaConfig])
def test_value_model_shapes_and_zero_start(tmp_path, config_class):
    folder = save_model(config_class(**SMALL), tmp_path / "m")
    value_model = load_value_model(folder, dtype=torch.float32, device="cpu")
    assert not any("lm_head" in name for name, _ in value_model.named_parameters())
    ids = torch.randint(1, 64, (3, 7))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    values = value_model(ids, mask, positions)
    assert values.shape == (3, 7) and values.dtype == torch.float32
    assert (values == 0).all()  # zero-initialised head
    values.sum().backward()
    assert value_model.value_head.weight.grad.abs().sum() > 0  # the head learns from step one


def test_value_model_bf16_still_returns_fp32(tmp_path):
    folder = save_model(Qwen2Config(**SMALL), tmp_path / "m")
    value_model = load_value_model(folder, dtype=torch.bfloat16, device="cpu")
    ids = torch.randint(1, 64, (2, 5))
    assert value_model(ids, torch.ones_like(ids), torch.arange(5).expand(2, 5)).dtype == torch.float32


def test_value_model_round_trip_and_checkpointing(tmp_path):
    folder = save_model(Qwen2Config(**SMALL), tmp_path / "m")
    value_model = load_value_model(folder, dtype=torch.float32, device="cpu")
    with torch.no_grad():
        value_model.value_head.weight.normal_()
        value_model.value_head.bias.fill_(0.25)
    ids = torch.randint(1, 64, (2, 6))
    mask, positions = torch.ones_like(ids), torch.arange(6).expand(2, 6)
    value_model.save_pretrained(tmp_path / "critic")
    assert (tmp_path / "critic" / VALUE_HEAD_FILE).is_file()
    restored = load_value_model(str(tmp_path / "critic"), dtype=torch.float32, device="cpu")
    torch.testing.assert_close(restored(ids, mask, positions), value_model(ids, mask, positions))

    restored.gradient_checkpointing_enable()
    restored.train()
    assert restored.backbone.is_gradient_checkpointing
    restored(ids, mask, positions).sum().backward()
    assert restored.backbone.embed_tokens.weight.grad is not None


def test_value_model_needs_a_backbone():
    class Bare(torch.nn.Module):
        base_model_prefix = ""

        @property
        def base_model(self):
            return self

    with pytest.raises(UserError, match="no backbone"):
        ValueModel(Bare())
