"""Tensor-parallel generation against whole-model generation and the trainer's logprobs.

    python -m torch.distributed.run --nproc_per_node 4 tests/tp_parity.py OUT.json

Every rank builds the same tiny Qwen2 (fp32, 8 attention heads over 4 key/value heads, so 1, 2 and 4
divide both) and a second one, "trained": its weights differ, as after an update. For each engine
(native, HF) and group size 2 and 4, a copy of the first model is split over each group of ranks
(`relm.distributed.tensor_parallel`), the trained model's weights are synced into it from FSDP2 shards
over all ranks (`DataParallelEngine.sync_weights`, as the trainer does after every update), and the
data-parallel engine generates for all prompts. Rank 0 writes OUT.json: per engine and size, whether
greedy tokens equal the whole model's (TP=1), the largest logprob gap to TP=1 and to the trainer's
forward (`response_logprobs` over the whole trained model), and for a sampled call whether the ranks
of each group drew the same tokens. Then Qwen3, Gemma 2, Llama and Qwen3-MoE of the same head counts
generate greedily in groups of 4 on the native engine, against their whole models.

Used by tests/integration/test_tensor_parallel.py (CPU, gloo).
"""

from __future__ import annotations

import copy
import json
import os
import sys

import torch
from torch.distributed.fsdp import fully_shard
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    LlamaConfig,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3MoeConfig,
)

from relm.distributed.context import init_distributed
from relm.distributed.rollout import DataParallelEngine
from relm.distributed.tensor_parallel import split_generation_copy
from relm.learner.forward import response_logprobs
from relm.rollout.base import GenerationOutput, SamplingParams
from relm.rollout.hf_engine import HFRolloutEngine
from relm.rollout.native.engine import NativeRolloutEngine
from relm.rollout.padding import left_pad

PAD, EOS = 0, 7
PROMPTS = [[3, 9, 14, 22, 5], [11, 12], [40, 41, 42, 43, 44, 45, 46], [8, 30, 31], [50, 2, 17, 19]]
ENGINES = {"native": NativeRolloutEngine, "hf": HFRolloutEngine}


def tiny(seed: int) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=4, max_position_embeddings=128, tie_word_embeddings=False, pad_token_id=PAD,
    )  # fmt: skip
    return Qwen2ForCausalLM(config).eval()


OTHERS = {
    # Qwen3: q/k norms (kept whole); Gemma 2: soft-capping and a sliding window; Llama: bias-free projections
    "qwen3": Qwen3Config,
    "gemma2": Gemma2Config,
    "llama": LlamaConfig,
    # Qwen3-MoE: attention split; the packed experts' plan entries are kept whole
    "qwen3-moe": Qwen3MoeConfig,
}


def other(name: str) -> torch.nn.Module:
    torch.manual_seed(2)
    config = OTHERS[name](
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=4, head_dim=8, max_position_embeddings=128, pad_token_id=PAD,
        **({"sliding_window": 4} if name == "gemma2" else {}),
        **({"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32} if name == "qwen3-moe" else {}),
    )  # fmt: skip
    return AutoModelForCausalLM.from_config(config).eval()


@torch.no_grad()
def trainer_logprobs(model: torch.nn.Module, out: GenerationOutput, n: int) -> torch.Tensor:
    """The trainer's logprobs of `out`'s responses under the whole `model` (`response_logprobs`)."""
    prompt_ids, prompt_mask = left_pad([p for p in PROMPTS for _ in range(n)], PAD)
    ids = torch.cat([prompt_ids, out.response_ids], dim=1)
    mask = torch.cat([prompt_mask, out.response_mask], dim=1)
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    logprobs, _ = response_logprobs(model, ids, mask, positions, out.response_ids.shape[1], temperature=1.0)
    return logprobs


@torch.no_grad()
def main(out_path: str) -> int:
    dist = init_distributed(torch.device("cpu"), expected_world_size=int(os.environ["WORLD_SIZE"]))
    first, trained = tiny(0), tiny(1)
    sharded = copy.deepcopy(trained).train()
    fully_shard(sharded, mesh=dist.mesh)  # the trainer's actor: FSDP2 shards over every rank
    greedy = SamplingParams(n=2, max_new_tokens=16, do_sample=False)
    sampled = SamplingParams(n=2, max_new_tokens=16, temperature=1.0, seed=5)
    report: dict[str, float] = {}
    for name, engine_class in ENGINES.items():
        kwargs = {"pad_token_id": PAD, "eos_token_ids": [EOS], "device": "cpu"}
        whole = engine_class(trained, **kwargs).generate(PROMPTS, greedy)
        report[f"{name} tp=1 trainer logprob gap"] = _gap(whole, trainer_logprobs(trained, whole, 2))
        before = engine_class(first, **kwargs).generate(PROMPTS, greedy)  # what an unsynced copy would say
        report[f"{name} untrained model's tokens differ"] = float(
            not torch.equal(before.response_ids, whole.response_ids)
        )
        for tp_size in (2, 4):
            split = split_generation_copy(copy.deepcopy(first), dist, tp_size, "tiny-qwen2")
            local = engine_class(split, **kwargs)
            engine = DataParallelEngine(local, dist, tp_size=tp_size)
            engine.sync_weights(sharded.named_parameters())
            out = engine.generate(PROMPTS, greedy)
            key = f"{name} tp={tp_size}"
            report[f"{key} greedy tokens equal"] = float(
                torch.equal(out.response_ids, whole.response_ids)
                and torch.equal(out.response_mask, whole.response_mask)
            )
            report[f"{key} stopped rows"] = float(sum(r == "stop" for r in out.finish_reasons))
            report[f"{key} logprob gap to tp=1"] = _gap(out, whole.logprobs)
            report[f"{key} trainer logprob gap"] = _gap(out, trainer_logprobs(trained, out, 2))
            report[f"{key} local weight share"] = _local_share(split)
            if isinstance(local, NativeRolloutEngine):  # its memory budget counts this rank's pieces
                report[f"{key} engine group size"] = float(local.tp_size)
            # Sampling: every rank of a group must draw the same tokens (the same logits, the same seed).
            drawn = local.generate(PROMPTS, sampled).response_ids
            everyone = dist.gather_objects(drawn)
            groups = [everyone[start : start + tp_size] for start in range(0, dist.world_size, tp_size)]
            report[f"{key} sampled ranks agree"] = float(
                all(all(torch.equal(g[0], t) for t in g) for g in groups)
            )
    # Other architectures, native engine, groups of 4 (weights copied whole, no sync).
    kwargs = {"pad_token_id": PAD, "eos_token_ids": [EOS], "device": "cpu"}
    for name in OTHERS:
        model = other(name)
        whole = NativeRolloutEngine(model, **kwargs).generate(PROMPTS, greedy)
        split = split_generation_copy(copy.deepcopy(model), dist, 4, name)
        out = DataParallelEngine(NativeRolloutEngine(split, **kwargs), dist, tp_size=4).generate(
            PROMPTS, greedy
        )
        report[f"{name} tp=4 greedy tokens equal"] = float(torch.equal(out.response_ids, whole.response_ids))
        report[f"{name} tp=4 trainer logprob gap"] = _gap(out, trainer_logprobs(model, out, 2))
    if dist.is_main:
        with open(out_path, "w") as f:
            json.dump(report, f, indent=1)
    del sharded
    dist.close()
    return 0


def _gap(out: GenerationOutput, expected: torch.Tensor) -> float:
    mask = out.response_mask.bool()
    return float((out.logprobs[mask] - expected[mask]).abs().max())


def _local_share(model: torch.nn.Module) -> float:
    """This rank's parameter elements over the whole model's."""
    local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in model.parameters())
    return local / sum(p.numel() for p in model.parameters())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
