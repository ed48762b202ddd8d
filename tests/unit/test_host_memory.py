"""Host memory: what the machine can give (cgroup v1/v2, MemAvailable), the room a budget leaves, the
watchdog's reading and its stop in the main thread with the phase named, and the budget keys reaching the plan."""

from __future__ import annotations

import mmap
import time
from pathlib import Path

import pytest
import torch

from relm.config.translate import translate
from relm.memory.host import (
    HostMemoryShort,
    HostWatchdog,
    available_host_bytes,
    host_room,
    process_rss_bytes,
    watching,
)
from relm.memory.plan import GIB, HOST_SHARE, USABLE_SHARE, Lora


def test_cgroup_v1_limit_and_its_no_limit_value(tmp_path: Path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 100000000 kB\nMemAvailable: 20000000 kB\n")
    cgroup = tmp_path / "cg"
    cgroup.mkdir()
    (cgroup / "memory.limit_in_bytes").write_text("8000000000\n")
    (cgroup / "memory.usage_in_bytes").write_text("3000000000\n")
    assert available_host_bytes(meminfo, cgroup) == 5_000_000_000
    (cgroup / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    assert available_host_bytes(meminfo, cgroup) == 20_000_000 * 1024


def test_a_budget_counts_what_the_process_holds():
    assert host_room(None, available=10 * GIB, rss=GIB) == 10 * GIB
    assert host_room(4 * GIB, available=10 * GIB, rss=GIB) == 3 * GIB
    assert host_room(4 * GIB, available=2 * GIB, rss=GIB) == 2 * GIB
    assert host_room(GIB, available=None, rss=2 * GIB) == 0


def test_watchdog_reading():
    dog = HostWatchdog(lambda: "x", budget_bytes=4 * 10**9, floor_bytes=GIB)
    assert dog.check(available=8 * GIB, rss=3 * 10**9) is None
    assert "holds 5.0 GB of host memory, over trainer.max_host_memory_gb=4" in dog.check(8 * GIB, 5 * 10**9)
    assert "has 0.54 GB of host memory left" in HostWatchdog(lambda: "x").check(GIB // 2, 10**9)


def test_watchdog_stops_the_main_thread_with_the_phase_named_on_a_real_allocation():
    budget = process_rss_bytes() + 200 * 10**6
    dog = HostWatchdog(lambda: "update_actor of step 3", budget_bytes=budget, poll_seconds=0.02)
    start = time.monotonic()
    with (
        pytest.raises(
            HostMemoryShort, match=r"over trainer.max_host_memory_gb=.* during update_actor of step 3"
        ),
        watching(dog),
    ):
        # 400 MB from a fresh anonymous mapping, every page touched, held while the loop waits. Not from
        # malloc: after a CPU run in this process (relm.memory.host_allocator keeps freed memory in the
        # heap) a tensor of that size reuses pages already resident, and the RSS does not grow.
        region = mmap.mmap(-1, 400 * 10**6)
        held = torch.frombuffer(region, dtype=torch.uint8).fill_(1)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            time.sleep(0.01 + 0 * held[0].item())
    assert time.monotonic() - start < 5  # stopped by the watchdog, not by the end of the loop
    assert not dog._thread.is_alive()  # stopped with the block


def test_budget_keys_reach_the_plan(monkeypatch: pytest.MonkeyPatch):
    from relm.config.loader import load_config
    from relm.memory import choices
    from relm.models.loading import resolve_model_dir

    # plan a CPU machine's run as if it had an H200 with 126 GiB of host memory available
    monkeypatch.setattr(choices, "device_memory", lambda device: (150_754_820_096, 126 * GIB))
    monkeypatch.setattr(choices, "process_rss_bytes", lambda: 2 * 10**9)
    cfg = load_config(["trainer.max_gpu_memory_gb=24", "trainer.max_host_memory_gb=32"])
    plan = choices.choose_memory(
        translate(cfg)[0], resolve_model_dir(cfg.actor_rollout_ref.model.path), device=torch.device("cuda")
    ).plan
    assert plan is not None
    assert plan.budget_bytes == int(24 * 10**9 * USABLE_SHARE)
    # the host budget less what the process holds, of which pinned buffers may take HOST_SHARE
    assert plan.host_budget_bytes == int(30 * 10**9 * HOST_SHARE)
    cfg = load_config([])
    plan = choices.choose_memory(
        translate(cfg)[0], resolve_model_dir(cfg.actor_rollout_ref.model.path), device=torch.device("cuda")
    ).plan
    assert plan is not None and plan.budget_bytes == int(150_754_820_096 * USABLE_SHARE)
    assert plan.host_budget_bytes == int(126 * GIB * HOST_SHARE)


@pytest.mark.parametrize("key", ["trainer.max_gpu_memory_gb=0", "trainer.max_host_memory_gb=-1"])
def test_budgets_must_be_positive(key: str):
    from relm.config.loader import load_config
    from relm.config.validate import validate_config
    from relm.errors import UserError

    with pytest.raises(UserError, match=f"`{key.split('=')[0]}` must be greater than 0"):
        validate_config(load_config([key]))


def test_lora_keys_reach_the_plan_request(tmp_path: Path):
    from relm.config.loader import load_config
    from relm.memory import choices
    from relm.models.precision import pick_precision
    from relm.models.zoo import zoo_config

    zoo_config("Qwen/Qwen2.5-7B-Instruct").save_pretrained(tmp_path)
    cfg = load_config(
        [f"actor_rollout_ref.model.path={tmp_path}", "actor_rollout_ref.model.lora_rank=64", "critic.model.lora_rank=8",
         "critic.model.target_modules=[q_proj,v_proj]", "algorithm.adv_estimator=gae"]
    )  # fmt: skip
    precision, moments = pick_precision("auto", torch.device("cpu")), {"actor": None, "critic": None}
    request = choices._plan_request(
        translate(cfg)[0], str(tmp_path), torch.device("cpu"), precision, (0, 0), moments
    )
    # all-linear at rank 64: 161,480,704 (as PEFT counts); the critic: q and v at rank 8 over 28 layers,
    # 8 * ((3584 + 3584) + (3584 + 512)) each, plus its 3,585-parameter value head
    assert request.trainees["actor"].lora == Lora(64, 161_480_704)
    assert request.trainees["critic"].lora == Lora(8, 28 * 8 * (7168 + 4096) + 3585)


def test_cpu_refusal_offers_lora_where_it_would_fit(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    from relm.config.loader import load_config
    from relm.errors import UserError
    from relm.memory import choices
    from relm.memory.plan import cpu_host_need
    from relm.models.precision import pick_precision
    from relm.models.zoo import zoo_config

    # Qwen2.5-0.5B's config alone (the plan reads shapes, never weights)
    zoo_config("Qwen/Qwen2.5-0.5B-Instruct").save_pretrained(tmp_path)
    cfg = load_config([f"actor_rollout_ref.model.path={tmp_path}", "algorithm.adv_estimator=grpo"])
    precision, moments = pick_precision("auto", torch.device("cpu")), {"actor": None, "critic": None}
    request = choices._plan_request(
        translate(cfg)[0], str(tmp_path), torch.device("cpu"), precision, (0, 0), moments
    )
    full, lora = cpu_host_need(request), cpu_host_need(choices._with_lora(request, 64))
    # frozen fp32 base, fp32 adapters: 4 bytes a parameter instead of 16, and no reference (4 more);
    # the logits of a micro-batch are the same on both sides
    assert full - lora > 10 * 494_000_000  # (LoRA keeps its layers' inputs: a little more activation)
    monkeypatch.setattr(choices, "host_room", lambda budget: (full + lora) // 2)
    with pytest.raises(UserError, match=r"LoRA would fit: actor_rollout_ref.model.lora_rank=64 needs ~\d"):
        choices.check_cpu_host_memory(translate(cfg)[0], str(tmp_path), precision, moments)
    monkeypatch.setattr(choices, "host_room", lambda budget: lora // 2)  # not even LoRA: no offer
    with pytest.raises(UserError) as refusal:
        choices.check_cpu_host_memory(translate(cfg)[0], str(tmp_path), precision, moments)
    assert "LoRA" not in str(refusal.value) and "does not fit this process's host memory" in str(
        refusal.value
    )
    monkeypatch.setattr(choices, "host_room", lambda budget: full)
    # it fits: the predicted peak is what the process holds (read again, so within a few MB) plus the need
    peak = choices.check_cpu_host_memory(translate(cfg)[0], str(tmp_path), precision, moments)
    assert peak is not None and abs(peak - (request.host_baseline_bytes + full)) < 50 * 10**6


def test_the_first_step_line_sets_each_prediction_beside_its_measurement():
    from relm.trainer.metrics import memory_report

    line = memory_report(
        {
            "perf/max_memory_allocated_gb": 60.0,
            "perf/plan_gpu_gb": 64.0,
            "perf/max_host_memory_gb": 22.0,
            "perf/plan_host_gb": 20.0,
        }
    )
    assert line == (
        "memory after the first step: GPU peak 60.00 GiB measured, 64.00 GiB planned (start-up or the actor's update) (-6%); "
        "host peak 22.00 GiB measured, 20.00 GiB planned (+10%)"
    )
    assert memory_report({"perf/max_host_memory_gb": 1.0}) is None


def test_outside_the_main_thread_the_watchdog_stays_off():
    import threading

    dog = HostWatchdog(lambda: "x", budget_bytes=1, poll_seconds=0.01)
    worker = threading.Thread(target=lambda: (dog.start(), dog.stop()))
    worker.start()
    worker.join()
    assert dog._thread is None and dog.reason is None
