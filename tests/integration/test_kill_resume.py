"""A run killed with SIGKILL at random points (one of them mid-save) and stopped once with SIGTERM, then
resumed each time, ends with the same metrics, step for step, as a run that was never interrupted."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from relm.trainer.loggers import read_metrics
from relm.trainer.main_ppo import main

pytestmark = pytest.mark.integration

TOTAL_STEPS = 16
"""Long enough that every interruption below lands before the end, however fast the machine."""
ARGS = [
    "data.train_batch_size=4",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "data.max_response_length=8",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "trainer.logger=[console]",  # its "step N:" lines tell the test how far a run got
    f"trainer.total_training_steps={TOTAL_STEPS}",
    "trainer.save_freq=2",
]
NOT_REPRODUCIBLE = ("timing_s/", "perf/")
"""Wall times and what is derived from them or from the process's memory differ run to run."""


def latest(run_dir: Path) -> int:
    path = run_dir / "latest_checkpointed_iteration.txt"
    return int(path.read_text()) if path.exists() else 0


def logged_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    return [r["step"] for r in read_metrics(path)] if path.exists() else []


def staging_folders(run_dir: Path) -> list[Path]:
    return list(run_dir.glob(".global_step_*.tmp"))


class Run:
    """`python -m relm.trainer.main_ppo` in a subprocess, its output in a log file."""

    def __init__(self, run_dir: Path, index: int, *extra: str, args: tuple[str, ...] = ()) -> None:
        self.log = run_dir.parent / f"run{index}.log"
        self.resumed_from = latest(run_dir)
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "relm.trainer.main_ppo",
                    *ARGS,
                    *args,
                    f"trainer.default_local_dir={run_dir}",
                    *extra,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "RELM_LOG_LEVEL": "INFO"},
            )

    def wait_until(self, condition: Callable[[], bool], timeout: float = 60.0) -> bool:
        """Poll every millisecond; False if the process ended (or time ran out) first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return True
            if self.proc.poll() is not None:
                return condition()
            time.sleep(0.001)
        return False

    def kill(self, sig: int = signal.SIGKILL) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=60)

    @property
    def output(self) -> str:
        return self.log.read_text()

    def check_resumed(self) -> None:
        """The run continued from the checkpoint the latest file named when it started (or from scratch)."""
        found = re.findall(r"resumed from \S*global_step_(\d+)", self.output)
        assert found == ([str(self.resumed_from)] if self.resumed_from else []), self.output


@pytest.mark.parametrize(
    "args",
    [(), ("actor_rollout_ref.model.lora_rank=8", "critic.model.lora_rank=4")],
    ids=["full", "lora"],
)
def test_killed_and_resumed_runs_match_an_uninterrupted_one(tmp_path: Path, args: tuple[str, ...]):
    rng = random.Random(0)
    reference_dir, run_dir = tmp_path / "reference", tmp_path / "run"
    assert main([*ARGS, *args, f"trainer.default_local_dir={reference_dir}"]) == 0

    # 1. SIGKILL at a random point after the first checkpoint: after a randomly chosen step, plus a
    # random fraction of a step (progress-based, so a fast machine cannot finish the run first).
    run = Run(run_dir, 1, args=args)
    kill_after = rng.randint(3, 5)
    assert run.wait_until(lambda: f"step {kill_after}:" in run.output), run.output
    time.sleep(rng.uniform(0.0, 0.05))
    assert run.kill() == -signal.SIGKILL

    # 2. SIGKILL while a checkpoint is being written: the half-written folder must not be used.
    run = Run(run_dir, 2, args=args)
    before = latest(run_dir)
    # After "resumed from", any staging folder is this run's (an older one is removed at start-up).
    assert run.wait_until(
        lambda: any(staging_folders(run_dir)) and "resumed from" in run.output and latest(run_dir) == before
    ), run.output
    assert run.kill() == -signal.SIGKILL
    run.check_resumed()
    mid_save = latest(run_dir)

    # 3. SIGTERM after a step: the run finishes the step in progress, saves it (though this run's
    # save_freq says never) and exits 0.
    run = Run(run_dir, 3, "trainer.save_freq=-1", args=args)
    assert run.wait_until(lambda: f"step {mid_save + 1}:" in run.output), run.output
    assert run.kill(signal.SIGTERM) == 0, run.output
    run.check_resumed()
    assert latest(run_dir) == max(logged_steps(run_dir)) > mid_save, run.output
    assert "received SIGTERM" in run.output and "stopped by SIGTERM" in run.output, run.output

    # 4. Resume to the end.
    run = Run(run_dir, 4, args=args)
    assert run.proc.wait(timeout=120) == 0, run.output
    run.check_resumed()
    assert not staging_folders(run_dir)

    reference = [json.loads(line) for line in (reference_dir / "metrics.jsonl").read_text().splitlines()]
    resumed = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in resumed] == list(range(1, TOTAL_STEPS + 1))
    for ref, got in zip(reference, resumed, strict=True):
        same = {k: v for k, v in ref.items() if not k.startswith(NOT_REPRODUCIBLE)}
        assert {k: got.get(k) for k in same} == same, f"step {ref['step']}"
