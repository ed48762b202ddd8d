"""The GPU budget on a real GPU (the lead's check: `pytest -m gpu tests/integration/test_gpu_memory_budget.py`).

`trainer.max_gpu_memory_gb` makes one large GPU behave like a smaller card: torch's allocator refuses past
it, the plan plans for it, and the first step's metrics carry the plan's peaks beside the measured ones.
"""

from __future__ import annotations

import pytest
import torch

from relm.config.loader import load_config
from relm.config.translate import translate
from relm.memory.choices import cap_gpu_memory

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.integration,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def release_the_cap() -> None:
    """Back to the whole card for the tests after this one. torch refuses a device without an index here
    (`_get_device_index(torch.device("cuda"))` raises), as `cap_gpu_bytes` already knows: both tests ended
    in that line with `torch.device("cuda")` and failed on the H200 (2026-12-05). The current device's
    index stands for it."""
    torch.cuda.set_per_process_memory_fraction(1.0, torch.cuda.current_device())
    torch.cuda.empty_cache()


def test_the_allocator_is_held_to_the_budget():
    device = torch.device("cuda")
    cap_gpu_memory(translate(load_config(["trainer.max_gpu_memory_gb=24"]))[0].memory, device)
    try:
        kept = torch.empty(10 * 10**9, dtype=torch.uint8, device=device)  # 10 GB fits a 24 GB card
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(16 * 10**9, dtype=torch.uint8, device=device)  # 26 GB in all does not
        del kept
    finally:
        release_the_cap()


def test_a_run_at_a_24_gb_budget_records_planned_and_measured_peaks(train):
    result = train(
        "trainer.device=cuda", "trainer.max_gpu_memory_gb=24", "trainer.max_host_memory_gb=100", tiny=True
    )
    assert result.exit_code == 0, result.stderr
    first = result.metrics[0]
    for key in (
        "perf/plan_gpu_gb",
        "perf/max_memory_allocated_gb",
        "perf/plan_host_gb",
        "perf/max_host_memory_gb",
    ):
        assert key in first
    assert first["perf/max_memory_allocated_gb"] <= 24e9 / 2**30
    assert "memory after the first step: GPU peak" in result.stderr
    release_the_cap()
