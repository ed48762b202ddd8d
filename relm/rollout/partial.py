"""Partial rollouts: a call's responses generated in segments, continued under newer weights between them.

verl's `async_training.partial_rollout` interrupts generation when the trainer syncs new weights and resumes it
under them. relm's engines generate a call's responses whole, so `SegmentedEngine` asks its engine for at most
`segment_tokens` new tokens at a time; before each segment it lets the caller load whatever newer weights have
arrived (`refresh`), then continues every unfinished row from its prompt and response so far: a fresh prefill
under the weights now loaded, which is also how verl's engines resume an aborted request. Each token keeps the
logprob its engine reported when it sampled it and the version of the weights that sampled it, so the rollout
correction compares the trained weights with the weights that really produced each token.

The engines need nothing new: each segment is an ordinary `generate` call. Its cost is one prefill of prompt and
response so far per segment, which is why segments are a share of the response length, not single tokens.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable

import torch

from relm.rollout.base import (
    FINISH_LENGTH,
    GenerationOutput,
    RolloutEngine,
    SamplingParams,
    check_generate_args,
)

SEGMENTS_PER_RESPONSE = 4
"""A response of the full `data.max_response_length` is generated in this many segments: new weights are
taken up at most a quarter of a response late, for at most three extra prefills."""

NO_VERSION = -1
"""`GenerationOutput.token_versions` after a response's end."""


def segment_tokens(max_response_length: int) -> int:
    """New tokens per segment: the response length over `SEGMENTS_PER_RESPONSE`, rounded up."""
    return max(1, math.ceil(max_response_length / SEGMENTS_PER_RESPONSE))


def segment_seed(seed: int | None, segment: int) -> int | None:
    """The sampling seed of segment `segment` of a call seeded `seed`: the call's own for the first segment
    (a response shorter than a segment is sampled as without segments), then one derived from it per segment,
    so a call's samples depend only on its seed and on the weights each segment ran under."""
    if seed is None or segment == 0:
        return seed
    return (seed * 1_000_003 + segment) % 2**63


class SegmentedEngine:
    """A `RolloutEngine` that generates through `engine` in segments and stamps each token with a version.

    Args:
        engine: the engine that samples; its `sync_weights` is what `refresh` calls when weights are newer.
        pad_token_id: the id after a response's end (the engine's own).
        segment_tokens: the most new tokens one segment asks for.
        refresh: called before each segment: loads the newest weights that have arrived, if newer than the
            engine's, and returns the version the engine then holds.
    """

    def __init__(
        self, engine: RolloutEngine, pad_token_id: int, segment_tokens: int, refresh: Callable[[], int]
    ) -> None:
        if segment_tokens < 1:
            raise ValueError(f"segment_tokens ({segment_tokens}) must be >= 1")
        self.engine = engine
        self.pad_token_id = pad_token_id
        self.segment_tokens = segment_tokens
        self.refresh = refresh

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> GenerationOutput:
        """`params.n` responses per prompt, as `engine` would return them, with `token_versions` [N, R] set."""
        check_generate_args(prompts, params)
        n, width = params.n, params.max_new_tokens
        num_rows = len(prompts) * n
        ids = torch.full((num_rows, width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros(num_rows, width, dtype=torch.long)
        logprobs = torch.zeros(num_rows, width, dtype=torch.float32)
        versions = torch.full((num_rows, width), NO_VERSION, dtype=torch.long)
        reasons = [FINISH_LENGTH] * num_rows
        active, done, segment = list(range(num_rows)), 0, 0  # rows still going; tokens each of them holds
        while active:
            version = self.refresh()
            size = min(self.segment_tokens, width - done)
            seeded = dataclasses.replace(params, max_new_tokens=size, seed=segment_seed(params.seed, segment))
            if segment == 0:
                out = self.engine.generate(prompts, seeded)
            else:
                continued = [prompts[row // n] + ids[row, :done].tolist() for row in active]
                out = self.engine.generate(continued, dataclasses.replace(seeded, n=1))
            if out.model_mask is not None:
                raise ValueError("partial rollouts continue plain responses; a multi-turn rollout's are not")
            rows, columns = torch.tensor(active), slice(done, done + size)
            ids[rows, columns] = out.response_ids.cpu()
            mask[rows, columns] = out.response_mask.cpu()
            logprobs[rows, columns] = out.logprobs.float().cpu()
            versions[rows, columns] = torch.where(out.response_mask.cpu().bool(), version, NO_VERSION)
            done += size
            for row, reason in zip(active, out.finish_reasons, strict=True):
                reasons[row] = reason
            active = [row for row in active if reasons[row] == FINISH_LENGTH and done < width]
            segment += 1
        return GenerationOutput(ids, mask, logprobs, reasons, token_versions=versions)

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.engine.sync_weights(named_tensors)

    def release_memory(self) -> None:
        self.engine.release_memory()


def version_span(token_versions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, R] per-token versions (`NO_VERSION` after the end) -> ([N] oldest, [N] newest) version of each
    response. A response's staleness is its oldest token's: the version it started under."""
    sampled = token_versions != NO_VERSION
    big = torch.iinfo(token_versions.dtype).max
    oldest = torch.where(sampled, token_versions, big).min(dim=-1).values
    return oldest, token_versions.max(dim=-1).values


def span_metrics(oldest: torch.Tensor, newest: torch.Tensor) -> dict[str, float]:
    """verl's partial-rollout counts for a batch, from each response's [N] oldest and newest token version:
    responses whose tokens came from more than one version, their share, and the widest span in versions."""
    span = newest - oldest
    return {
        "fully_async/partial/total_partial_num": float((span > 0).sum()),
        "fully_async/partial/partial_ratio": float((span > 0).double().mean()),
        "fully_async/partial/max_partial_span": float(span.max()),
    }
