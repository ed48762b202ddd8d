"""Resume is exact on CPU: stop after step k, resume, and steps k+1.. equal the uninterrupted run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from relm.trainer.main_ppo import main

pytestmark = pytest.mark.integration

SMALL = [
    "data.train_batch_size=8",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.actor.shuffle=true",
    "data.max_response_length=8",
    "trainer.logger=[]",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
]


def steps(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_stopped_and_resumed_run_matches_the_uninterrupted_one(tmp_path: Path):
    whole, split = tmp_path / "whole", tmp_path / "split"
    assert main([*SMALL, "trainer.total_training_steps=4", f"trainer.default_local_dir={whole}"]) == 0
    first = [*SMALL, "trainer.save_freq=2", f"trainer.default_local_dir={split}"]
    assert main([*first, "trainer.total_training_steps=2"]) == 0
    assert (split / "latest_checkpointed_iteration.txt").read_text() == "2"
    assert main([*first, "trainer.total_training_steps=4"]) == 0

    a, b = steps(whole), steps(split)
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    for key in ("critic/score/mean", "actor/pg_loss", "critic/vf_loss", "actor/grad_norm", "actor/ppo_kl"):
        assert [r[key] for r in a] == [r[key] for r in b], key


def test_resume_disable_starts_fresh_and_keeps_the_old_record(tmp_path: Path):
    run = [*SMALL, "trainer.save_freq=1", f"trainer.default_local_dir={tmp_path}"]
    assert main([*run, "trainer.total_training_steps=1"]) == 0
    assert main([*run, "trainer.total_training_steps=1", "trainer.resume_mode=disable"]) == 0
    assert [r["step"] for r in steps(tmp_path)] == [1]
    assert len(list(tmp_path.glob("metrics.*.jsonl"))) == 1  # the first run's record, renamed, not lost


def test_a_half_written_checkpoint_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    (tmp_path / "global_step_3").mkdir(parents=True)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("3")
    code = main([*SMALL, "trainer.total_training_steps=4", f"trainer.default_local_dir={tmp_path}"])
    assert code == 2
    # Progress lines ("relm INFO: loading ...") may come first; the failure itself is one line.
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("relm INFO:")]
    assert len(err) == 1 and err[0].startswith("error:") and "global_step_3" in err[0]


def error_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if not line.startswith("relm INFO:")]


def test_resuming_under_settings_that_change_the_math_stops_with_the_differences(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    run = [*SMALL, "trainer.save_freq=1", f"trainer.default_local_dir={tmp_path}"]
    assert main([*run, "trainer.total_training_steps=1", "algorithm.adv_estimator=grpo"]) == 0
    saved = (tmp_path / "config.yaml").read_text()
    assert "adv_estimator: grpo" in saved and "ppo_mini_batch_size: 4" in saved
    capsys.readouterr()

    changed = [*run, "trainer.total_training_steps=2", "algorithm.adv_estimator=rloo"]
    assert main([*changed, "actor_rollout_ref.actor.optim.lr=2e-6"]) == 2
    err = error_lines(capsys)
    assert len(err) == 1 and err[0].startswith("error: trainer.default_local_dir")
    assert "algorithm.adv_estimator: 'grpo' -> 'rloo'" in err[0]
    assert "actor_rollout_ref.actor.optim.lr" in err[0]
    assert [r["step"] for r in steps(tmp_path)] == [1]  # nothing trained, nothing lost

    # Naming the checkpoint is continuing on purpose; more steps and other micro-batches are not a change.
    forced = [
        *changed,
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={tmp_path}/global_step_1",
    ]
    assert main(forced) == 0
    assert [r["step"] for r in steps(tmp_path)] == [1, 2]
    assert "adv_estimator: rloo" in (tmp_path / "config.yaml").read_text()
    longer = [*SMALL, f"trainer.default_local_dir={tmp_path}", "algorithm.adv_estimator=rloo"]
    assert (
        main(
            [
                *longer,
                "trainer.total_training_steps=3",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            ]
        )
        == 0
    )
    assert [r["step"] for r in steps(tmp_path)] == [1, 2, 3]


def test_rerunning_a_finished_run_says_it_is_finished(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    run = [
        *SMALL,
        "trainer.total_training_steps=1",
        "trainer.save_freq=1",
        f"trainer.default_local_dir={tmp_path}",
    ]
    assert main(run) == 0
    capsys.readouterr()
    assert main(run) == 0
    err = capsys.readouterr().err
    assert "is finished (step 1 of 1)" in err and "continuing at step" not in err
    assert [r["step"] for r in steps(tmp_path)] == [1]
