"""Real runs: processes a reward starts end with the run, and a reward that signals the trainer ends it.

The first test is the user's `relm train ... | tee log`: the reward starts a `sleep 600` that inherits
the trainer's stdout, and the reader of the pipe must see its end within seconds of the run's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from relm.processes import read_process

pytestmark = pytest.mark.integration

ONE_STEP = (
    "actor_rollout_ref.model.path=zoo:tiny/qwen2",
    "data.train_batch_size=4",
    "actor_rollout_ref.rollout.n=1",
    "data.max_response_length=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "trainer.total_training_steps=1",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "reward_model.num_workers=2",
)


def test_a_piped_run_ends_when_the_run_does_and_leaves_no_child(
    tmp_path: Path, write_parquet, write_reward, verl_rows
):
    pids = tmp_path / "pids"
    pids.mkdir()
    reward = write_reward(
        f"""
        import os
        import subprocess

        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            child = subprocess.Popen(["sleep", "600"])  # inherits stdout: the pipe stays open while it lives
            open(os.path.join({str(pids)!r}, str(child.pid)), "w").close()
            return 1.0
        """
    )
    command = [
        sys.executable, "-m", "relm.trainer.main_ppo", *ONE_STEP,
        f"data.train_files={write_parquet(verl_rows(8))}", f"custom_reward_function.path={reward}",
        f"trainer.default_local_dir={tmp_path / 'run'}",
    ]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    output: list[bytes] = []
    reader = threading.Thread(target=lambda: output.append(proc.stdout.read()))  # type: ignore[union-attr]
    reader.start()
    try:
        code = proc.wait(timeout=240)
        reader.join(timeout=5)  # `tee` sees the end of its input within seconds of the run's end
        assert not reader.is_alive(), "the pipe stayed open after the run ended"
        assert code == 0, output
        started = [int(entry.name) for entry in pids.iterdir()]
        assert len(started) == 4
        assert not [pid for pid in started if _alive(pid)]
    finally:
        for entry in pids.iterdir():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)
        reader.join(timeout=5)


def _alive(pid: int) -> bool:
    row = read_process(pid)
    return row is not None and row.state != "Z"


def test_a_reward_that_signals_the_trainer_ends_the_run_with_one_line(
    train, write_parquet, write_reward, verl_rows
):
    reward = write_reward(
        """
        import os
        import signal

        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            os.kill(os.getppid(), signal.SIGINT)
            return 1.0
        """
    )
    started = time.monotonic()
    result = train(
        *ONE_STEP, f"data.train_files={write_parquet(verl_rows(8))}", f"custom_reward_function.path={reward}",
        tiny=False,
    )  # fmt: skip

    assert result.exit_code == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: reward function compute_score from '{reward}' sent SIGINT to the trainer (pid {os.getpid()}) "
        f"through os.kill({os.getpid()}, ...); a reward must not signal relm's processes: remove that call "
        "from the reward"
    ], result.stderr
    assert "received SIGINT" not in result.stderr
    assert time.monotonic() - started < 120
