"""Lengths left at verl's defaults follow a short context; a run on the user's data names its model."""

from __future__ import annotations

from pathlib import Path

import pytest

from relm.config.context_fit import (
    MODEL_KEY,
    PROMPT_KEY,
    RESPONSE_KEY,
    fitted_lengths,
    fitted_micro_batches,
    require_named_model,
)
from relm.config.loader import load_config, user_set_keys
from relm.data.demo_task import write_demo_parquet
from relm.errors import UserError
from relm.trainer.main_ppo import main

DATA = "data.train_files=/data/train.parquet"


def fit(argv: list[str], max_positions: int | None) -> dict[str, int]:
    return fitted_lengths(load_config(argv), user_set_keys(argv), max_positions)


def test_lengths_left_at_the_defaults_split_a_short_context_as_the_defaults_do():
    assert fit([DATA], 256) == {PROMPT_KEY: 128, RESPONSE_KEY: 128}  # 512 + 512 into 256
    assert fit([DATA], 4096) == {}  # they fit: nothing changes
    assert fit([DATA], None) == {}  # the model names no limit


def test_a_length_the_user_set_stays_and_the_other_takes_the_rest():
    assert fit([DATA, "data.max_prompt_length=200"], 256) == {RESPONSE_KEY: 56}
    assert fit([DATA, "data.max_response_length=512"], 600) == {PROMPT_KEY: 88}
    # Both set, or nothing left for one: validation reports the problem in its own words.
    assert fit([DATA, "data.max_prompt_length=200", "data.max_response_length=200"], 256) == {}
    assert fit([DATA, "data.max_prompt_length=300"], 256) == {}


def test_keys_from_a_config_file_count_as_set(tmp_path: Path):
    file = tmp_path / "run.yaml"
    file.write_text(
        "data:\n  max_prompt_length: 100\nactor_rollout_ref:\n  model:\n    path: zoo:tiny/qwen2\n"
    )
    keys = user_set_keys(["--config", str(file), DATA])
    assert {PROMPT_KEY, MODEL_KEY, "data.train_files"} <= keys and RESPONSE_KEY not in keys


def test_a_run_on_the_users_data_must_name_its_model():
    with pytest.raises(
        UserError, match=r"^actor_rollout_ref.model.path: no model named for data.train_files"
    ):
        require_named_model(load_config([DATA]), user_set_keys([DATA]))
    named = [DATA, "actor_rollout_ref.model.path=zoo:tiny/qwen2"]
    require_named_model(load_config(named), user_set_keys(named))
    require_named_model(load_config([]), set())  # the demo: its model is the demo's


def test_the_entry_point_says_so_before_loading(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    train, _ = write_demo_parquet(tmp_path / "data")
    assert main([f"data.train_files={train}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: actor_rollout_ref.model.path: no model named")


def test_a_run_fits_the_default_lengths_to_its_model_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    train, _ = write_demo_parquet(tmp_path / "data")
    argv = [
        f"data.train_files={train}", "actor_rollout_ref.model.path=zoo:tiny/qwen2",  # 256 positions
        "data.train_batch_size=4", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "trainer.total_training_steps=1", "trainer.logger=[]", "trainer.test_freq=-1",
        "trainer.val_before_train=false", f"trainer.default_local_dir={tmp_path / 'run'}",
    ]  # fmt: skip
    with caplog.at_level("INFO", logger="relm"):
        assert main(argv) == 0
    said = [r.getMessage() for r in caplog.records if "follow the model's context" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(
        "data.max_prompt_length=128, data.max_response_length=128 follow"
    )
    assert "max_prompt_length: 128" in (tmp_path / "run" / "config.yaml").read_text()


ACTOR_MICRO = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"


def micro_fit(argv: list[str]) -> dict[str, int]:
    return fitted_micro_batches(load_config(argv), user_set_keys(argv))


def test_the_demos_micro_batch_follows_two_gpus_and_a_size_the_user_set_stays():
    # The demo: mini-batch 4 prompts x 8 responses = 32, micro-batch 32; two ranks hold 16 each.
    assert micro_fit(["trainer.n_gpus_per_node=2"]) == {
        ACTOR_MICRO: 16,
        "critic.ppo_micro_batch_size_per_gpu": 16,  # the demo is PPO with a critic (GAE)
    }
    assert micro_fit(["trainer.n_gpus_per_node=2", "algorithm.adv_estimator=grpo"]) == {ACTOR_MICRO: 16}
    grpo = "algorithm.adv_estimator=grpo"
    assert micro_fit(["trainer.n_gpus_per_node=3", "actor_rollout_ref.rollout.n=6", grpo]) == {ACTOR_MICRO: 8}
    assert micro_fit([]) == {}  # one process: 32 splits 32
    assert ACTOR_MICRO not in micro_fit(
        ["trainer.n_gpus_per_node=2", f"{ACTOR_MICRO}=32"]
    )  # validation names it


def test_relm_train_on_two_processes_runs_the_demos_micro_batch(capsys):
    """The README's `trainer.n_gpus_per_node=2` on the demo passes validation (the run itself is
    tests/integration's); before, it stopped at `ppo_micro_batch_size_per_gpu=32 x 2 GPUs must divide`."""
    from relm.config.validate import validate_config

    argv = ["trainer.n_gpus_per_node=2"]
    cfg = load_config([*argv, *(f"{k}={v}" for k, v in micro_fit(argv).items())])
    validate_config(cfg)
