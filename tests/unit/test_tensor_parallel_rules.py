"""What `rollout.tensor_model_parallel_size` accepts: config rules and the model's own plan and head counts.

The split itself runs under torchrun (tests/integration/test_tensor_parallel.py, tests/tp_parity.py).
"""

from __future__ import annotations

import pytest
import torch
from transformers import Phi3Config, Qwen2Config, Qwen2ForCausalLM, Qwen3Config

from relm.config.loader import load_config
from relm.config.validate import validate_config
from relm.errors import UserError
from relm.memory.rollout_budget import kv_bytes_per_token
from relm.rollout.tensor_parallel import (
    model_tp_plan,
    tensor_parallel_blocker,
    tensor_parallel_config_blocker,
)

TP = "actor_rollout_ref.rollout.tensor_model_parallel_size"
MICRO = ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", "critic.ppo_micro_batch_size_per_gpu=1"]


def qwen2(**fields) -> Qwen2Config:
    shape = dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1)
    return Qwen2Config(**{**shape, **fields})


def test_heads_the_size_does_not_divide_are_named():
    config = qwen2(num_attention_heads=8, num_key_value_heads=2)
    assert tensor_parallel_config_blocker(config, 2) is None
    assert (
        tensor_parallel_config_blocker(config, 4) == "Qwen2Config has 2 key/value heads, not divisible by 4"
    )
    config = qwen2(num_attention_heads=6, num_key_value_heads=6)
    assert "6 attention heads, not divisible by 4" in str(tensor_parallel_config_blocker(config, 4))


def test_each_rank_of_a_group_budgets_its_share_of_the_kv_cache():
    config = qwen2(num_attention_heads=8, num_key_value_heads=4, num_hidden_layers=2)
    whole = kv_bytes_per_token(config, 2)
    assert whole == 2 * 2 * 4 * 8 * 2  # keys and values, 2 layers, 4 heads of 8, bf16
    assert kv_bytes_per_token(config, 2, tp_size=4) == whole // 4


def test_a_plan_with_no_plain_split_is_refused_and_other_entries_stay_whole():
    phi3 = Phi3Config(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=4)
    problem = tensor_parallel_config_blocker(phi3, 2)
    assert problem is not None and "colwise_gather_output" in problem and "no colwise/rowwise" in problem
    # Qwen3's q/k norms (replicated_with_grad_allreduce) stay whole; its projections split.
    qwen3 = Qwen3Config(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
    assert tensor_parallel_config_blocker(qwen3, 2) is None


def test_the_model_plan_names_the_causal_lms_own_modules_and_their_split_dims_are_checked():
    with torch.device("meta"):
        model = Qwen2ForCausalLM(qwen2(num_attention_heads=4, num_key_value_heads=4, intermediate_size=130))
    plan = model_tp_plan(model)
    assert plan["model.layers.*.self_attn.q_proj"] == "colwise"
    assert plan["model.layers.*.mlp.down_proj"] == "rowwise"
    assert tensor_parallel_blocker(model, 4) == (
        "model.layers.0.mlp.gate_proj has 130 output features, not divisible by 4"
    )
    assert tensor_parallel_blocker(model, 2) is None
    model.config.base_model_tp_plan = {"decoder.*.q_proj": "colwise"}  # names no module of the model
    assert (
        tensor_parallel_blocker(model, 2)
        == "no Linear layer of Qwen2ForCausalLM matches its tensor-parallel plan"
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([f"{TP}=2"], "it does not divide the run's 1 rank(s) (trainer.n_gpus_per_node x trainer.nnodes)"),
        (
            [f"{TP}=3", "trainer.n_gpus_per_node=4"],
            "it does not divide the run's 4 rank(s) (trainer.n_gpus_per_node x trainer.nnodes)",
        ),
        (
            [f"{TP}=2", "trainer.n_gpus_per_node=2", "actor_rollout_ref.rollout.quantization=fp8"],
            "generation with actor_rollout_ref.rollout.quantization=fp8 is not split",
        ),
        (
            [f"{TP}=2", "trainer.n_gpus_per_node=2", "actor_rollout_ref.rollout.multi_turn.enable=true"],
            "multi-turn rollouts run each conversation on one rank",
        ),
    ],
)
def test_a_size_the_run_cannot_split_by_falls_back_to_1_with_one_line(overrides, message):
    """verl's scripts carry the size of the machine they were written for (2 or 4 on 8 GPUs, multi-turn
    ones too): on fewer ranks, or with a rollout relm does not split, they still run, whole model per rank."""
    from relm.config.translate import translate

    cfg = load_config([*overrides, *MICRO])
    validate_config(cfg)
    spec, warnings = translate(cfg)
    assert spec.engine.tensor_parallel_size == 1
    (line,) = [w for w in warnings if w.startswith(f"`{TP}=")]
    assert f"not used, {message}; each rank generates with the whole model (size 1)" in line


def test_a_size_the_run_can_split_by_is_used_without_a_line():
    from relm.config.translate import translate

    spec, warnings = translate(load_config([f"{TP}=2", "trainer.n_gpus_per_node=2", *MICRO]))
    assert spec.engine.tensor_parallel_size == 2
    assert not [w for w in warnings if w.startswith(f"`{TP}=")]


def test_vllm_with_a_size_above_1_is_refused():
    cfg = load_config([f"{TP}=2", "trainer.n_gpus_per_node=2", *MICRO])
    cfg.actor_rollout_ref.rollout.name = "vllm"  # as loaded where vLLM is installed
    with pytest.raises(UserError, match="native and HF engines only"):
        validate_config(cfg)
    assert (
        load_config(
            [f"{TP}=2", "trainer.n_gpus_per_node=4"]
        ).actor_rollout_ref.rollout.tensor_model_parallel_size
        == 2
    )
