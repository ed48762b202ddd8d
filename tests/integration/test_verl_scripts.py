"""verl's own example scripts, with only their data and model paths and their sizes changed, train one step
on CPU or stop with one line naming the feature relm lacks (a sample; `bench/verl_scripts.py` runs all)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SAMPLE = Path(__file__).with_name("verl_scripts")
HARNESS = Path(__file__).resolve().parents[2] / "bench" / "verl_scripts.py"

pytestmark = pytest.mark.integration


def _harness():
    spec = importlib.util.spec_from_file_location("verl_scripts", HARNESS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["verl_scripts"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_the_sample_of_verl_scripts_runs_or_stops_naming_the_missing_feature(tmp_path: Path):
    runs = {run.script: run for run in _harness().run_scripts(SAMPLE, timeout_s=300, work=tmp_path)}

    assert sorted(runs) == sorted(str(p.relative_to(SAMPLE)) for p in SAMPLE.rglob("*.sh"))
    for script in (
        "examples/grpo_trainer/run_qwen3_8b_fsdp.sh",
        "examples/gspo_trainer/run_qwen3_8b_fsdp.sh",
        "recipe/dapo/test_dapo_7b_math.sh",  # reward_kwargs.overlong_buffer_cfg, filter_groups on `acc`
    ):
        assert (runs[script].result, runs[script].detail) == ("ran", ""), script
        # Written as the script wrote them: vLLM, a wandb logger, verl-only keys; only paths and sizes changed.
        engines = {f"actor_rollout_ref.rollout.name={name}" for name in ("vllm", "sglang")}
        assert engines & set(runs[script].argv), script
    # verl's Megatron PPO example (model_engine=megatron, TP 2 and PP 2 for actor and critic) trains on FSDP2.
    megatron = runs["examples/ppo_trainer/run_qwen3_8b_megatron.sh"]
    assert (megatron.result, megatron.detail) == ("ran", ""), megatron.detail
    # verl's LoRA example (lora_rank=64 on all linear layers, vLLM rollout) trains LoRA on the native engine.
    lora = runs["examples/tuning/lora/run_qwen3_8b_fsdp.sh"]
    assert (lora.result, lora.detail) == ("ran", ""), lora.detail
    assert "actor_rollout_ref.model.lora_rank=64" in lora.argv
    # verl's multi-teacher on-policy distillation (two teachers routed by data_source, k1 as a per-token reward,
    # grpo with n=1 and no task loss) trains one step; the harness routes the built-in task to the first teacher.
    mopd = runs["examples/on_policy_distillation_trainer/run_qwen3_8b_mopd_fsdp.sh"]
    assert (mopd.result, mopd.detail) == ("ran", ""), mopd.detail
    assert "+distillation.teacher_models.gsm8k.key=relm/letters" in mopd.argv
