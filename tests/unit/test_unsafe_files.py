"""Files relm refuses to run code from: a pickled `.bin` holding more than tensors, a YAML tag in a
Hydra config. Each ends with exit 2 and one line naming the file and what to do."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from relm.errors import UserError
from relm.models.loading import load_causal_lm
from relm.trainer.main_ppo import main


def test_a_bin_pickle_with_objects_is_refused_with_how_to_convert(tmp_path: Path):
    config = Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64,
    )  # fmt: skip
    model = Qwen2ForCausalLM(config)
    config.save_pretrained(tmp_path)
    state = dict(model.state_dict())
    state["training_args"] = argparse.Namespace(lr=1e-5)  # as old training scripts saved beside the weights
    torch.save(state, tmp_path / "pytorch_model.bin")
    with pytest.raises(UserError) as caught:
        load_causal_lm(str(tmp_path), dtype=torch.float32, device="cpu")
    assert str(caught.value) == (
        f"model folder `{tmp_path}`: its pytorch_model*.bin weights are a pickle holding objects other than "
        "tensors (argparse.Namespace), which relm does not load because unpickling them can run code; "
        "convert the weights to safetensors where you trust the file (torch.load(..., weights_only=False), "
        "then save_pretrained) and point the path at the converted folder"
    )


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("!!python/object:argparse.Namespace {}", "!!python/object:argparse.Namespace"),
        ("!custom 3", "!custom"),
    ],
)
def test_a_yaml_tag_in_a_hydra_config_is_one_line_naming_file_and_tag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str, shown: str
):
    (tmp_path / "run.yaml").write_text(
        f"defaults:\n  - ppo_trainer\n  - _self_\ntrainer:\n  total_training_steps: {value}\n"
    )
    code = main(["--config-path", str(tmp_path), "--config-name", "run"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.splitlines()[-1] == (
        f"error: `{tmp_path}/run.yaml`: the YAML tag `{shown}` at line 5 of `{tmp_path}/run.yaml` is not read "
        "(a config holds plain values, and relm constructs no Python objects from YAML); remove the tag"
    )
