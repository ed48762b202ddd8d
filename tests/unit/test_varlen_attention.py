"""The flash variable-length kernel path of packed attention (CUDA only; the CPU path is in test_packing)."""

from __future__ import annotations

import pytest
import torch

from relm.learner.forward import response_logprobs
from relm.learner.varlen_attention import (
    VARLEN_ATTENTION,
    register_varlen_attention,
    varlen_kernel_available,
)
from relm.models.loading import load_causal_lm, resolve_model_dir
from tests.unit.test_packing import padded_batch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not varlen_kernel_available(), reason="needs CUDA and torch's varlen kernel"),
]


@pytest.mark.parametrize("autocast", [False, True])
def test_flash_varlen_equals_padded_sdpa(autocast: bool):
    # bf16 weights directly, or fp32 master weights under bf16 autocast (what the trainer runs)
    dtype = torch.float32 if autocast else torch.bfloat16
    model = load_causal_lm(resolve_model_dir("zoo:tiny/qwen2-hd64"), dtype=dtype, device="cuda")
    ids, mask, r = (
        t.cuda() if isinstance(t, torch.Tensor) else t for t in padded_batch(model.config.vocab_size)
    )
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    response_mask = mask[:, -r:].bool()
    register_varlen_attention()
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16, enabled=autocast):
        padded, _ = response_logprobs(model, ids, mask, positions, r)
        model.set_attn_implementation(VARLEN_ATTENTION)
        packed, _ = response_logprobs(model, ids, mask, positions, r, remove_padding=True)
    gap = (packed - padded)[response_mask].abs()
    # bf16 attention in two different kernels: rounding differences only
    assert gap.max() < 0.05 and gap.mean() < 0.01
