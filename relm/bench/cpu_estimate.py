"""How long a rollout benchmark would take on this CPU, said before any weight is built.

A GPU-sized shape (the README's Qwen2.5-1.5B at batch 256, 256 + 256 tokens) builds 1.5B random
weights and then decodes for hours on a 2-core CPU, printing nothing all that time. The estimate
here reads only the config: the matrix products' floating-point work (2 x parameters per token,
prompt and response) over this CPU's measured matmul rate, plus each decode step's read of the
weights over the measured copy bandwidth. It errs low (attention, sampling and Python are left
out), so a run it calls too long is longer still.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

CPU_LIMIT_S = 600.0
"""Estimated seconds over which `relm bench rollout` on a CPU refuses instead of running."""


@dataclass(frozen=True)
class CpuEstimate:
    """The figures of one estimate."""

    num_params: int
    flops: float
    """Matrix-product work of the whole run (prefill and decode)."""
    flops_per_s: float
    """This CPU's measured rate for an fp32 matrix product, all torch threads."""
    weight_bytes: int
    copy_bytes_per_s: float
    response_len: int

    @property
    def seconds(self) -> float:
        compute = self.flops / self.flops_per_s
        reads = self.response_len * self.weight_bytes / self.copy_bytes_per_s
        return compute + reads

    def describe(self) -> str:
        return (
            f"plan: {self.num_params / 1e9:.2f}B parameters ({self.weight_bytes / 1e9:.1f} GB of weights), "
            f"{self.flops / 1e12:.1f} TFLOP of matrix products; this CPU: {self.flops_per_s / 1e9:.0f} GFLOP/s, "
            f"{self.copy_bytes_per_s / 1e9:.1f} GB/s: estimate ~{duration(self.seconds)}"
        )


def rollout_flops(num_params: int, batch: int, prompt_len: int, response_len: int) -> float:
    """Matrix-product FLOPs of generating `response_len` tokens for `batch` prompts (2 x params per token)."""
    return 2.0 * num_params * batch * (prompt_len + response_len)


def measure_matmul_flops(size: int = 512, repeats: int = 8) -> float:
    """FLOP/s of a [size, size] fp32 matrix product on the CPU (a few tens of milliseconds)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b  # warm-up: thread pool start
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return repeats * 2 * size**3 / (time.perf_counter() - start)


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
