"""FSDP2's CPU offload in the sharded plan (`relm.memory.sharded_plan`) and the data-parallel run's choice of
it (`relm.trainer.data_parallel.choose_offload`), by hand.

A CPU run cannot express a card: FSDP2's `CPUOffloadPolicy` moves shards from a GPU to CPU memory, and a
run that computes on the CPU refuses `offload_policy=true` (`relm.distributed.fsdp.shard_model`). So the
choice is tested here as a decision, the card reported by `device_memory` (as the single-GPU plan's tests
do) or cut by `trainer.max_gpu_memory_gb`; no offloaded step runs on CPU.
"""

from __future__ import annotations

import logging
import math

import pytest
import torch

from relm.config.loader import load_config
from relm.config.translate import translate
from relm.distributed.context import DistContext
from relm.distributed.layout import Layout, describe_layouts
from relm.memory.model_shape import ModelShape
from relm.memory.plan import GIB, LOGIT_SCRATCH_BYTES, PlanRequest, TraineeRequest
from relm.memory.sharded_plan import ShardedRankPlan, decide_offload, plan_sharded_rank
from relm.models.loading import resolve_model_dir
from relm.models.precision import pick_precision

KEY = "actor_rollout_ref.actor.fsdp_config.offload_policy"


def test_the_offloaded_plan_moves_the_shards_and_keeps_the_update_on_the_card():
    shape = ModelShape(num_params=1000, num_layers=2, hidden_size=10, intermediate_size=20, vocab_size=7)
    request = PlanRequest(
        trainees={"actor": TraineeRequest(shape)},
        has_reference=True,
        max_sequence_length=8,
        gpu_bytes=0,
        host_bytes=0,
    )

    def plan(offload: frozenset[str]) -> ShardedRankPlan:
        bf16 = torch.bfloat16
        return plan_sharded_rank(
            request,
            4,
            reference_dtype=bf16,
            engine_dtype=bf16,
            one_process_engine_dtype=bf16,
            offload=offload,
        )

    kept, moved = plan(frozenset()), plan(frozenset({"actor"}))
    # 16 P / 4 = 4000 shards, 2 P / 4 = 500 reference, 2 P = 2000 copy, 4 V H = 280 in flight
    assert kept.steady == moved.steady == 4000 + 500 + 2000 + 280
    assert (kept.offloaded, moved.offloaded) == (0, 4000 + 500)  # the actor takes its reference along
    # two gathered bf16 blocks 4 (P - 2 V H) / L = 1720 and the root 2 (2 V H) = 280; one checkpointed
    # sequence of 8 tokens at 4 L H + 2 (12 H + 6 I) = 560 bytes; the log-softmax scratch
    assert kept.update_extra == 1720 + 280 + 8 * 560 + LOGIT_SCRATCH_BYTES
    assert kept.card == 6780 + 6480 + LOGIT_SCRATCH_BYTES
    assert moved.card == 6780 - 4500 + 6480 + LOGIT_SCRATCH_BYTES
    assert (
        "in CPU memory" not in kept.describe() and "of them in CPU memory (FSDP2 offload)" in moved.describe()
    )


def gib_plan(offloaded: int) -> ShardedRankPlan:
    """16 GiB of shards, 2 of reference, a 4 GiB copy, 4 GiB of update: 26 GiB a card, 8 offloaded."""
    return ShardedRankPlan(
        shard_size=2,
        trained_shards=16 * GIB,
        reference_shard=2 * GIB,
        engine_copy=4 * GIB,
        in_flight=0,
        one_process=0,
        offloaded=offloaded,
        update_extra=4 * GIB,
    )


KEPT, MOVED = gib_plan(0), gib_plan(18 * GIB)


def decide(card_gib: float, host_gib: float, user: bool | None = None) -> tuple[bool, str | None]:
    return decide_offload(
        KEPT, MOVED, card_bytes=int(card_gib * GIB), host_bytes=int(host_gib * GIB), local_ranks=2, user=user,
        key=KEY,
    )  # fmt: skip


def test_unset_offload_turns_on_where_only_it_fits_card_and_host():
    assert (KEPT.card, MOVED.card) == (26 * GIB, 8 * GIB)
    assert decide(40, 100) == (False, None)  # 0.85 x 40 = 34 GiB holds 26: nothing to say
    on, line = decide(20, 100)  # 17 GiB usable: only 8 fits; two ranks pin 36 GiB of 0.7 x 100 = 70
    assert on and line == (
        f"FSDP2 CPU offload on ({KEY} unset): the sharded models need ~26.0 GiB of each card with the "
        "shards on it, over the 17.0 GiB usable; ~8.0 GiB with them in CPU memory, where this machine's 2 "
        f"ranks keep ~36.0 GiB of the 70.0 GiB it can pin (70% of 100.0 GiB); {KEY}=false keeps them on "
        "the cards"
    )
    on, line = decide(20, 50)  # 0.7 x 50 = 35 GiB < 36: the host cannot take it either
    assert not on and line is not None and "neither fits" in line and "~36.0 GiB of the 35.0 GiB" in line
    on, line = decide(9, 100)  # 7.65 GiB usable < 8
    assert not on and line is not None and "neither fits" in line


def test_the_users_value_is_kept():
    assert decide(40, 100, user=True) == (True, None)  # asked for though it fits: kept, the layout says so
    assert decide(40, 100, user=False) == (False, None)
    on, line = decide(20, 100, user=False)
    assert not on and line == (
        f"{KEY}=false in the config: the sharded models need ~26.0 GiB of each card with the shards on "
        "it, over the 17.0 GiB usable; unset it or set it true: that fits"
    )
    on, line = decide(20, 10, user=False)
    assert not on and line is not None and "that fits" not in line


def run_choice(monkeypatch, caplog, card_bytes: int, host_bytes: int, *overrides: str) -> dict[str, Layout]:
    """`choose_offload` for the tiny Qwen2 (GRPO with a KL loss: actor and reference), two ranks a machine,
    on a card of `card_bytes` and a machine of `host_bytes` as `device_memory` reports them."""
    from relm.trainer import data_parallel

    monkeypatch.setattr(data_parallel, "device_memory", lambda device: (card_bytes, host_bytes))
    spec = translate(
        load_config(
            ["algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.use_kl_loss=true",
             "trainer.n_gpus_per_node=2", *overrides]
        )
    )[0]  # fmt: skip
    layouts = {name: Layout(2, 2, "the memory plan does not fit one GPU") for name in ("actor", "reference")}
    folder = resolve_model_dir("zoo:tiny/qwen2")
    cpu = torch.device("cpu")
    with caplog.at_level(logging.INFO, logger="relm"):
        return data_parallel.choose_offload(spec, folder, DistContext(), pick_precision("auto", cpu), layouts)


def tiny_plans() -> tuple[ShardedRankPlan, ShardedRankPlan]:
    from relm.memory.choices import sharded_rank_plan

    spec = translate(
        load_config(["algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.use_kl_loss=true"])
    )[0]
    folder, cpu = resolve_model_dir("zoo:tiny/qwen2"), torch.device("cpu")
    precision = pick_precision("auto", cpu)
    kept = sharded_rank_plan(spec, folder, cpu, precision, 2)
    return kept, sharded_rank_plan(spec, folder, cpu, precision, 2, frozenset({"actor"}))


def test_a_run_whose_card_holds_the_shards_only_in_cpu_memory_offloads_them(monkeypatch, caplog):
    kept, moved = tiny_plans()
    # fp32 on CPU: 16 P / 2 + 4 P / 2 of shards and reference, all of which the offload moves
    assert moved.offloaded == kept.trained_shards + kept.reference_shard and moved.card < kept.card
    between = math.ceil((kept.card + moved.card) / 2 / 0.85)  # a card whose usable share lies between them
    layouts = run_choice(monkeypatch, caplog, between, 64 * GIB)
    assert layouts["actor"].offload and layouts["reference"].offload
    lines = [r.getMessage() for r in caplog.records if "CPU offload on" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith(f"FSDP2 CPU offload on ({KEY} unset)")
    assert "shards in CPU memory" in describe_layouts(layouts)
    caplog.clear()
    # the same card through trainer.max_gpu_memory_gb on a large one
    budget = f"trainer.max_gpu_memory_gb={between / 1e9:.9f}"
    assert run_choice(monkeypatch, caplog, 10**12, 64 * GIB, budget)["actor"].offload
    caplog.clear()
    # a card that holds the shards: left on it, silently
    roomy = run_choice(monkeypatch, caplog, math.ceil(kept.card / 0.85), 64 * GIB)
    assert not roomy["actor"].offload and not caplog.records


def test_no_offload_where_the_machine_cannot_pin_it_or_the_user_says_false(monkeypatch, caplog):
    kept, moved = tiny_plans()
    between = math.ceil((kept.card + moved.card) / 2 / 0.85)
    short_host = (2 * moved.offloaded) * 10 // 7 - 1024  # two ranks pin more than 70% of it
    layouts = run_choice(monkeypatch, caplog, between, short_host)
    assert not layouts["actor"].offload
    assert [r.levelname for r in caplog.records if "neither fits" in r.getMessage()] == ["WARNING"]
    caplog.clear()
    layouts = run_choice(monkeypatch, caplog, between, 64 * GIB, f"{KEY}=false")
    assert not layouts["actor"].offload and not layouts["reference"].offload
    assert any(r.getMessage().startswith(f"{KEY}=false in the config") for r in caplog.records)


@pytest.mark.parametrize("value", [True, None])
def test_on_cpu_only_the_users_value_counts(value: bool | None):
    from relm.trainer.data_parallel import choose_offload

    overrides = ["algorithm.adv_estimator=grpo", *([f"{KEY}=true"] if value else [])]
    spec = translate(load_config(overrides))[0]
    layouts = {"actor": Layout(2, 2, "no memory plan on cpu")}
    cpu = torch.device("cpu")
    chosen = choose_offload(
        spec, "unused: no plan on cpu", DistContext(), pick_precision("auto", cpu), layouts
    )
    assert chosen["actor"].offload is bool(value)  # on CPU, true then stops in shard_model
