"""Evaluating without the training command: `data.val_files` alone, and `trainer.val_only` on a run folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from relm.config.loader import load_config
from relm.config.schema import RelmConfig
from relm.config.validate import validate_config
from relm.errors import UserError
from relm.trainer.run_config import write_run_config


def test_val_files_alone_keep_the_users_settings_not_the_demos() -> None:
    cfg = load_config(["actor_rollout_ref.model.path=m", "data.val_files=val.jsonl", "trainer.val_only=true"])
    defaults = RelmConfig()
    assert cfg.data.max_prompt_length == defaults.data.max_prompt_length  # the demo preset says 24
    assert cfg.data.train_batch_size == defaults.data.train_batch_size
    assert cfg.trainer.default_local_dir != "outputs/demo"
    validate_config(cfg)
    # Without val_only there is nothing to train on: one line says which key is missing.
    with pytest.raises(UserError, match=r"^data.train_files: not set, but data.val_files is"):
        validate_config(load_config(["actor_rollout_ref.model.path=m", "data.val_files=val.jsonl"]))


def test_val_only_on_a_run_folder_takes_that_runs_saved_config(tmp_path: Path) -> None:
    run = tmp_path / "run"
    trained = load_config(
        [
            "actor_rollout_ref.model.path=zoo:tiny/llama",
            "data.train_files=train.jsonl",
            "data.val_files=val.jsonl",
            "data.max_prompt_length=100",
            "algorithm.adv_estimator=grpo",
            f"trainer.default_local_dir={run}",
        ]
    )
    write_run_config(trained, run)
    cfg = load_config(["trainer.val_only=true", f"trainer.default_local_dir={run}", "data.val_batch_size=7"])
    assert cfg.trainer.val_only and cfg.data.val_batch_size == 7  # the command's own keys still win
    assert cfg.actor_rollout_ref.model.path == "zoo:tiny/llama"
    assert (cfg.data.train_files, cfg.data.val_files) == (["train.jsonl"], ["val.jsonl"])
    assert (cfg.data.max_prompt_length, cfg.algorithm.adv_estimator) == (100, "grpo")
    # A folder without config.yaml (or no val_only) leaves the command as it is: the demo.
    assert (
        load_config(["trainer.val_only=true", f"trainer.default_local_dir={tmp_path}"]).data.train_files
        is None
    )
    assert load_config([f"trainer.default_local_dir={run}"]).data.train_files is None
