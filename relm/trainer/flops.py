"""Model FLOPs of a training pass and the GPU's peak, for `perf/mfu/actor` (counted as verl counts it).

MFU = (6 * N * tokens + 12 * sum(seq_len^2) * num_layers * num_heads * head_dim) * epochs
      / update time / peak dense bf16 FLOP/s,

where N counts the parameters as verl's counter does (`verl/utils/flops_counter.py`): the blocks'
weights plus vocab x hidden twice, once for the input embedding and once for the output head, tied
or not. The embedding is a lookup, not a product, so this credits 2 x vocab x hidden x tokens FLOPs
that no kernel performs (about 13% of the total at the Qwen2.5-1.5B shape); relm counts it anyway so
that its MFU and verl's are the same number for the same run. `matmul_params` is the count without
that credit. The first term is the weights' forward (2 FLOPs per multiply-add) and backward (twice
the forward); the second is attention's QK^T and PV products, forward and backward, which grow with
the square of the length (verl's 12; it counts the full square although causal attention computes
about half of it).
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

PEAK_BF16_DENSE_FLOPS = {
    "H200": 989e12,
    "H100": 989e12,
    "H800": 989e12,
    "A100": 312e12,
    "A800": 312e12,
    "L40S": 362e12,
    "A10G": 125e12,
}
"""Vendor datasheet dense bf16 rates by the name fragment `torch.cuda.get_device_name` reports."""


def peak_flops(device: torch.device) -> float | None:
    """Dense bf16 peak of `device`, or None where unknown (CPU, unlisted GPUs): then no MFU is reported."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in PEAK_BF16_DENSE_FLOPS.items() if key in name), None)


def matmul_params(model: PreTrainedModel) -> int:
    """Parameters used in matrix products per token: all but the input embedding, plus the output head."""
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    embed_ids = {id(p) for p in embed.parameters()} if embed is not None else set()
    count = sum(p.numel() for p in model.parameters() if id(p) not in embed_ids)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and any(id(p) in embed_ids for p in head.parameters()):
        count += head.weight.numel()  # tied: the lookup is free, the projection is not
    return count


def verl_params(model: PreTrainedModel) -> int:
    """N as verl counts it: `matmul_params` plus the input embedding (vocab x hidden)."""
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    return matmul_params(model) + (embed.weight.numel() if embed is not None else 0)  # type: ignore[operator]  # an nn.Embedding: its weight is a tensor


def training_flops(model: PreTrainedModel, seq_lens: list[int], num_epochs: int = 1) -> float:
    """FLOPs of forward + backward over sequences of `seq_lens` tokens, `num_epochs` times (verl's count)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    num_heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
    dense = 6 * verl_params(model) * sum(seq_lens)
    attention = 12 * sum(s * s for s in seq_lens) * config.num_hidden_layers * num_heads * head_dim
    return float(dense + attention) * num_epochs
