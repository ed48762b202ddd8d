"""`~` and environment variables expand in every path key of the loaded config."""

from __future__ import annotations

import os

import pytest

from relm.config.loader import load_config
from relm.config.lookup import section_keys
from relm.config.paths import PATH_SUFFIXES, expand_path
from relm.config.schema import RelmConfig


def test_every_path_key_expands_tilde_and_variables(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HOME", "/home/u")
    monkeypatch.setenv("DATA", "/srv/data")
    cfg = load_config(
        [
            "data.train_files=[~/d/train.parquet,$DATA/more.parquet]",
            "data.val_files=${oc.env:DATA}/val.parquet",
            "actor_rollout_ref.model.path=~/models/qwen",
            "actor_rollout_ref.model.tokenizer_path=$DATA/tok",
            "critic.model.path=~/critic",
            "custom_reward_function.path=~/my_reward.py",
            "trainer.default_local_dir=${oc.env:HOME}/runs/x",
            "trainer.resume_from_path=~/runs/x/global_step_2",
        ]
    )
    assert cfg.data.train_files == ["/home/u/d/train.parquet", "/srv/data/more.parquet"]
    assert cfg.data.val_files == ["/srv/data/val.parquet"]
    assert cfg.actor_rollout_ref.model.path == "/home/u/models/qwen"
    assert cfg.actor_rollout_ref.model.tokenizer_path == "/srv/data/tok"
    assert cfg.critic.model.path == "/home/u/critic"
    assert cfg.custom_reward_function.path == "/home/u/my_reward.py"
    assert cfg.trainer.default_local_dir == "/home/u/runs/x"
    assert cfg.trainer.resume_from_path == "/home/u/runs/x/global_step_2"


def test_dollar_sign_in_a_value_is_expanded_by_relm_not_only_by_the_shell(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RELM_TEST_ROOT", "/r")
    cfg = load_config(
        ["data.train_files=${oc.env:RELM_TEST_ROOT}/a.parquet", "data.val_files=$RELM_TEST_ROOT/b"]
    )
    assert (cfg.data.train_files, cfg.data.val_files) == (["/r/a.parquet"], ["/r/b"])


def test_hub_ids_and_zoo_names_pass_through():
    assert expand_path("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    assert expand_path("zoo:tiny/qwen2") == "zoo:tiny/qwen2"


def test_the_schema_path_keys_are_the_ones_the_rule_finds():
    """A new path key named otherwise (`..._file`, `..._folder`) would escape the expansion: name it here."""
    found = [k for k in section_keys(RelmConfig(), "") if k.rsplit(".", 1)[-1].endswith(PATH_SUFFIXES)]
    assert {"data.train_files", "data.val_files", "custom_reward_function.path"} <= set(found)
    assert {"actor_rollout_ref.model.path", "trainer.default_local_dir"} <= set(found)
    leaf_names = {k.rsplit(".", 1)[-1] for k in section_keys(RelmConfig(), "")}
    assert not {n for n in leaf_names if n.endswith(("_file", "_folder", "_paths"))}, os.linesep
