"""FSDP2 gathering and gradient sync per optimizer step (`relm.distributed.gathering`), on 2 gloo processes.

Each of the 2 ranks shards the tiny Qwen2 (`shard_model`, replicated and sharded over both ranks) and
accumulates 2 mini-batches of 3 micro-batches each under every `GatherChoice`, on rows of its own;
every mini-batch's gradient must equal that of one plain model over both ranks' rows (fp32: within
1e-5 relative, only the order of additions differs), and the optimizer steps must leave the same
weights. The test also checks that each setting does what it says: deferred sync leaves the sharded
gradients empty until the last micro-batch; kept weights stay unsharded between micro-batches and
between no-grad forward passes, and are sharded again afterwards.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
LAYOUTS = (1, 2)  # shard sizes: replicated, sharded over both ranks


def batches(rank: int | None) -> list[list[torch.Tensor]]:
    """2 mini-batches x 3 micro-batches of [2, 6] token ids; `rank` None: both ranks' rows together."""
    generator = torch.Generator().manual_seed(7)
    minis = [[torch.randint(0, 64, (2, 2, 6), generator=generator) for _ in range(3)] for _ in range(2)]
    return [[m.flatten(0, 1) if rank is None else m[rank] for m in mini] for mini in minis]


def loss_of(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids, use_cache=False).logits  # [n, 6, V]
    return logits.float().square().mean(-1).sum() / 4  # a sum over rows, normalised by the global count


def is_sharded(param: torch.nn.Parameter) -> bool:
    return hasattr(param, "placements")


def worker(rank: int, store: str, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from relm.distributed.context import DistContext
    from relm.distributed.fsdp import full_tensor, shard_model
    from relm.distributed.gathering import Accumulation, GatherChoice, gathered_for_passes
    from relm.models.precision import pick_precision
    from tests.tiny_models import tiny_lm

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp",))
    ctx = DistContext(rank=rank, world_size=2, device=torch.device("cpu"), mesh=mesh)
    fp32 = pick_precision("float32", ctx.device)
    results: dict[str, object] = {}
    for shard_size in LAYOUTS:
        for defer in (False, True):
            for keep in (False, True):
                model = shard_model(tiny_lm(seed=0).train(), ctx, fp32, shard_size=shard_size)
                block = model.model.layers[0].self_attn.q_proj
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                grads, seen = [], {}
                with Accumulation(model, GatherChoice(defer, keep)) as accumulation:
                    for mini in batches(rank):
                        for index, ids in enumerate(mini):
                            # the global gradient is the ranks' sum; FSDP averages, so scale by 2
                            accumulation.backward(loss_of(model, ids) * 2, last=index == len(mini) - 1)
                            if index == 0 and keep:
                                seen["held after backward"] = not is_sharded(block.weight)
                            elif index == 0:  # the registered (sharded) parameter holds reduced grads
                                seen["reduced before the last"] = model.lm_head.weight.grad is not None
                        accumulation.end_minibatch()
                        seen["sharded at the step"] = is_sharded(block.weight)
                        grads.append(
                            {n: full_tensor(p.grad, ctx.device) for n, p in model.named_parameters()}
                        )
                        optimizer.step()
                        optimizer.zero_grad(set_to_none=True)
                with torch.no_grad(), gathered_for_passes(model, ctx.device) as held:
                    logits = [model(input_ids=ids).logits for ids in batches(rank)[0]]
                    seen["held between passes"] = held and not is_sharded(block.weight)
                seen["sharded after"] = is_sharded(block.weight)
                weights = {n: full_tensor(p.detach(), ctx.device) for n, p in model.named_parameters()}
                results[f"{shard_size} {defer} {keep}"] = {
                    "grads": grads, "weights": weights, "logits": logits, "seen": seen,
                }  # fmt: skip
    torch.save(results, f"{out}.{rank}")
    dist.destroy_process_group()


def reference() -> dict[str, object]:
    """One plain model over both ranks' rows: gradients per mini-batch, weights after, and the first
    mini-batch's logits of each rank's rows."""
    from tests.tiny_models import tiny_lm

    model = tiny_lm(seed=0).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    grads = []
    for mini in batches(None):
        for ids in mini:
            loss_of(model, ids).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    with torch.no_grad():
        logits = [[model(input_ids=ids).logits for ids in batches(rank)[0]] for rank in (0, 1)]
    weights = {name: p.detach() for name, p in model.named_parameters()}
    return {"grads": grads, "weights": weights, "logits": logits}


def rel(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    num = sum(float((a[k] - b[k]).double().square().sum()) for k in a)
    return (num / sum(float(a[k].double().square().sum()) for k in a)) ** 0.5


def test_gradients_once_per_step_and_kept_weights_match_one_plain_model(tmp_path: Path):
    import torch.multiprocessing as mp

    sys.path.insert(0, str(REPO))
    os.environ["OMP_NUM_THREADS"] = "1"
    mp.spawn(worker, args=(str(tmp_path / "store"), str(tmp_path / "out")), nprocs=2, join=True)
    expected = reference()
    for rank in (0, 1):
        results = torch.load(tmp_path / f"out.{rank}", weights_only=False)
        assert len(results) == 2 * 2 * 2
        for case, got in results.items():
            for step, (grads, want) in enumerate(zip(got["grads"], expected["grads"], strict=True)):
                assert rel(want, grads) <= 1e-5, (case, step, rel(want, grads))
            assert rel(expected["weights"], got["weights"]) <= 1e-6, case
            for logits, want in zip(got["logits"], expected["logits"][rank], strict=True):
                assert torch.allclose(logits, want, atol=1e-5), case
            _, defer, keep = case.split()
            seen = got["seen"]
            if keep == "True":
                assert seen["held after backward"], (case, seen)
            else:
                assert seen["reduced before the last"] == (defer == "False"), (case, seen)
            assert seen["held between passes"] and seen["sharded at the step"] and seen["sharded after"], case
