"""The compact AdamW: torch's AdamW bit for bit in fp32, close with bf16 moments, and unbiased
stochastic rounding that lets 1e-6-sized updates move bf16 weights."""

from __future__ import annotations

import pytest
import torch

from relm.learner import compact_adamw
from relm.learner.compact_adamw import CompactAdamW, stochastic_round_to_bf16
from relm.memory.offload import OffloadedOptimizerStates
from tests.tiny_models import tiny_lm

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def run_steps(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int = 4) -> None:
    ids = torch.tensor([[1, 2, 3, 4, 5]], device=next(model.parameters()).device)
    for step in range(steps):
        model(input_ids=ids.roll(step)).logits.float().square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def test_fp32_weights_and_moments_equal_torch_adamw_exactly(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(compact_adamw, "SLICE_ELEMENTS", 1000)  # many slices per tensor: slicing is exact
    plain, compact = tiny_lm(seed=0).to(DEVICE), tiny_lm(seed=0).to(DEVICE)
    settings = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-6, weight_decay=0.1)
    run_steps(plain, torch.optim.AdamW(plain.parameters(), foreach=False, **settings))
    optimizer = CompactAdamW(compact.parameters(), **settings)
    run_steps(compact, optimizer)
    for (name, want), got in zip(plain.state_dict().items(), compact.state_dict().values(), strict=True):
        assert torch.equal(got, want), name
    assert all(s["exp_avg"].dtype == torch.float32 for s in optimizer.state.values())


def test_bf16_moments_stay_within_bf16_rounding_of_fp32_adamw():
    plain, compact = tiny_lm(seed=0), tiny_lm(seed=0)
    start = {k: v.clone() for k, v in plain.state_dict().items()}
    lr = 1e-3
    run_steps(plain, torch.optim.AdamW(plain.parameters(), lr=lr, foreach=False))
    optimizer = CompactAdamW(compact.parameters(), lr=lr, moments_dtype=torch.bfloat16)
    run_steps(compact, optimizer)
    assert all(s["exp_avg_sq"].dtype == torch.bfloat16 for s in optimizer.state.values())
    for name, want in plain.state_dict().items():
        got, moved = compact.state_dict()[name], (want - start[name]).abs()
        # A step moves a weight by lr * m_hat / sqrt(v_hat), |m_hat / sqrt(v_hat)| <= ~1. Stochastic rounding
        # puts m within one bf16 spacing (2^-8 relative) and sqrt(v) within half of one, so a step's update
        # is off by at most 1.5 * 2^-8 = 0.6% of lr, and four steps by 2.3% of lr.
        assert (got - want).abs().max() <= 0.023 * lr, name
        assert moved.max() > 0.5 * lr, name  # and the steps were real ones


def test_stochastic_rounding_is_unbiased():
    # 1 + 0.3 ulp lies between the bf16 neighbours 1 and 1 + 2^-7: it rounds up 30% of the time
    ulp = 2.0**-7
    value = torch.full((200_000,), 1 + 0.3 * ulp)
    rounded = stochastic_round_to_bf16(value, torch.Generator().manual_seed(0))
    assert set(rounded.float().unique().tolist()) == {1.0, 1 + ulp}
    # mean of 200k Bernoulli(0.3) draws: standard error sqrt(0.3 * 0.7 / 2e5) = 1.0e-3 of an ulp;
    # 5e-3 ulp is five standard errors
    assert abs(rounded.double().mean().item() - value[0].item()) < 5e-3 * ulp
    negative = stochastic_round_to_bf16(-value, torch.Generator().manual_seed(1)).double().mean().item()
    assert abs(negative + value[0].item()) < 5e-3 * ulp


def test_exact_bf16_values_and_specials_survive_rounding():
    values = torch.tensor([0.0, -0.0, 1.0, -2.5, 3.0e38, float("inf"), float("-inf")])
    rounded = stochastic_round_to_bf16(values.bfloat16().float())
    assert torch.equal(rounded.float(), values.bfloat16().float())
    assert stochastic_round_to_bf16(torch.tensor([float("nan")])).isnan().all()


def update_of_bf16_weights(optimizer_class, **kwargs) -> float:
    """Mean change of 4096 bf16 weights at 0.02 after 10 AdamW steps of lr 1e-6 with a constant gradient."""
    weight = torch.nn.Parameter(torch.full((4096,), 0.02, dtype=torch.bfloat16))
    start = weight.detach().double().clone()
    optimizer = optimizer_class([weight], lr=1e-6, weight_decay=0.0, **kwargs)
    for _ in range(10):
        weight.grad = torch.full_like(weight, -1.0)  # each step adds lr (Adam's update is lr * sign)
        optimizer.step()
    return (weight.detach().double() - start).mean().item()


def test_a_1e_6_update_moves_bf16_weights_in_expectation_and_round_to_nearest_does_not():
    # bf16's spacing at 0.02 is 2^-6 * 2^-7 = 1.2e-4; ten 1e-6 steps are 1e-5, under half of it
    assert update_of_bf16_weights(torch.optim.AdamW, foreach=False) == 0.0
    moved = update_of_bf16_weights(CompactAdamW)
    # 4096 weights each up 1.2e-4 with probability ~1e-5 / 1.2e-4: the mean is 1e-5 with a standard
    # error of 1.2e-4 * sqrt(0.08 * 0.92 / 4096) = 5e-7 (cumulative rounding keeps each weight's mean)
    assert moved == pytest.approx(1e-5, rel=0.2)


def test_offloaded_bf16_moments_step_like_resident_ones_and_wait_in_bf16():
    resident, offloaded = tiny_lm(seed=0).to(DEVICE), tiny_lm(seed=0).to(DEVICE)
    opt_resident = CompactAdamW(resident.parameters(), lr=1e-2, moments_dtype=torch.bfloat16, seed=3)
    opt_offloaded = CompactAdamW(offloaded.parameters(), lr=1e-2, moments_dtype=torch.bfloat16, seed=3)
    offload = OffloadedOptimizerStates(opt_offloaded, DEVICE, chunk_bytes=4096)
    assert len(offload._chunks()) > 5
    run_steps(resident, opt_resident)
    run_steps(offloaded, opt_offloaded)
    for (name, want), got in zip(resident.state_dict().items(), offloaded.state_dict().values(), strict=True):
        assert torch.equal(got, want), name
    # host buffers hold bf16: half of fp32's bytes
    buffers = offload._host.buffers
    assert buffers and all(buffer.dtype == torch.bfloat16 for buffer in buffers.values())
    assert all(buffer.is_pinned() == torch.cuda.is_available() for buffer in buffers.values())


def test_a_checkpoint_restores_bf16_weights_fp32_moments_without_loss():
    model = tiny_lm(seed=0).to(torch.bfloat16)
    optimizer = CompactAdamW(model.parameters(), lr=1e-3)  # fp32 moments beside bf16 weights
    run_steps(model, optimizer, steps=2)
    saved = optimizer.state_dict()
    restored = CompactAdamW(model.parameters(), lr=1e-3)
    restored.load_state_dict(saved)
    for index, state in restored.state_dict()["state"].items():
        assert state["exp_avg"].dtype == torch.float32
        assert torch.equal(state["exp_avg"], saved["state"][index]["exp_avg"])
        assert state["step"].item() == 2
