"""Issue 20's CPU test: with a small host budget the real entry point refuses a run before loading (exit 2,
one line), and a run that grows past its budget is ended by the watchdog with the phase named."""

from __future__ import annotations

import ctypes
import ctypes.util

import pytest

from relm.memory.host import process_rss_bytes

pytestmark = pytest.mark.integration

# A reward function that takes 800 MB of host memory on its first call and holds it: a real allocation in
# the middle of the rollout phase, as a leak or an oversized buffer would be.
GREEDY_REWARD = """
import time

import torch

HELD = []


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if not HELD:
        HELD.append(torch.ones(200 * 10**6))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            time.sleep(0.01)
    return 0.0
"""


def test_a_plan_over_the_host_budget_stops_before_loading(train):
    budget_gb = process_rss_bytes() / 2 / 1e9  # less than this process already holds: no plan fits
    result = train(f"trainer.max_host_memory_gb={budget_gb}")
    assert result.exit_code == 2
    error_lines = [line for line in result.stderr_lines if line.startswith("error:")]
    assert len(error_lines) == 1 and "Traceback" not in result.stderr
    assert error_lines[0].startswith("error: `zoo:tiny/qwen2` does not fit this process's host memory")
    assert "trainer.max_host_memory_gb=" in error_lines[0]
    # before loading: no model was loaded, no step ran
    assert "loading the critic" not in result.stderr and not (result.run_dir / "metrics.jsonl").exists()


def _give_back_free_heap() -> None:
    """Hand the heap's free pages back (glibc): an earlier CPU run in this test process keeps freed memory
    resident (`relm.memory.host_allocator`), and the run below would reuse it, including for the reward's
    800 MB, without the resident set growing past the budget (a CI worker: peak 4.58 GiB, no stop)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    if hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def test_the_watchdog_ends_a_run_that_grows_past_its_budget_with_the_phase_named(train, write_reward):
    _give_back_free_heap()
    budget_gb = (process_rss_bytes() + 400 * 10**6) / 1e9  # the plan (tens of MB) fits, 800 MB more does not
    reward = write_reward(GREEDY_REWARD)
    # In-process scoring (no reward workers), so the growth is this process's own.
    result = train(
        f"trainer.max_host_memory_gb={budget_gb}",
        f"custom_reward_function.path={reward}",
        "reward_model.num_workers=0",
    )
    assert result.exit_code == 2, result.stderr
    error_lines = [line for line in result.stderr_lines if line.startswith("error:")]
    assert len(error_lines) == 1 and "Traceback" not in result.stderr
    assert error_lines[0].startswith("error: host memory ran short: the process holds")
    assert (
        "over trainer.max_host_memory_gb=" in error_lines[0] and "during generate of step 1" in error_lines[0]
    )
