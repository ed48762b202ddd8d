"""A tool use learned from scratch: the lookup task (docs/multi_turn.md) through `relm train`.

The run is examples/lookup_task.yaml, the file a user runs, with only its paths and seed changed: GRPO
on `zoo:tiny/qwen2-lookup` (random weights), where each row's letter is random and only the `lookup`
tool knows it. A policy that never calls the tool scores 0, one that calls it and writes any letter
1/6; a rise of 0.3 and a last score well above 1/6 need the copy of the tool's answer.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from relm.rollout.multi_turn.lookup import write_lookup_task
from relm.trainer.main_ppo import main

pytestmark = pytest.mark.integration

CONFIG = Path(__file__).resolve().parents[2] / "examples" / "lookup_task.yaml"
REQUIRED_RISE = 0.3
"""Mean score of the last 5 steps minus that of the first 5 (which is about 0)."""
CHANCE = 1 / 6
"""What calling the tool and writing any of the six letters scores."""
SEED = 1
"""The example's seed, measured at 70 steps with one torch thread on a busy 2-core machine (SEEDS_MEASURED)."""
SEEDS_MEASURED = {
    # CPU inverse-CDF sampler, 2026-12-05, the example's 70 steps: seed 1 rose 0.62 (by tens of steps 0.0, 0.0,
    # 0.0, 0.16, 0.32, 0.42, 0.62); at 60 steps it stood at 0.33, below the bound's last >= 1/6 + 0.2, hence
    # the 70. Seeds 2 and 3 stood at 0.20 at 60 steps (issue 37's notes); neither they nor an AVX2 machine
    # (ATEN_CPU_CAPABILITY=avx2) were measured at 70.
    # Before (exponential race, 60 steps): rise at 50, 60, 70 steps; score by tens of steps to 70.
    1: ((0.72, 0.96, 0.99), (0.0, 0.01, 0.23, 0.57, 0.69, 0.87, 0.99)),
    2: ((0.58, 0.76, 0.62), (0.0, 0.0, 0.01, 0.26, 0.59, 0.74, 0.65)),
    3: ((0.47, 0.38, 0.57), (0.0, 0.0, 0.0, 0.05, 0.35, 0.47, 0.51)),
}
"""With either sampler the policy first learns to call the tool, then to copy its answer. Past the rise it is
nearly greedy (entropy ~0.02): a letter it maps to a wrong one gives its groups one score and GRPO no signal,
so the score swings between 0.3 and 0.9 from step to step."""


@pytest.fixture
def one_cpu_thread() -> Iterator[None]:
    """One intra-op thread, as the seed was measured with (the float summation order, hence the
    sampled trajectory, depends on the thread count)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


def test_the_policy_learns_to_call_the_tool_and_copy_its_answer(tmp_path: Path, one_cpu_thread: None) -> None:
    paths = write_lookup_task(tmp_path / "data")
    code = main(
        [
            "--config",
            str(CONFIG),
            f"data.train_files={paths['train']}",
            f"data.val_files={paths['val']}",
            f"actor_rollout_ref.rollout.multi_turn.tool_config_path={paths['tools']}",
            f"trainer.default_local_dir={tmp_path / 'run'}",
            f"trainer.rollout_data_dir={tmp_path / 'rollout'}",
            f"seed={SEED}",
            "trainer.logger=[jsonl]",
            "trainer.test_freq=-1",
            "trainer.val_before_train=false",
        ]
    )
    assert code == 0
    lines = (tmp_path / "run" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    records = sorted((json.loads(line) for line in lines if line.strip()), key=lambda r: r["step"])
    scores = [r["critic/score/mean"] for r in records]
    first, last = sum(scores[:5]) / 5, sum(scores[-5:]) / 5
    curve = [round(sum(scores[i : i + 10]) / len(scores[i : i + 10]), 2) for i in range(0, len(scores), 10)]
    assert last >= first + REQUIRED_RISE and last >= CHANCE + 0.2, (first, last, curve)
    assert records[-1]["multi_turn/tool_calls/mean"] > 0.9
    assert records[-1]["num_turns/mean"] > 3.5  # prompt, call, tool result, answer
    # The dumps hold whole conversations: the call, the tool's letter and the answer.
    dumped = [
        json.loads(line) for line in (tmp_path / "rollout" / f"{len(records)}.jsonl").read_text().splitlines()
    ]
    right = [row for row in dumped if row["score"] == 1.0]
    assert right and all(
        row["output"].endswith(f"tool\n{row['gts']}assistant\n{row['gts']}") for row in right
    )
