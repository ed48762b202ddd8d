"""Asynchronous training (docs/async.md) end to end: a trainer process and a rollout process it spawns, with a
gloo group between them for the weights and a bounded buffer for the finished batches.

- Bound 0 (`async_training.staleness_threshold=0`): every step is generated from the same prompts, seeds and
  weights as in a synchronous run, so every metric but wall times and memory equals the synchronous run's.
- Stale batches carry the logprobs the engine sampled them with, and the rollout correction measures the gap
  to the trained weights from them.
- Bounds 1 and 2: the demo still learns (the rise of tests/integration/test_learning.py), no trained batch is
  staler than the bound, and the rollout process does run ahead (some batch is exactly at the bound); so
  does bound 1 with partial rollouts.
- Partial rollouts: where generation outlasts the update, responses take up the weights that arrive
  mid-step, and their staleness (their oldest token's) stays within the bound.
- SIGKILL of the trainer mid-run, then SIGTERM: the rollout process ends by itself (SIGKILL) or with the run
  (SIGTERM), and the resumed run (whose buffer is regenerated from the checkpoint) ends with the synchronous
  run's metrics, no trained step lost.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from relm.trainer.main_ppo import main
from tests.integration.test_learning import CHEAPER_DEMO, REQUIRED_RISE, scores_per_step

pytestmark = pytest.mark.integration

NOT_REPRODUCIBLE = ("timing_s/", "perf/", "fully_async/")
"""Wall times and memory differ run to run; `fully_async/` is what only an asynchronous run reports."""

QUIET = ["trainer.logger=[jsonl]", "trainer.test_freq=-1", "trainer.val_before_train=false"]


def _metrics(run_dir: Path) -> list[dict[str, float]]:
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _same_as_sync(sync: list[dict[str, float]], other: list[dict[str, float]]) -> None:
    assert [r["step"] for r in other] == [r["step"] for r in sync]
    for ref, got in zip(sync, other, strict=True):
        reproducible = {k: v for k, v in ref.items() if not k.startswith(NOT_REPRODUCIBLE)}
        assert len(reproducible) > 30
        assert {k: got.get(k) for k in reproducible} == reproducible, f"step {ref['step']}"


@pytest.fixture
def one_thread_everywhere(one_cpu_thread: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """One torch thread here and in the rollout process (which takes the trainer's count), and none of
    relm's own thread adjustment between steps (`OMP_NUM_THREADS` set is left alone)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def test_bound_0_gives_the_synchronous_runs_metrics(tmp_path: Path, one_thread_everywhere: None):
    common = ["trainer.total_training_steps=4", "seed=3", *QUIET, *CHEAPER_DEMO]  # gae: critic, values too
    assert main([*common, f"trainer.default_local_dir={tmp_path / 'sync'}"]) == 0
    assert (
        main(
            [
                *common,
                f"trainer.default_local_dir={tmp_path / 'async'}",
                "async_training.enable=true",
                "async_training.staleness_threshold=0",
            ]
        )
        == 0
    )

    sync, asynchronous = _metrics(tmp_path / "sync"), _metrics(tmp_path / "async")
    _same_as_sync(sync, asynchronous)
    for record in asynchronous:
        assert record["fully_async/staleness/max"] == 0.0
        assert record["fully_async/count/current_param_version"] == record["step"] - 1
        assert record["fully_async/buffer_depth"] == 1.0
        assert record["fully_async/trainer_wait_s"] >= 0.0 and record["fully_async/rollouter_wait_s"] >= 0.0


LEARNING_SEEDS = {(1, False): 1, (2, False): 1, (1, True): 2}
"""Per (bound, partial rollouts), the seed the test runs (grpo, the CHEAPER_DEMO overrides, 50 steps, one
thread). Measured rises 2026-12-06 on the 2-core AMD EPYC VM beside other work: bound 1, seeds 1-5: 0.811,
0.938, 0.825, 0.793, 0.805 (every step but the first one version stale); bound 2, seeds 1-3: 0.965, 0.956, 0.768;
bound 1 with partial rollouts, seeds 1-3: 0.957, 0.979, 0.916 (51-73 s a run; the demo's update outlasts its
generation, so weights arrived mid-step at 2, 0 and 0 of the 50 steps). The synchronous run's rises at seeds
1-3 are 0.981, 0.985, 0.947 (tests/integration/test_learning.py)."""


@pytest.mark.parametrize(("bound", "partial"), list(LEARNING_SEEDS), ids=["1", "2", "1-partial"])
def test_the_demo_learns_within_the_staleness_bound(
    bound: int, partial: bool, tmp_path: Path, one_thread_everywhere: None
):
    code = main(
        [
            "trainer.total_training_steps=50",
            f"trainer.default_local_dir={tmp_path}",
            *QUIET,
            *CHEAPER_DEMO,
            "algorithm.adv_estimator=grpo",
            f"seed={LEARNING_SEEDS[bound, partial]}",
            "async_training.enable=true",
            f"async_training.staleness_threshold={bound}",
            f"async_training.partial_rollout={str(partial).lower()}",
        ]
    )

    assert code == 0
    records = _metrics(tmp_path)
    staleness = [r["fully_async/staleness/max"] for r in records]
    assert max(staleness) == bound, staleness  # within the bound, and the rollout side did run ahead
    assert all(r["fully_async/buffer_depth"] <= bound + 1 for r in records)
    scores = scores_per_step(tmp_path)
    first, last = sum(scores[:5]) / 5, sum(scores[-5:]) / 5
    assert last >= first + REQUIRED_RISE, (first, last, staleness)
    assert all(("fully_async/partial/partial_ratio" in r) == partial for r in records)


PARTIAL_ARGS = [
    # Long responses and one cheap update a step: generation outlasts the update, so the weights the trainer
    # sends after step s arrive while the rollout process is generating step s + 1.
    "data.train_batch_size=4",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_epochs=1",
    "data.max_response_length=48",
    "algorithm.adv_estimator=grpo",
    "trainer.total_training_steps=6",
]


def test_partial_rollouts_take_up_weights_mid_step_within_the_staleness_bound(
    tmp_path: Path, one_thread_everywhere: None
):
    # Measured (seed 1, 13 s): responses spanning two versions were 0.75, 1.0, 0.75, 0.625, 0.75 of steps 2-6.
    code = main(
        [
            *PARTIAL_ARGS,
            f"trainer.default_local_dir={tmp_path}",
            *QUIET,
            "seed=1",
            "async_training.enable=true",
            "async_training.staleness_threshold=1",
            "async_training.partial_rollout=true",
        ]
    )

    assert code == 0
    records = _metrics(tmp_path)
    # Step 1 is generated under the starting weights, before any other exists.
    assert records[0]["fully_async/partial/total_partial_num"] == 0.0
    assert any(r["fully_async/partial/total_partial_num"] > 0 for r in records), records
    for record in records:
        # Staleness counts a response's oldest token: within the bound even when its later tokens are newer.
        assert record["fully_async/staleness/max"] <= 1.0, record
        # At bound 1 step s starts under version s - 2 or newer, and version s is sent only after step s.
        assert record["fully_async/partial/max_partial_span"] <= 1.0, record


def test_the_rollout_correction_reads_the_logprobs_the_stale_weights_sampled_with(
    tmp_path: Path, one_thread_everywhere: None
):
    # Measured (seed 1): k3_kl 0.0 at step 1 (the same weights on both sides), 0.020, 0.017, 0.009 at the
    # one-version-stale steps 2-4; at bound 0 it is 0.0 at every step.
    code = main(
        [
            "trainer.total_training_steps=4",
            f"trainer.default_local_dir={tmp_path}",
            *QUIET,
            *CHEAPER_DEMO,
            "algorithm.adv_estimator=grpo",
            "seed=1",
            "async_training.enable=true",
            "async_training.staleness_threshold=1",
            "algorithm.rollout_correction.rollout_is=token",
        ]
    )

    assert code == 0
    records = _metrics(tmp_path)
    assert records[0]["fully_async/staleness/max"] == 0.0  # nothing is older than the starting weights
    assert any(r["fully_async/staleness/max"] == 1.0 for r in records), records
    for record in records:
        if record["fully_async/staleness/max"] == 0.0:
            assert record["rollout_corr/k3_kl"] < 1e-6, record
        else:
            assert record["rollout_corr/k3_kl"] > 1e-3, record
            assert record["rollout_corr/rollout_is_mean"] != 1.0, record


REPO = Path(__file__).resolve().parents[2]
KILL_ARGS = [
    "data.train_batch_size=4",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "data.max_response_length=8",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "trainer.total_training_steps=10",
    "trainer.save_freq=2",
]


def _pid_running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _interrupt(command: list[str], env: dict[str, str], log: Path, after: str, sig: int) -> tuple[int, str]:
    """Run `command` until its output shows `after`, send `sig`; its exit code, output and rollout process."""
    with log.open("w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    deadline = time.monotonic() + 180
    while after not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(sig)
    code = proc.wait(timeout=60)
    output = log.read_text()
    found = re.search(r"rollout process (\d+) generates", output)
    assert found, output
    rollout_pid = int(found.group(1))
    deadline = time.monotonic() + 20
    while _pid_running(rollout_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _pid_running(rollout_pid), f"the rollout process outlived its trainer ({sig!r})\n{output}"
    return code, output


def test_a_stopped_or_killed_trainer_leaves_no_rollout_process_and_resumes_without_loss(
    tmp_path: Path, one_thread_everywhere: None
):
    sync_dir, run_dir = tmp_path / "sync", tmp_path / "async"
    assert main([*KILL_ARGS, "trainer.logger=[jsonl]", f"trainer.default_local_dir={sync_dir}"]) == 0
    command = [
        sys.executable, "-m", "relm.trainer.main_ppo", *KILL_ARGS, "trainer.logger=[console]",
        f"trainer.default_local_dir={run_dir}", "async_training.enable=true", "async_training.staleness_threshold=0",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "RELM_LOG_LEVEL": "INFO"}

    code, output = _interrupt(command, env, tmp_path / "killed.log", "step 5:", signal.SIGKILL)
    assert code == -signal.SIGKILL, output

    # SIGTERM: the step in progress ends and is saved, the rollout process is ended with the run.
    code, output = _interrupt(command, env, tmp_path / "stopped.log", "step 7:", signal.SIGTERM)
    assert code == 0 and "stopped by SIGTERM" in output, output
    assert re.search(r"resumed from \S*global_step_[2468]\b", output), output
    assert "regenerated from this checkpoint" in output, output

    resumed = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    _same_as_sync(_metrics(sync_dir), _metrics(run_dir))
