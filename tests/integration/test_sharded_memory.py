"""Sharded construction holds per rank what its shards need, not the whole model (issue 31).

A 254M-parameter Qwen2 (1.02 GB of fp32 weights; weights and AdamW moments 3.05 GB), written by the test
as safetensors, takes one GRPO step in one process and in 4 gloo processes (tests/sharded_memory.py). Each
rank builds the actor on the meta device and reads only its own shards, and fills its whole generation
copy one gathered parameter at a time. The arithmetic (relm/memory/sharded_plan.py): per rank
16 P / 4 (fp32 weights, gradients, moments) + 4 P (the whole fp32 generation copy a CPU rank keeps: the
engine holds the whole model) = 8 P, against 16 P in one process (which generates on the actor itself):
0.5 of the models' bytes, plus each process's ~0.6 GiB of Python, torch, the data and the step's
transients. Measured (2 cores, torch 2.13, 3.5 minutes): one process 4.52 GiB peak, each rank
2.52-2.53 GiB (0.56), under the 2.84 GiB of weights and moments. The reference built from shards is
checked by the parity run (tests/integration/test_distributed.py: GRPO with a KL-loss reference); with it
here the ratio was 0.51 (5.46 against 2.77 GiB) but the ranks' peaks came within 3% of the weights and
moments.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
RANKS = 4
BOUND = 0.6
"""Each rank's peak against one process's, as issue 31 asks."""


def run(command: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("RELM_DEBUG", None)
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=540)


def test_four_ranks_each_peak_under_0_6_of_one_process_holding_the_whole_model(tmp_path: Path):
    folder, one, four = tmp_path / "model", tmp_path / "one", tmp_path / "four"
    script = str(REPO / "tests" / "sharded_memory.py")
    done = run([sys.executable, script, "write", str(folder)])
    assert done.returncode == 0, done.stderr[-3000:]
    done = run([sys.executable, script, "run", str(folder), str(one)])
    assert done.returncode == 0, done.stderr[-3000:]
    single = json.loads((one / "rank0.json").read_text())
    # Each process may hold 0.6 of one process's peak (`trainer.max_host_memory_gb`): the start-up check
    # holds the rank's planned models to it, and on CPU it is what keeps a sharded model's weights from
    # staying gathered (relm/distributed/gathering.py).
    budget_gb = BOUND * single["peak_bytes"] / 1e9
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={RANKS}"]
    done = run(
        [*torchrun, script, "run", str(folder), str(four), f"--set=trainer.max_host_memory_gb={budget_gb}"]
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "each rank reads only its own shards" in done.stderr, done.stderr[-3000:]
    ranks = [json.loads((four / f"rank{r}.json").read_text()) for r in range(RANKS)]
    num_params = single["num_params"]
    assert num_params > 250e6 and all(r["num_params"] == num_params for r in ranks)
    weights_and_moments = 12 * num_params  # fp32 weights and AdamW's two moments
    peaks = [r["peak_bytes"] for r in ranks]
    print(f"one process {single['peak_bytes'] / 2**30:.2f} GiB; ranks", [f"{p / 2**30:.2f}" for p in peaks])
    assert max(peaks) < weights_and_moments  # no rank could hold the model's weights and moments
    assert max(peaks) <= BOUND * single["peak_bytes"], (peaks, single["peak_bytes"])
    # The same loss on every rank (summed over ranks, as the metrics are) and a real step.
    assert len({r["pg_loss"] for r in ranks}) == 1
