"""The tiny random Qwen2 that unit tests build in-process (no zoo folder, no tokenizer)."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, Qwen2Config

TINY_QWEN2 = dict(
    vocab_size=64,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=64,
    max_position_embeddings=128,
)
"""2 layers, GQA 4/2 heads of 8, vocabulary 64: small enough for many builds per test file."""


def tiny_lm(seed: int = 0) -> PreTrainedModel:
    """A seeded tiny Qwen2 in eval mode.

    initializer_range 0.2 (not 0.02) makes the logits far from uniform, so greedy choices are decided
    by clear margins rather than by rounding differences between code paths.
    """
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(Qwen2Config(**TINY_QWEN2, initializer_range=0.2)).eval()
