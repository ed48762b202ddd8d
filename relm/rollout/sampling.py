"""Next-token sampling shared by the rollout engines: one batched draw on the device, no host sync.

Both engines call the same function so that, given the same logits and seed, they pick the same
tokens and report the same logprobs; that is what lets the native engine be checked token for
token against the HF reference engine.
"""

from __future__ import annotations

import torch

from relm.rollout.base import SamplingParams


def sample_next_token(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, V] next-token logits -> ([N] token ids, [N] fp32 logprobs of those tokens).

    The logprob is under softmax(logits / temperature) *before* top-k/top-p filtering: that is the
    distribution the trainer's `response_logprobs` recomputes, so rollout and trainer logprobs are
    comparable token by token (filtering would renormalise over a set the trainer cannot see).
    Greedy (temperature 0) reports logprobs at temperature 1.
    """
    scale = params.temperature if params.temperature > 0 else 1.0
    scaled = logits.float() / scale  # [N, V]
    if params.greedy:
        token = scaled.argmax(dim=-1)
    else:
        probs = torch.softmax(filter_top_k_top_p(scaled, params.top_k, params.top_p), dim=-1)  # [N, V]
        # Exponential race: argmax p_i / E_i with E_i ~ Exp(1) picks i with probability p_i. One batched
        # kernel on the device, no host sync (torch.multinomial syncs); the clamp avoids 0 / 0.
        noise = torch.empty_like(probs).exponential_(generator=generator)
        token = (probs / noise.clamp_min(torch.finfo(probs.dtype).tiny)).argmax(dim=-1)
    logprob = torch.log_softmax(scaled, dim=-1).gather(-1, token[:, None]).squeeze(-1)  # [N]
    return token, logprob


def filter_top_k_top_p(scaled: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """[N, V] scaled logits with tokens outside the top-k, then outside the top-p nucleus, at -inf.

    The nucleus is the smallest set of most likely tokens whose mass reaches `top_p` (taken after
    top-k, as vLLM orders them); the most likely token always stays.
    """
    vocab_size = scaled.shape[-1]
    if 0 < top_k < vocab_size:
        kth_largest = torch.topk(scaled, top_k, dim=-1).values[:, -1:]  # [N, 1]
        scaled = scaled.masked_fill(scaled < kth_largest, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = scaled.sort(dim=-1, descending=True)  # [N, V]
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of strictly likelier tokens
        drop_sorted = mass_before >= top_p
        drop_sorted[:, 0] = False
        drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)  # back to vocab order
        scaled = scaled.masked_fill(drop, float("-inf"))
    return scaled
