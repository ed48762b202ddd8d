#!/usr/bin/env python
"""Time one decode step's sampling: 32 rows over Qwen2.5's 151,665 tokens (temperature 1, no top-k/top-p),
sliced from 151,936-wide logits as the engines slice them (vocab_limit). Wall and CPU time, 30 steps."""

import statistics
import time

import torch

from relm.rollout.base import SamplingParams
from relm.rollout.sampling import sample_next_token

torch.manual_seed(0)
logits = torch.randn(32, 151936) * 2
view = logits[:, :151665]
params, generator = SamplingParams(temperature=1.0), torch.Generator().manual_seed(0)
wall, cpu = [], []
for _ in range(35):
    w, c = time.perf_counter(), time.process_time()
    sample_next_token(view, params, generator)
    wall.append(time.perf_counter() - w)
    cpu.append(time.process_time() - c)
wall, cpu = wall[5:], cpu[5:]
print(
    f"sampling 32 x 151665, {torch.get_num_threads()} threads: wall median {statistics.median(wall) * 1e3:.1f} ms "
    f"(min {min(wall) * 1e3:.1f}), CPU time median {statistics.median(cpu) * 1e3:.1f} ms"
)
