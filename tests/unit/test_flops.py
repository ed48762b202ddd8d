"""FLOP counting for MFU, against hand arithmetic on a tiny model."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from relm.trainer.flops import matmul_params, peak_flops, training_flops, verl_params


def test_flops_of_a_tiny_untied_llama_by_hand():
    config = LlamaConfig(
        vocab_size=10, hidden_size=4, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, tie_word_embeddings=False,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    # per layer: q,k,v,o 4*4*4 = 64; mlp 3*4*8 = 96; two norms 2*4 = 8 -> 168; final norm 4; lm_head 10*4 = 40
    assert matmul_params(model) == 168 + 4 + 40
    # verl adds the embedding as if it were a product: N = 212 + 40 = 252
    assert verl_params(model) == 252
    # dense 6*252*(3+5) = 12096; attention 12*(9+25)*1 layer*2 heads*2 head_dim = 1632; two epochs
    assert training_flops(model, [3, 5], num_epochs=2) == 2 * (12096 + 1632)


def test_tied_head_counts_the_projection_once():
    config = LlamaConfig(
        vocab_size=10, hidden_size=4, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, tie_word_embeddings=True,
    )  # fmt: skip
    assert matmul_params(LlamaForCausalLM(config)) == 168 + 4 + 40
    # verl's count does not depend on tying: embedding and head are vocab x hidden each
    assert verl_params(LlamaForCausalLM(config)) == 168 + 4 + 40 + 40


def test_no_peak_on_cpu():
    assert peak_flops(torch.device("cpu")) is None
