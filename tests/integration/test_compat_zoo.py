"""`relm compat --zoo tiny` end to end: every decoder-only architecture in the tiny zoo loads,
generates and trains on CPU with no hand-set condition, and a renamed architecture passes once
registered."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import MistralConfig

from relm.compat.cli import main, zoo_models
from relm.models.char_tokenizer import build_char_tokenizer
from relm.models.registry import unregister_model_class

pytestmark = pytest.mark.integration


def _models(out: Path) -> dict[str, dict]:
    return {report["model"]: report for report in json.loads((out / "compat.json").read_text())["models"]}


def test_every_tiny_zoo_model_passes_without_conditions(tmp_path):
    assert main(["--zoo", "tiny", "--device", "cpu", "--out", str(tmp_path)]) == 0
    reports = _models(tmp_path)
    assert list(reports) == zoo_models("tiny")
    assert {name: r["status"] for name, r in reports.items()} == dict.fromkeys(reports, "pass")
    assert all(not r["conditions"] for r in reports.values())
    # The study's crash case: Gemma-2 with no pad token passes, with relm's choice reported.
    assert "pad token '<|pad|>' (id 0): the tokenizer names none" in reports["zoo:tiny/gemma2"]["decisions"]
    assert (
        "eager attention: sdpa would skip the attention soft-capping"
        in reports["zoo:tiny/gemma2"]["decisions"]
    )
    # The study's whitelist failure: a renamed architecture runs by its model_type.
    assert any("config names StarlingLmForCausalLM" in d for d in reports["zoo:tiny/starling"]["decisions"])
    for name in ("zoo:tiny/qwen2-moe", "zoo:tiny/qwen3-moe", "zoo:tiny/mixtral"):
        update = next(stage for stage in reports[name]["stages"] if stage["name"] == "update")["metrics"]
        assert update["actor/grad_norm"] > 0 and update["actor_weights_changed"] >= 0.5, name


@pytest.fixture
def renamed_mistral(tmp_path) -> str:
    """A folder transformers cannot read: model_type and architecture it has never heard of."""
    folder = tmp_path / "starling"
    MistralConfig(
        vocab_size=101, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=64, max_position_embeddings=256, pad_token_id=0, bos_token_id=1,
        eos_token_id=3,
    ).save_pretrained(folder)  # fmt: skip
    build_char_tokenizer().save_pretrained(folder)
    raw = json.loads((folder / "config.json").read_text())
    raw |= {"model_type": "starling_lm", "architectures": ["StarlingLmForCausalLM"]}
    (folder / "config.json").write_text(json.dumps(raw))
    yield str(folder)
    unregister_model_class("StarlingLmForCausalLM")


def test_unknown_architecture_fails_with_how_to_register_then_passes(renamed_mistral, tmp_path):
    assert main([renamed_mistral, "--device", "cpu", "--out", str(tmp_path / "before")]) == 3
    before = _models(tmp_path / "before")[renamed_mistral]
    assert (before["status"], before["failed_stage"]) == ("fail", "load")
    assert "--register StarlingLmForCausalLM=MistralForCausalLM" in before["stages"][0]["error"]

    register = ["--register", "StarlingLmForCausalLM=MistralForCausalLM"]
    assert main([renamed_mistral, *register, "--device", "cpu", "--out", str(tmp_path / "after")]) == 0
    after = _models(tmp_path / "after")[renamed_mistral]
    assert after["status"] == "pass"
    assert "built as MistralForCausalLM (registered for StarlingLmForCausalLM)" in after["decisions"]
