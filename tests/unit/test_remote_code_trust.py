"""A model that exists only as code in its folder: refused naming the key that allows it; the actor's
key reaches the critic that loads the same folder (and the reference, a copy of the actor)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config

from relm.config.loader import load_config as load_run_config
from relm.config.translate import translate
from relm.errors import UserError
from relm.models.loading import load_config
from relm.rewards.reward_model import load_discriminative_reward_model
from relm.trainer.components import load_trained_model

CONFIGURATION = """
from transformers import Qwen2Config

class ShippedConfig(Qwen2Config):
    model_type = "shipped_lm"
"""

MODELING = """
from transformers import Qwen2ForCausalLM

from .configuration_shipped import ShippedConfig

class ShippedForCausalLM(Qwen2ForCausalLM):
    config_class = ShippedConfig
"""


@pytest.fixture
def shipped(tmp_path: Path) -> Path:
    """A tiny model folder whose architecture only its own code defines (random weights)."""
    folder = tmp_path / "shipped"
    folder.mkdir()
    (folder / "configuration_shipped.py").write_text(CONFIGURATION)
    (folder / "modeling_shipped.py").write_text(MODELING)
    config = Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64,
    ).to_dict()  # fmt: skip
    config.update(
        model_type="shipped_lm",
        architectures=["ShippedForCausalLM"],
        auto_map={
            "AutoConfig": "configuration_shipped.ShippedConfig",
            "AutoModelForCausalLM": "modeling_shipped.ShippedForCausalLM",
        },
    )
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_untrusted_code_is_refused_naming_the_key(shipped: Path):
    with pytest.raises(UserError, match=r"set `actor_rollout_ref.model.trust_remote_code=true` if you trust"):
        load_config(str(shipped))
    with pytest.raises(UserError, match=r"set `reward_model.model.trust_remote_code=true` if you trust"):
        load_discriminative_reward_model(
            str(shipped), tokenizer=None, device=torch.device("cpu"), dtype=torch.float32,  # type: ignore[arg-type]
            micro_batch_size=None, max_length=None, rerender=False,
        )  # fmt: skip


def test_the_actors_key_reaches_a_critic_on_the_same_folder_not_on_another(shipped: Path, tmp_path: Path):
    base = [f"actor_rollout_ref.model.path={shipped}", "algorithm.adv_estimator=gae"]
    cfg = load_run_config([*base, "actor_rollout_ref.model.trust_remote_code=true"])
    critic = load_trained_model(translate(cfg)[0].critic, str(shipped), torch.device("cpu"), torch.float32)
    assert type(critic.backbone.config).__name__ == "ShippedConfig"  # the folder's own code ran

    other = tmp_path / "other"
    other.symlink_to(shipped)
    cfg = load_run_config(
        [*base, "actor_rollout_ref.model.trust_remote_code=true", f"critic.model.path={other}"]
    )
    with pytest.raises(UserError, match=r"set `critic.model.trust_remote_code=true` if you trust"):
        load_trained_model(translate(cfg)[0].critic, str(other), torch.device("cpu"), torch.float32)
