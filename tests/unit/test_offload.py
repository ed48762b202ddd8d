"""Parking models in CPU memory between phases: values, identities and optimizer state survive the trip."""

from __future__ import annotations

import pytest
import torch

from relm.training.offload import PHASE_NEEDS, ParkedModel, Residency
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
    generator = ParkedModel(tiny_lm(seed=2).to(DEVICE), DEVICE)
    residency = Residency({"reference": ref, "generator": generator})
    with residency.phase("update_actor"):
        assert ref.parked and generator.parked
    with residency.phase("reference"):
        assert not ref.parked and generator.parked
        assert next(ref.module.parameters()).device.type == DEVICE.type
    with residency.phase("generate"):
        assert ref.parked and not generator.parked
    assert set(PHASE_NEEDS["sync"]) == {"generator"}


def test_an_unknown_model_name_is_refused():
    with pytest.raises(ValueError, match="no phase uses"):
        Residency({"actor": ParkedModel(tiny_lm(seed=0), DEVICE)})
