"""The TRL peer of `relm bench step`: its settings mapping and throughput formula (no TRL needed), the
one-line refusal when TRL is missing, and, where TRL is installed, a real GRPOTrainer run on the tiny model.

CI does not install TRL, so the last test is skipped there; run it with `pip install trl` (see
docs/benchmarks.md, "Against TRL").
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from relm.bench.peer_trl import grpo_config_kwargs, letters_reward, step_throughput
from relm.bench.step import bench_config, main, parse_args
from relm.errors import UserError


def grpo_bench_config(*extra: str, prompts: int = 64, n: int = 8, micro: int = 8):
    """The config `relm bench step --algo grpo` builds (the issue's 3B comparison by default)."""
    sizes = ["--prompts", str(prompts), "--n", str(n), "--micro", str(micro)]
    args = parse_args([*sizes, "--prompt-len", "512", "--response-len", "512", *extra])
    return bench_config(args, "grpo", Path("/data/prompts.parquet"), Path("/runs/grpo"))


def test_mapping_gives_one_generation_and_one_update_per_step():
    kwargs = grpo_config_kwargs(grpo_bench_config(), torch.device("cuda"), "/tmp/out", max_steps=3)
    # 64 prompts x 8 = 512 responses per step, 8 per forward/backward: 64 accumulated micro-batches.
    assert kwargs["per_device_train_batch_size"] == 8
    assert kwargs["gradient_accumulation_steps"] == 64
    assert kwargs["num_generations"] == 8 and kwargs["num_iterations"] == 1
    assert kwargs["max_steps"] == 3
    # Every response is exactly 512 tokens: eos is masked until the last one.
    assert kwargs["max_completion_length"] == 512
    assert kwargs["generation_kwargs"] == {"min_new_tokens": 512}
    # use_kl_loss with kl_loss_coef 0.001 -> beta 0.001 (a reference model, as relm loads one).
    assert kwargs["beta"] == 0.001
    assert kwargs["epsilon"] == kwargs["epsilon_high"] == 0.2
    assert kwargs["loss_type"] == "dapo" and kwargs["scale_rewards"] == "group"
    # relm's recipe on CUDA: fp32 weights, bf16 autocast.
    assert kwargs["model_init_kwargs"]["dtype"] == "float32" and kwargs["bf16"] and not kwargs["use_cpu"]
    # checkpointing as relm's run used it: unset here (the memory plan decides), explicit below
    assert (
        kwargs["gradient_checkpointing"] is False and kwargs["top_k"] == 0 and kwargs["learning_rate"] == 1e-6
    )
    cfg = grpo_bench_config("actor_rollout_ref.model.enable_gradient_checkpointing=true")
    assert grpo_config_kwargs(cfg, torch.device("cuda"), "/tmp/out", max_steps=3)["gradient_checkpointing"]


def test_mapping_follows_overrides_and_the_device():
    cfg = grpo_bench_config(
        "actor_rollout_ref.actor.kl_loss_coef=0.01",
        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
        "actor_rollout_ref.model.dtype=bfloat16",
        "actor_rollout_ref.rollout.top_k=20",
        prompts=4,
        n=2,
        micro=4,
    )
    kwargs = grpo_config_kwargs(cfg, torch.device("cpu"), "/tmp/out", max_steps=1, response_len=8)
    assert kwargs["gradient_accumulation_steps"] == 2 and kwargs["beta"] == 0.01
    assert kwargs["loss_type"] == "grpo" and kwargs["top_k"] == 20
    assert kwargs["max_completion_length"] == 8 and kwargs["generation_kwargs"] == {"min_new_tokens": 8}
    assert kwargs["model_init_kwargs"]["dtype"] == "bfloat16" and kwargs["use_cpu"] and not kwargs["bf16"]
    no_kl = grpo_bench_config("actor_rollout_ref.actor.use_kl_loss=false")
    assert grpo_config_kwargs(no_kl, torch.device("cpu"), "/tmp/out", max_steps=1)["beta"] == 0.0


@pytest.mark.parametrize(
    ("extra", "micro", "culprit"),
    [
        (("actor_rollout_ref.actor.ppo_mini_batch_size=32",), 8, "one optimizer update per step"),
        (("actor_rollout_ref.actor.ppo_epochs=2",), 8, "one optimizer update per step"),
        (("algorithm.adv_estimator=gae",), 8, "compares GRPO only"),
    ],
)
def test_mapping_refuses_what_trl_cannot_mirror(extra, micro, culprit):
    with pytest.raises(UserError, match=culprit):
        grpo_config_kwargs(
            grpo_bench_config(*extra, micro=micro), torch.device("cpu"), "/tmp/out", max_steps=1
        )


def test_step_throughput_is_tokens_per_second_per_gpu():
    # 64 x 8 rows of 512 + 512 tokens in 20 s on one GPU: 524288 / 20.
    assert step_throughput(64 * 8 * 1024, 20.0) == pytest.approx(26214.4)
    assert step_throughput(64 * 8 * 1024, 20.0, num_gpus=2) == pytest.approx(13107.2)


def test_letters_reward_scores_conversational_and_plain_completions():
    completions = [
        [{"role": "assistant", "content": "aab<|im_end|>"}],
        "xyz",
        [{"role": "assistant", "content": ""}],
    ]
    assert letters_reward(completions, prompts=None) == pytest.approx([2 / 3, 0.0, 0.0])


def test_peer_without_trl_exits_2_naming_the_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "trl", None)  # what `import trl` sees where TRL is not installed
    monkeypatch.delenv("RELM_DEBUG", raising=False)
    assert main(["--algo", "grpo", "--device", "cpu", "--peer", "trl"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install trl" in err[0]


def test_peer_needs_grpo(monkeypatch, capsys):
    monkeypatch.delenv("RELM_DEBUG", raising=False)
    assert main(["--algo", "ppo", "--device", "cpu", "--peer", "trl"]) == 2
    assert "include grpo in --algo" in capsys.readouterr().err


@pytest.mark.skipif(
    importlib.util.find_spec("trl") is None or importlib.util.find_spec("datasets") is None,
    reason="TRL is not installed (CI does not install it; `pip install trl` to run this)",
)
def test_trl_peer_runs_the_same_steps_on_the_tiny_model(tmp_path, capsys):
    # A config-only folder, as published-shape zoo entries are: the peer must write relm's random weights.
    from relm.models.zoo import materialize_zoo

    folder = tmp_path / "config-only"
    shutil.copytree(materialize_zoo("zoo:tiny/qwen2"), folder, ignore=shutil.ignore_patterns("*.safetensors"))
    out = tmp_path / "peer.json"
    sizes = ["--prompts", "4", "--n", "2", "--prompt-len", "24", "--response-len", "8", "--micro", "4"]
    args = ["--model", str(folder), "--algo", "grpo", *sizes, "--steps", "1", "--device", "cpu"]
    assert main([*args, "--peer", "trl", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    relm, trl = record["results"]["grpo"], record["results"]["trl"]
    # Same work: 8 rows of 24 prompt + 8 response tokens per step, on both sides.
    assert relm["perf/total_num_tokens"] == trl["perf/total_num_tokens"] == 8 * (24 + 8)
    assert trl["response_length/min"] == trl["response_length/max"] == 8
    assert trl["perf/throughput"] == pytest.approx(trl["perf/total_num_tokens"] / trl["timing_s/step"])
    assert record["peer"]["throughput_ratio"] == pytest.approx(
        relm["perf/throughput"] / trl["perf/throughput"]
    )
    printed = capsys.readouterr().out
    assert "trl step 1:" in printed and "GRPOTrainer: perf/throughput x" in printed
    assert Path(folder / "model.safetensors").exists() is False  # the user's folder is left as it was
