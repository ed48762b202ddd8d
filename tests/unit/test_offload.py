"""Parking models in CPU memory between phases: values, identities and optimizer state survive the trip."""

from __future__ import annotations

import pytest
import torch

from relm.memory.offload import PHASE_NEEDS, OffloadedOptimizerStates, ParkedModel, Residency
from tests.tiny_models import tiny_lm

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def test_round_trip_keeps_parameters_and_optimizer_state():
    model = tiny_lm(seed=0).to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(input_ids=torch.tensor([[1, 2, 3]], device=DEVICE)).logits.sum().backward()
    optimizer.step()
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    state_before = [s["exp_avg"].clone() for s in optimizer.state.values()]
    params = list(model.parameters())
    parked = ParkedModel(model, DEVICE, optimizer)
    parked.park()
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert all(s["exp_avg"].device.type == "cpu" for s in optimizer.state.values())
    parked.unpark()
    assert list(model.parameters()) == params and all(p.device == params[0].device for p in params)
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name
    for state, want in zip(optimizer.state.values(), state_before, strict=True):
        assert torch.equal(state["exp_avg"], want) and state["exp_avg"].device.type == DEVICE.type
    # the optimizer still steps the same parameter objects
    model(input_ids=torch.tensor([[3, 2, 1]], device=DEVICE)).logits.sum().backward()
    optimizer.step()
    assert any(not torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_phases_move_only_what_they_use():
    ref = ParkedModel(tiny_lm(seed=1).to(DEVICE), DEVICE)
    engine_copy = ParkedModel(tiny_lm(seed=2).to(DEVICE), DEVICE)
    residency = Residency({"reference": ref, "engine_copy": engine_copy})
    with residency.phase("update_actor"):
        assert ref.parked and engine_copy.parked
    with residency.phase("reference"):
        assert not ref.parked and engine_copy.parked
        assert next(ref.module.parameters()).device.type == DEVICE.type
    with residency.phase("generate"):
        assert ref.parked and not engine_copy.parked
    assert set(PHASE_NEEDS["sync"]) == {"engine_copy"}


def test_an_unknown_model_name_is_refused():
    with pytest.raises(ValueError, match="no phase uses"):
        Residency({"actor": ParkedModel(tiny_lm(seed=0), DEVICE)})


def test_chunked_offloaded_adamw_steps_exactly_like_adamw():
    plain, chunked = tiny_lm(seed=0).to(DEVICE), tiny_lm(seed=0).to(DEVICE)
    opt_plain = torch.optim.AdamW(plain.parameters(), lr=1e-2, weight_decay=0.1)
    opt_chunked = torch.optim.AdamW(chunked.parameters(), lr=1e-2, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt_chunked, lambda step: 1.0 / (step + 1))
    scheduler_plain = torch.optim.lr_scheduler.LambdaLR(opt_plain, lambda step: 1.0 / (step + 1))
    offload = OffloadedOptimizerStates(opt_chunked, DEVICE, chunk_bytes=4096)  # many chunks
    assert len(offload._chunks()) > 5
    ids = torch.tensor([[1, 2, 3, 4]], device=DEVICE)
    for _ in range(3):
        for model, optimizer, sched in (
            (plain, opt_plain, scheduler_plain),
            (chunked, opt_chunked, scheduler),
        ):
            model(input_ids=ids).logits.square().mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            sched.step()
    for (name, a), b in zip(plain.state_dict().items(), chunked.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=name)
    assert all(s["exp_avg"].device.type == "cpu" for s in opt_chunked.state.values())
    assert scheduler.get_last_lr() == scheduler_plain.get_last_lr()
    assert all(len(g["params"]) for g in opt_chunked.param_groups)  # groups restored after each step


def test_host_buffers_fill_power_of_two_slabs_instead_of_rounding_each_tensor(
    monkeypatch: pytest.MonkeyPatch,
):
    from relm.memory.offload import HostBuffers

    monkeypatch.setattr(HostBuffers, "SLAB_BYTES", 1 << 20)
    buffers = HostBuffers()
    # three 300 KiB tensors fit one 1 MiB slab (pinned one by one, each would take 512 KiB)
    parts = [buffers.get(i, torch.empty(300 * 256, dtype=torch.float32)) for i in range(3)]
    assert buffers.pinned_bytes == 1 << 20
    big = buffers.get("big", torch.empty(3 << 18, dtype=torch.bfloat16))  # 1.5 MiB: a 2 MiB slab of its own
    assert buffers.pinned_bytes == 3 << 20 and big.shape == (3 << 18,) and big.dtype == torch.bfloat16
    small = buffers.get("small", torch.empty(1000, dtype=torch.float32))  # into the big slab's rest
    assert buffers.pinned_bytes == 3 << 20
    for index, tensor in enumerate([*parts, big, small]):
        tensor.fill_(index)
    assert [float(t[0]) for t in (*parts, big, small)] == [0, 1, 2, 3, 4]  # no two overlap
    assert buffers.get(0, parts[0]) is parts[0]
