"""A tool use learned from scratch: the lookup task (docs/multi_turn.md) through `relm train`.

The run is examples/lookup_task.yaml, the file a user runs, with only its paths and seed changed: GRPO
on `zoo:tiny/qwen2-lookup` (random weights), where each row's letter is random and only the `lookup`
tool knows it. A policy that never calls the tool scores 0, one that calls it and writes any letter
1/6, one that copies the tool's answer 1.

What is asserted is what held in every run measured: the policy takes the tool up (from about 10% of
conversations to all of them) and copies its answer, so the score rises from 0 to well above the 1/6 of a
policy that calls the tool and writes any letter (SEEDS_MEASURED).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from relm.rollout.multi_turn.lookup import write_lookup_task
from relm.trainer.main_ppo import main

pytestmark = pytest.mark.integration

CONFIG = Path(__file__).resolve().parents[2] / "examples" / "lookup_task.yaml"
TOOL_UPTAKE = (0.3, 0.95)
"""The share of conversations that call the tool: at most the first of these over the first 5 steps (a random
policy writes the call token ~10% of the time), at least the second over the last 5 (every measured run: 0.99-1.0)."""
COPIED = 0.5
"""Mean score of the last 5 steps, at least: the tool's letter copied (the first 5 steps score ~0; the measured
runs ended at 0.79 to 0.99, and a policy that calls the tool and writes any letter scores 1/6)."""
SEED = 1
"""The example's seed (SEEDS_MEASURED)."""
SEEDS_MEASURED = {
    # The example as it is (16 prompts x 32 conversations, 100 steps), one torch thread, 2026-12-06 on an Intel
    # Xeon VM (AVX-512) shared with other runs: the mean score of the first and the last 5 steps, and by tens
    # of steps. Every run called the tool in ~10% of conversations over the first 5 steps and in all of them
    # over the last 5.
    1: ((0.0, 0.875), (0.0, 0.05, 0.34, 0.32, 0.36, 0.37, 0.41, 0.53, 0.62, 0.77)),
    2: ((0.0, 0.786), (0.0, 0.01, 0.18, 0.68, 0.6, 0.77, 0.76, 0.85, 0.84, 0.77)),
    3: ((0.0, 0.986), (0.0, 0.0, 0.02, 0.28, 0.51, 0.63, 0.78, 0.83, 0.9, 0.99)),
    4: ((0.0, 0.837), (0.0, 0.12, 0.65, 0.8, 0.81, 0.75, 0.82, 0.82, 0.65, 0.83)),
    5: ((0.002, 0.812), (0.02, 0.22, 0.33, 0.63, 0.84, 0.85, 0.73, 0.88, 0.73, 0.82)),
    42: ((0.0, 0.88), (0.0, 0.0, 0.13, 0.65, 0.81, 0.86, 0.85, 0.82, 0.77, 0.85)),
}
"""The policy first learns to call the tool, then to copy its answer. Each group's rows share one letter, so a
near-greedy policy that maps a letter to a wrong one gives its group one score and GRPO no signal; with 16
conversations a prompt (the example until 2026-12-06) the copy came on an AMD EPYC VM (seed 1: 0.62 at 70
steps) and not on this Intel one (seeds 1, 2, 3: 0.19, 0.11, 0.30 at 70 steps; 0.19, 0.20, 0.13 at 150), nor
with a rollout temperature of 1.3 (seeds 1, 2, 3: 0.41, 0.13, 0.0 at 150 steps) or that and 32 conversations
(0.47, 0.45 at 100 steps)."""


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
    calls = [r["multi_turn/tool_calls/mean"] for r in records]
    took_up = (sum(calls[:5]) / 5, sum(calls[-5:]) / 5)
    assert took_up[0] <= TOOL_UPTAKE[0] and took_up[1] >= TOOL_UPTAKE[1], (took_up, curve)
    assert first < 0.02 and last >= COPIED, (first, last, curve)
    assert records[-1]["num_turns/mean"] > 3.5  # prompt, call, tool result, answer
    # The dumps hold whole conversations: the call, the tool's letter and the answer.
    dumped = [
        json.loads(line) for line in (tmp_path / "rollout" / f"{len(records)}.jsonl").read_text().splitlines()
    ]
    right = [row for row in dumped if row["score"] == 1.0]
    assert right and all(
        row["output"].endswith(f"tool\n{row['gts']}assistant\n{row['gts']}") for row in right
    )
