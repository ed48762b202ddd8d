"""Next-token sampling shared by the rollout engines: one batched draw on the device, no host sync.

Both engines call the same function so that, given the same logits and seed, they pick the same
tokens and report the same logprobs; that is what lets the native engine be checked token for
token against the HF engine. On CUDA the draw is an exponential race (noise for every
vocabulary entry, fused by torch.compile); on CPU, where that noise is drawn one entry at a time, it is
an inverse-CDF walk from one uniform per row (`inverse_cdf_draw`). Both are exact in distribution.
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
        race: (CUDA only) `exponential_race` or a compiled copy of it (the native engine compiles it on CUDA,
            where fusing its passes over the [N, V] logits cut sampling from 0.70 to about 0.15 ms a
            step at 256 x 152k); None is the plain function.
    """
    scale = params.temperature if params.temperature > 0 else 1.0
    if params.greedy:
        scaled = logits.float() / scale
        token = scaled.argmax(dim=-1)
        return token, _logprob_of(scaled, token)
    if logits.device.type == "cpu":
        return inverse_cdf_draw(logits, scale, params.top_k, params.top_p, generator)
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


def inverse_cdf_draw(
    logits: torch.Tensor, scale: float, top_k: int, top_p: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """The CPU draw: softmax(logits / scale) after top-k/top-p, one uniform per row, inverse CDF.

    Why not the race on CPU: torch draws CPU exponentials one at a time (~20-40 ns each), so noise for
    32 rows x 152k entries cost ~200 ms a decode step, and `torch.multinomial` draws the same noise
    (one sample without replacement) or runs a sequential cumsum. Here the vocabulary is read by
    the (vectorised) softmax and one sum per block of `CDF_BLOCK` entries; the CDF is walked in two
    levels, blocks then entries, both in float64, so a token's chance is its float32 probability to
    float64 rounding (a float32 cumsum over 152k entries would round small probabilities to steps of
    ~6e-8). The reported logprob is log softmax(logits / scale) *before* filtering, as on GPU.
    """
    # A new contiguous tensor even at scale 1: softmax over a `vocab_limit` slice (a strided view) runs
    # about ten times slower than over contiguous rows.
    scaled = logits.float() / scale
    probs = torch.softmax(scaled, dim=-1)  # [N, V]
    drawn = probs
    if top_k > 0 or top_p < 1.0:
        drawn = torch.softmax(filter_top_k_top_p(scaled, top_k, top_p), dim=-1)
    token = draw_inverse_cdf(drawn, generator)
    return token, probs.gather(-1, token[:, None]).squeeze(-1).log()


CDF_BLOCK = 512
"""Entries per block of the two-level CDF walk: ~300 blocks for a 152k vocabulary, both levels small."""


def draw_inverse_cdf(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """[N, V] non-negative weights (each row with some mass) -> [N] ids, id i drawn with chance w_i / sum w.

    One uniform u per row picks the id whose CDF interval holds u * total: first the block, from
    float64 block masses, then the entry inside it. An id of weight 0 is never picked (its interval is
    empty, and a u that rounds up to the total falls back to the last id of positive weight).
    """
    num_rows, vocab = probs.shape
    full = vocab - vocab % CDF_BLOCK
    # float32 sums (a float64 accumulation is ten times slower on CPU), each within a few ulps of its block
    masses = [probs[:, :full].reshape(num_rows, -1, CDF_BLOCK).sum(-1)]
    if full < vocab:
        masses.append(probs[:, full:].sum(-1, keepdim=True))
    block_mass = torch.cat(masses, dim=-1).double()  # [N, B]
    block, rest = _walk(
        block_mass, torch.rand(num_rows, 1, dtype=torch.float64, generator=generator, device=probs.device)
    )
    columns = block[:, None] * CDF_BLOCK + torch.arange(CDF_BLOCK, device=probs.device)  # [N, CDF_BLOCK]
    weights = probs.gather(-1, columns.clamp_max(vocab - 1)).double() * (columns < vocab)
    # the offset into the block, as a share of the block's mass in the entries' own (float64) sum
    entry, _ = _walk(weights, rest / block_mass.gather(-1, block[:, None]))
    return (block * CDF_BLOCK + entry).clamp_max(vocab - 1)  # a no-op but for a row of NaN (`_walk`)


def _walk(weights: torch.Tensor, share: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] float64 weights, [N, 1] share of the row's total in [0, 1) ->
    ([N] index whose CDF interval holds share x total, [N, 1] the offset into that interval)."""
    cdf = weights.cumsum(-1)  # [N, K]
    total = cdf[:, -1:].contiguous()
    target = share * total
    index = torch.searchsorted(cdf, target, right=True)  # first cdf > target: a positive weight
    # target >= total only by rounding: the last positive weight (first cdf reaching the total)
    index = torch.minimum(index, torch.searchsorted(cdf, total))
    # A row of NaN weights (the logits of a model a huge step has broken) has no interval for u: any
    # valid index, so the step ends normally with a NaN logprob and the trainer's check of non-finite
    # gradients stops the run with one line, as it does after the GPU race's argmax over NaN.
    index = index.clamp_max(weights.shape[-1] - 1)
    before = torch.cat([torch.zeros_like(total), cdf[:, :-1]], dim=-1).gather(-1, index)  # [N, 1]
    return index.squeeze(-1), target - before  # >= 0: searchsorted put cdf[index - 1] <= target


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


COLUMNS_CAPACITY = 256
"""Decode steps `SampledColumns` holds before its buffers double (a few KiB a row)."""


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

    The columns are written into [rows, capacity] buffers that double when full, not kept as three
    new tensors a step: on CPU each small tensor that lives until the decode ends sits in the hole a
    freed vocabulary-sized tensor left in the heap, so the next one no longer fits there and the heap
    grows (README's verl block, 32 rows x 256 steps over 151,665 tokens: the heap grew by ~1.3 GiB of
    free memory during one generation, docs/benchmarks.md).
    """

    pad_token_id: int
    vocab_limit: int | None = None
    steps: int = 0
    _ids: torch.Tensor | None = field(default=None, repr=False)
    _mask: torch.Tensor | None = field(default=None, repr=False)
    _logprobs: torch.Tensor | None = field(default=None, repr=False)

    @property
    def tokens(self) -> list[torch.Tensor]:
        """The [rows] sampled ids of each step so far (views of one buffer)."""
        return self._columns(self._ids)

    @property
    def masks(self) -> list[torch.Tensor]:
        """The [rows] long masks of each step (1 where the row was live)."""
        return self._columns(self._mask)

    @property
    def logprobs(self) -> list[torch.Tensor]:
        """The [rows] fp32 logprobs of each step (0 where the row had finished)."""
        return self._columns(self._logprobs)

    def _columns(self, buffer: torch.Tensor | None) -> list[torch.Tensor]:
        return [] if buffer is None else list(buffer[:, : self.steps].unbind(1))

    def _record(self, token: torch.Tensor, live: torch.Tensor, logprob: torch.Tensor) -> None:
        if self._ids is None or self._mask is None or self._logprobs is None:
            rows, capacity = token.shape[0], COLUMNS_CAPACITY
            self._ids = token.new_empty(rows, capacity)
            self._mask = token.new_empty(rows, capacity, dtype=torch.long)
            self._logprobs = token.new_empty(rows, capacity, dtype=torch.float32)
        elif self.steps == self._ids.shape[1]:
            self._ids, self._mask, self._logprobs = (
                torch.cat([b, torch.empty_like(b)], dim=1) for b in (self._ids, self._mask, self._logprobs)
            )
        self._ids[:, self.steps] = token
        self._mask[:, self.steps] = live
        self._logprobs[:, self.steps] = logprob
        self.steps += 1

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
        self._record(token, live, torch.where(live, logprob, 0.0))
        return token

    def pack(self, stopped_by_eos: torch.Tensor, width: int) -> GenerationOutput:
        """The columns as CPU tensors right-padded to `width` = max_new_tokens."""
        assert self._ids is not None and self._mask is not None and self._logprobs is not None, (
            "no step sampled"
        )
        num_rows, num_steps = self._ids.shape[0], self.steps
        response_ids = torch.full((num_rows, width), self.pad_token_id, dtype=torch.long)
        response_mask = torch.zeros((num_rows, width), dtype=torch.long)
        response_logprobs = torch.zeros((num_rows, width), dtype=torch.float32)
        response_ids[:, :num_steps] = self._ids[:, :num_steps].cpu()
        response_mask[:, :num_steps] = self._mask[:, :num_steps].cpu()
        response_logprobs[:, :num_steps] = self._logprobs[:, :num_steps].cpu()
        reasons = [FINISH_STOP if stop else FINISH_LENGTH for stop in stopped_by_eos.tolist()]
        return GenerationOutput(response_ids, response_mask, response_logprobs, reasons)
