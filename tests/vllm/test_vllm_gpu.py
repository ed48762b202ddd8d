"""vLLM on a GPU: sleep frees the engine's memory for the update, and the weights come back from the actor.

Needs a CUDA device and vLLM's CUDA build (`make test-vllm` on a GPU machine); CI's CPU machines skip it.
"""

from __future__ import annotations

import pytest
import torch

from relm.models.loading import load_causal_lm
from relm.models.zoo import materialize_zoo
from relm.rollout.base import SamplingParams
from tests.vllm.conftest import EOS, MAX_MODEL_LEN, PAD

pytest.importorskip("vllm", reason="vLLM is not installed (`make test-vllm`)")
pytestmark = [pytest.mark.vllm, pytest.mark.gpu]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_sleep_frees_memory_and_the_weights_come_back_from_the_actor() -> None:
    from relm.rollout.vllm_engine import VLLMRolloutEngine, VLLMSettings

    folder = str(materialize_zoo("zoo:tiny/qwen2-moe"))
    actor = load_causal_lm(folder, dtype=torch.float32, device=torch.device("cuda"), seed=0)
    settings = VLLMSettings(dtype=torch.bfloat16, max_model_len=MAX_MODEL_LEN, gpu_memory_utilization=0.3)
    engine = VLLMRolloutEngine(
        actor, folder, pad_token_id=PAD, eos_token_ids=[EOS], device="cuda", settings=settings
    )
    params = SamplingParams(n=2, max_new_tokens=8, seed=0)
    engine.generate([[5, 6, 7]], params)

    free_awake = torch.cuda.mem_get_info()[0]
    engine.release_memory()
    freed = torch.cuda.mem_get_info()[0] - free_awake
    # The KV cache (most of 30% of the GPU) and the weights are given back.
    assert freed > 0.1 * torch.cuda.get_device_properties(0).total_memory

    with torch.no_grad():
        for parameter in actor.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    engine.sync_weights(actor.named_parameters())  # wakes the weights only
    assert engine.generate([[5, 6, 7]], params).response_ids.shape == (2, 8)
    engine.check_agreement()  # bf16 tolerance

    engine.release_memory()  # asleep with no sync since: generate reloads the actor's weights itself
    engine.generate([[5, 6, 7]], params)
    engine.check_agreement()
    engine.close()
