"""Partial rollouts (`relm.rollout.partial`): responses generated in segments, new weights loaded between them.

The check that matters: every token carries the logprob of the weights that sampled it, and the version of those
weights. Three weight versions are made here (the tiny model's, then two perturbed copies), loaded one per
segment as the rollout process loads weights that arrive mid-step; each token's logprob is then compared with
the trainer's forward of prompt + whole response under its own version's weights, and shown to be far from the
other versions' forwards (so the comparison can tell the versions apart).
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import PreTrainedModel

from relm.learner.batch import Rollout
from relm.learner.forward import response_logprobs
from relm.rollout.base import FINISH_LENGTH, FINISH_STOP, SamplingParams, logprob_tolerance
from relm.rollout.hf_engine import HFRolloutEngine
from relm.rollout.native.engine import NativeRolloutEngine
from relm.rollout.padding import left_pad
from relm.rollout.partial import (
    NO_VERSION,
    SegmentedEngine,
    segment_tokens,
    span_metrics,
    version_span,
)
from tests.tiny_models import tiny_lm

PAD = 0
EOS = [5, 9]
PROMPTS = [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10], [11, 12, 13, 14]]
PARAMS = SamplingParams(n=2, max_new_tokens=12, temperature=1.0, seed=3)
SEGMENT = 4


def _versions() -> list[dict[str, torch.Tensor]]:
    """Three weight versions: the tiny model's, then each one a clear step away from the one before."""
    model = tiny_lm(seed=0)
    generator = torch.Generator().manual_seed(7)
    versions = [{k: v.clone() for k, v in model.state_dict().items()}]
    for _ in range(2):
        versions.append(
            {
                k: v + 0.1 * torch.randn(v.shape, generator=generator) if v.is_floating_point() else v
                for k, v in versions[-1].items()
            }
        )
    return versions


def _engine(kind: str, model: PreTrainedModel):
    if kind == "hf":
        return HFRolloutEngine(model, pad_token_id=PAD, eos_token_ids=EOS, device="cpu")
    return NativeRolloutEngine(model, pad_token_id=PAD, eos_token_ids=EOS, device="cpu")


class OneVersionPerSegment:
    """`refresh` as the rollout process calls it, with version k's weights arriving before segment k."""

    def __init__(self, engine, versions: list[dict[str, torch.Tensor]]) -> None:
        self.engine, self.versions, self.calls = engine, versions, 0

    def __call__(self) -> int:
        version = min(self.calls, len(self.versions) - 1)
        self.engine.sync_weights(list(self.versions[version].items()))
        self.calls += 1
        return version


def _trainer_logprobs(weights: dict[str, torch.Tensor], out) -> torch.Tensor:
    """[N, R] logprobs of the whole responses under `weights`, as the trainer computes them."""
    model = tiny_lm(seed=0)
    model.load_state_dict(weights)
    prompt_ids, prompt_mask = left_pad([p for p in PROMPTS for _ in range(PARAMS.n)], PAD)
    input_ids = torch.cat([prompt_ids, out.response_ids], dim=1)
    mask = torch.cat([prompt_mask, out.response_mask], dim=1)
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    with torch.no_grad():
        logprobs, _ = response_logprobs(model, input_ids, mask, positions, out.response_ids.shape[1])
    return logprobs


def _segmented(kind: str, versions: list[dict[str, torch.Tensor]]):
    engine = _engine(kind, copy.deepcopy(tiny_lm(seed=0)))
    return SegmentedEngine(engine, PAD, SEGMENT, OneVersionPerSegment(engine, versions)).generate(
        PROMPTS, PARAMS
    )


@pytest.mark.parametrize("kind", ["hf", "native"])
def test_each_token_carries_the_logprob_and_version_of_the_weights_that_sampled_it(kind: str):
    versions = _versions()
    out = _segmented(kind, versions)

    mask = out.response_mask.bool()
    assert out.token_versions is not None
    assert torch.equal(out.token_versions == NO_VERSION, ~mask)
    # Segment k (columns 4k..4k+3) ran under version k, for every row still going then.
    columns = torch.arange(PARAMS.max_new_tokens).expand_as(mask)
    assert torch.equal(out.token_versions[mask], (columns // SEGMENT)[mask])
    oldest, newest = version_span(out.token_versions)
    assert (oldest == 0).all() and (newest == 2).any() and (newest == 0).any(), out.token_versions
    assert FINISH_STOP in out.finish_reasons and FINISH_LENGTH in out.finish_reasons

    max_gap, mean_gap = logprob_tolerance(torch.float32)
    for version, weights in enumerate(versions):
        expected = _trainer_logprobs(weights, out)
        mine = mask & (out.token_versions == version)
        others = mask & (out.token_versions != version)
        assert mine.any()
        gap = (out.logprobs[mine] - expected[mine]).abs()
        assert gap.max() <= max_gap and gap.mean() <= mean_gap, (version, gap.max())
        # Another version's tokens are far from this version's forward: the check tells versions apart.
        assert (out.logprobs[others] - expected[others]).abs().max() > 0.05, version


def test_a_partial_rollout_is_reproducible_and_starts_as_the_engine_does_alone():
    versions = _versions()
    first, second = _segmented("hf", versions), _segmented("hf", versions)
    for a, b in (
        (first.response_ids, second.response_ids),
        (first.logprobs, second.logprobs),
        (first.token_versions, second.token_versions),
    ):
        assert torch.equal(a, b)
    assert first.finish_reasons == second.finish_reasons

    alone = _engine("hf", tiny_lm(seed=0)).generate(PROMPTS, PARAMS)
    assert torch.equal(first.response_ids[:, :SEGMENT], alone.response_ids[:, :SEGMENT])
    assert not torch.equal(first.response_ids, alone.response_ids)  # later segments ran under other weights


def test_rows_that_end_in_a_segment_are_not_continued():
    engine = _engine("hf", tiny_lm(seed=0))
    prompts: list[list[list[int]]] = []

    class Recording:
        def generate(self, batch, params):
            prompts.append(batch)
            return engine.generate(batch, params)

        def sync_weights(self, named):
            engine.sync_weights(named)

        def release_memory(self) -> None:
            engine.release_memory()

    out = SegmentedEngine(Recording(), PAD, SEGMENT, lambda: 0).generate(PROMPTS, PARAMS)
    lengths = out.response_lengths
    # The second call continues exactly the rows that had not ended after the first 4 tokens, from their
    # prompt and those 4 tokens.
    going = [row for row in range(len(lengths)) if lengths[row] > SEGMENT]
    assert prompts[1] == [PROMPTS[row // 2] + out.response_ids[row, :SEGMENT].tolist() for row in going]
    assert len(prompts) == 1 + -(-(int(lengths.max()) - SEGMENT) // SEGMENT)


def test_segments_are_a_quarter_of_the_response_length_rounded_up():
    assert [segment_tokens(r) for r in (1, 4, 8, 9, 1024)] == [1, 1, 2, 3, 256]


def test_version_span_and_verls_partial_counts():
    versions = torch.tensor([[3, 3, NO_VERSION], [2, 3, 4], [4, NO_VERSION, NO_VERSION]])
    oldest, newest = version_span(versions)
    assert oldest.tolist() == [3, 2, 4] and newest.tolist() == [3, 4, 4]
    assert span_metrics(oldest, newest) == {
        "fully_async/partial/total_partial_num": 1.0,
        "fully_async/partial/partial_ratio": 1 / 3,
        "fully_async/partial/max_partial_span": 2.0,
    }


def test_token_versions_follow_rows_through_select_and_concat():
    def rollout(versions: torch.Tensor | None, rows: int) -> Rollout:
        zeros = torch.zeros(rows, 2, dtype=torch.long)
        return Rollout(
            prompt_ids=zeros, prompt_mask=zeros, response_ids=zeros, response_mask=zeros,
            response_attention_mask=zeros, group_ids=torch.arange(rows), data_sources=["x"] * rows,
            ground_truths=[None] * rows, extra_infos=[{}] * rows, finish_reasons=["stop"] * rows,
            rollout_logprobs=zeros.float(), token_versions=versions,
        )  # fmt: skip

    a = rollout(torch.tensor([[0, 0], [0, 1]]), 2)
    b = rollout(torch.tensor([[1, -1]]), 1)
    joined = Rollout.concat([a, b], pad_token_id=PAD)
    assert joined.token_versions is not None
    assert joined.token_versions.tolist() == [[0, 0], [0, 1], [1, -1]]
    picked = joined.select([2, 0]).token_versions
    assert picked is not None and picked.tolist() == [[1, -1], [0, 0]]
    assert Rollout.concat([rollout(None, 1), rollout(None, 2)], PAD).token_versions is None
    with pytest.raises(ValueError, match="token_versions"):
        Rollout.concat([a, rollout(None, 1)], PAD)
