"""Next-token sampling shared by the rollout engines: one batched draw on the device, no host sync.

Both engines call the same function so that, given the same logits and seed, they pick the same
tokens and report the same logprobs; that is what lets the native engine be checked token for
token against the HF engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from relm.rollout.base import FINISH_LENGTH, FINISH_STOP, GenerationOutput, SamplingParams


def sample_next_token(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator,
    race: Callable[[torch.Tensor, torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, V] next-token logits (any float dtype) -> ([N] token ids, [N] fp32 logprobs of those tokens).

    The logprob is under softmax(logits / temperature) *before* top-k/top-p filtering: that is the
    distribution the trainer's `response_logprobs` recomputes, so rollout and trainer logprobs are
    comparable token by token (filtering would renormalise over a set the trainer cannot see).
    Greedy (temperature 0) reports logprobs at temperature 1.

    Args:
        race: `exponential_race` or a compiled copy of it (the native engine compiles it on CUDA,
            where fusing its passes over the [N, V] logits cut sampling from 0.70 to about 0.15 ms a
            step at 256 x 152k); None is the plain function.
    """
    scale = params.temperature if params.temperature > 0 else 1.0
    if params.greedy:
        scaled = logits.float() / scale
        token = scaled.argmax(dim=-1)
        return token, _logprob_of(scaled, token)
    # Exponential race: argmax p_i / E_i with E_i ~ Exp(1) picks i with probability p_i; in log space
    # that is argmax (scaled_i - log E_i), softmax's normaliser being the same for every i. One batched
    # draw on the device, no host sync (torch.multinomial syncs).
    noise = torch.empty(logits.shape, dtype=torch.float32, device=logits.device).exponential_(
        generator=generator
    )
    if params.top_k > 0 or params.top_p < 1.0:
        scaled = logits.float() / scale
        filtered = filter_top_k_top_p(scaled, params.top_k, params.top_p)
        token = (filtered - _log_noise(noise)).argmax(dim=-1)
        return token, _logprob_of(scaled, token)
    return (race or exponential_race)(logits, noise, scale)


def exponential_race(
    logits: torch.Tensor, noise: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token = argmax(logits / scale - log noise) and its logprob under softmax(logits / scale).

    Pure and shape-stable, so torch.compile fuses it into a couple of passes over the logits.
    """
    scaled = logits.float() / scale  # [N, V]
    token = (scaled - _log_noise(noise)).argmax(dim=-1)
    return token, _logprob_of(scaled, token)


def _log_noise(noise: torch.Tensor) -> torch.Tensor:
    # The clamp keeps log(0) (a draw of exactly 0, probability 0 in theory) from making an -inf race.
    return noise.clamp_min(torch.finfo(noise.dtype).tiny).log()


def _logprob_of(scaled: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """[N] log softmax(scaled)[token] without materialising the [N, V] log-softmax."""
    return scaled.gather(-1, token[:, None]).squeeze(-1) - torch.logsumexp(scaled, dim=-1)


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


@dataclass
class SampledColumns:
    """The per-step columns of a batched decode ([rows] each): the engines' shared bookkeeping.

    A row that has finished keeps its slot in the batch; from then on its column entries are the pad
    token, mask 0 and logprob 0, which is what the trainer expects after a response's end.

    `vocab_limit` (the tokenizer's length) keeps ids at or past it from ever being drawn: checkpoints
    often have more embedding rows than tokens (Qwen2.5: 151,936 rows for 151,665 tokens; Phi-3 32,064
    for 32,011), and an id with no token cannot be decoded or scored. Sampling from the first
    `vocab_limit` logits is the same as setting the others to -inf, without writing to the logits; the
    trainer's `response_logprobs(vocab_limit=...)` normalises over the same ids.
    """

    pad_token_id: int
    vocab_limit: int | None = None
    tokens: list[torch.Tensor] = field(default_factory=list)
    masks: list[torch.Tensor] = field(default_factory=list)
    logprobs: list[torch.Tensor] = field(default_factory=list)

    def sample(
        self,
        logits: torch.Tensor,
        finished: torch.Tensor,
        params: SamplingParams,
        generator: torch.Generator,
        race: Callable[[torch.Tensor, torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> torch.Tensor:
        """Draw every row's next token from `logits` [rows, V] and record it; returns the [rows] tokens
        (pad where `finished`)."""
        if self.vocab_limit is not None and logits.shape[-1] > self.vocab_limit:
            logits = logits[:, : self.vocab_limit]
        token, logprob = sample_next_token(logits, params, generator, race)
        live = ~finished
        token = torch.where(live, token, self.pad_token_id)
        self.tokens.append(token)
        self.masks.append(live.long())
        self.logprobs.append(torch.where(live, logprob, 0.0))
        return token

    def pack(self, stopped_by_eos: torch.Tensor, width: int) -> GenerationOutput:
        """The columns as CPU tensors right-padded to `width` = max_new_tokens."""
        num_rows, num_steps = self.tokens[0].shape[0], len(self.tokens)
        response_ids = torch.full((num_rows, width), self.pad_token_id, dtype=torch.long)
        response_mask = torch.zeros((num_rows, width), dtype=torch.long)
        response_logprobs = torch.zeros((num_rows, width), dtype=torch.float32)
        response_ids[:, :num_steps] = torch.stack(self.tokens, dim=1).cpu()
        response_mask[:, :num_steps] = torch.stack(self.masks, dim=1).cpu()
        response_logprobs[:, :num_steps] = torch.stack(self.logprobs, dim=1).float().cpu()
        reasons = [FINISH_STOP if stop else FINISH_LENGTH for stop in stopped_by_eos.tolist()]
        return GenerationOutput(response_ids, response_mask, response_logprobs, reasons)
