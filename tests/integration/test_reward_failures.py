"""Real runs with reward code that hangs, raises, returns NaN, leaks memory or kills its worker.

Each run trains two steps of ten responses (rows 0-9, then 10-19, unshuffled, one response a prompt), so a
reward that misbehaves on row index 3 fails exactly one response a step and the counters can be checked
exactly. Time limits are short: the whole file runs in well under a minute of training.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

STEPS_OF_TEN = (
    "data.train_batch_size=10",
    "actor_rollout_ref.rollout.n=1",
    "actor_rollout_ref.actor.ppo_mini_batch_size=5",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=5",
    "data.shuffle=false",
    "data.max_prompt_length=24",
    "reward_model.num_workers=2",
    "reward_model.timeout=1",
)

# Row index (extra_info.index) -> what the reward does; the rest score 1.
MISBEHAVING = """
    import os
    import signal
    import time

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        index = extra_info["index"] % 10
        if index == 1:
            os.kill(os.getpid(), signal.SIGKILL)  # the worker dies mid-call, as under the OOM killer
        if index == 3:
            raise ValueError(f"cannot score row {extra_info['index']}")
        if index == 5:
            return float("nan")
        if index == 7:
            time.sleep(10_000)
        return 1.0
"""

LEAKING = """
    LEAK = []

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        block = bytearray(40 * 2**20)
        block[::4096] = b"x" * len(block[::4096])  # touched, so resident
        LEAK.append(block)
        return 1.0
"""


def _data(write_parquet, verl_rows) -> str:
    return f"data.train_files={write_parquet(verl_rows(20))}"


def _metric(result, name: str) -> list[float]:
    return [record[name] for record in result.metrics]


def test_hanging_raising_nan_and_killed_rewards_are_counted_and_the_run_finishes(
    train, write_parquet, write_reward, verl_rows
):
    reward = write_reward(MISBEHAVING)
    result = train(
        *STEPS_OF_TEN, _data(write_parquet, verl_rows), f"custom_reward_function.path={reward}",
        "reward_model.max_failure_share=0.5", "reward_model.failure_score=-0.5",
    )  # fmt: skip

    assert result.exit_code == 0, result.stderr
    assert _metric(result, "reward/timeouts") == [1.0, 1.0]
    assert _metric(result, "reward/errors") == [2.0, 2.0]  # the one that raised and the killed worker
    assert _metric(result, "reward/non_finite") == [1.0, 1.0]
    # Six rows score 1, four the failure score.
    assert _metric(result, "critic/score/mean") == pytest.approx([0.4, 0.4])
    # The first of each kind is in the run log, once, with its row.
    for kind, says in [
        ("timeout", "took more than 1 s on a response (data_source 'relm/letters') whose prompt row has "),
        ("error", "extra_info index 1"),
        ("non_finite", "returned float nan (not a finite number)"),
    ]:
        lines = [line for line in result.stderr_lines if f"first {kind}:" in line]
        assert len(lines) == 1 and says in lines[0], result.stderr
    assert "cannot score row 3" not in result.stderr  # the error logged first is the killed worker (row 1)
    assert not multiprocessing.active_children()  # the pool ended with the run


def test_a_leaking_reward_is_recycled_and_the_run_finishes(train, write_parquet, write_reward, verl_rows):
    reward = write_reward(LEAKING)
    result = train(
        *STEPS_OF_TEN, _data(write_parquet, verl_rows), f"custom_reward_function.path={reward}",
        "reward_model.memory_limit_mb=300", "reward_model.max_failure_share=0.5",
    )  # fmt: skip

    assert result.exit_code == 0, result.stderr
    errors = _metric(result, "reward/errors")
    # 40 MB a call against 300 MB: each worker is replaced every few calls, costing the call it is on.
    assert sum(errors) >= 1 and max(errors) <= 5
    assert "over reward_model.memory_limit_mb=300" in result.stderr
    assert _metric(result, "reward/timeouts") == [0.0, 0.0]


def test_failures_past_the_share_end_the_run_with_one_line(train, write_parquet, write_reward, verl_rows):
    body = """
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            if extra_info["index"] % 3 == 0:
                raise KeyError("answer")
            return 1.0
    """
    reward = write_reward(body)
    result = train(*STEPS_OF_TEN, _data(write_parquet, verl_rows), f"custom_reward_function.path={reward}")

    assert result.exit_code == 2, result.stderr
    *before, line = result.stderr_lines
    assert not [other for other in before if not other.startswith("relm INFO: ")], result.stderr
    assert line.startswith(
        f"error: reward function compute_score from '{reward}' failed on 4 of 10 responses, more than "
        "reward_model.max_failure_share=0.25; e.g. it raised KeyError: 'answer' on response 0 "
        "(data_source 'relm/letters') whose prompt row has ground_truth 'a' and extra_info index 0"
    ), line


def test_batched_compute_score_through_the_config(train, write_parquet, write_reward, verl_rows):
    body = """
        def compute_score(data_sources, solution_strs, ground_truths, extra_infos):
            return [{"score": float(g in s), "calls_of": float(len(s))} for s, g in zip(solution_strs, ground_truths)]
    """
    reward = write_reward(body)
    result = train(
        *STEPS_OF_TEN, _data(write_parquet, verl_rows), f"custom_reward_function.path={reward}",
        "reward_model.reward_manager=batch",
    )  # fmt: skip

    assert result.exit_code == 0, result.stderr
    assert all(0.0 <= score <= 1.0 for score in _metric(result, "critic/score/mean"))
    assert len(_metric(result, "reward_extra/calls_of/mean")) == 2
    assert _metric(result, "reward/errors") == [0.0, 0.0]


def test_sigterm_stops_the_run_and_its_reward_workers(tmp_path: Path, write_parquet, write_reward, verl_rows):
    pids = tmp_path / "pids"
    pids.mkdir()
    # Each worker leaves its pid behind when it loads the file, so the test can see them end.
    reward = write_reward(
        f"""
        import os
        import pathlib

        pathlib.Path({str(pids)!r}, str(os.getpid())).touch()

        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            return 1.0
        """
    )
    run_dir = tmp_path / "run"
    command = [
        sys.executable, "-m", "relm.trainer.main_ppo", *STEPS_OF_TEN, _data(write_parquet, verl_rows),
        "actor_rollout_ref.model.path=zoo:tiny/qwen2",
        f"custom_reward_function.path={reward}", "trainer.total_training_steps=1000",
        "data.max_response_length=8",
        "trainer.test_freq=-1", "trainer.val_before_train=false", f"trainer.default_local_dir={run_dir}",
    ]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    metrics = run_dir / "metrics.jsonl"
    # After the first step is logged, the trainer's handler is in place and the workers are busy.
    while (
        time.monotonic() < deadline and proc.poll() is None and not (metrics.exists() and metrics.read_text())
    ):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)

    assert proc.returncode == 0, output
    # The trainer loads the file too (to check it before anything else): every other pid is a worker's.
    workers = [int(p.name) for p in pids.iterdir() if int(p.name) != proc.pid]
    assert len(workers) == 2, output
    time.sleep(0.5)
    for pid in workers:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # gone, not orphaned
