"""fp32 master weights with bf16 compute: small RL-sized updates land; bf16 storage loses them."""

from __future__ import annotations

import torch

from relm.models.precision import Precision, pick_precision


def test_auto_keeps_fp32_master_weights_and_computes_in_bf16_on_cuda_only():
    assert pick_precision("auto", torch.device("cpu")) == Precision(torch.float32, torch.float32, "cpu")
    assert pick_precision("auto", torch.device("cuda")) == Precision(torch.float32, torch.bfloat16, "cuda")
    assert pick_precision("bfloat16", torch.device("cuda")).master == torch.bfloat16


def one_adamw_step(master: torch.dtype, precision: Precision) -> float:
    """Share of weights that an lr=1e-6 AdamW step changed."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 64).to(master)
    with torch.no_grad():
        layer.weight.normal_(0, 0.02)
    before = layer.weight.detach().clone()
    optimizer = torch.optim.AdamW(layer.parameters(), lr=1e-6, weight_decay=0.0)
    with precision.autocast():
        loss = layer(torch.randn(8, 64, dtype=master)).float().pow(2).mean()
    loss.backward()
    optimizer.step()
    return (layer.weight != before).float().mean().item()


def test_fp32_master_with_bf16_autocast_moves_every_weight():
    mixed = Precision(master=torch.float32, compute=torch.bfloat16, device_type="cpu")
    assert one_adamw_step(torch.float32, mixed) > 0.99


def test_bf16_storage_rounds_most_small_updates_away():
    pure = Precision(master=torch.bfloat16, compute=torch.bfloat16, device_type="cpu")
    assert one_adamw_step(torch.bfloat16, pure) < 0.2


def test_a_step_inside_one_autocast_context_is_seen_by_the_next_forward():
    """The trainer runs a whole step (several mini-batches) in one autocast context; autocast caches
    its casts of the weights, so `clip_and_step` must drop them or the next mini-batch computes with
    the weights from before the update."""
    from relm.learner.optim import clip_and_step

    torch.manual_seed(0)
    layer = torch.nn.Linear(16, 16)
    optimizer = torch.optim.SGD(layer.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    x = torch.randn(4, 16)
    mixed = Precision(master=torch.float32, compute=torch.bfloat16, device_type="cpu")
    with mixed.autocast():
        before = layer(x)
        before.float().sum().backward()
        clip_and_step(layer, optimizer, scheduler, max_norm=1e9)
        after = layer(x)
    with mixed.autocast():
        fresh = layer(x)
    assert not torch.equal(after, before)
    assert torch.equal(after, fresh)
