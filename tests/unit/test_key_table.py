"""The key table (relm/config/key_table.py) is total and true: every key relm accepts has exactly one entry,
no entry names a key that does not exist, and every key said to set a spec field does set it."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from relm.config import key_table, verl_keys, verl_renames
from relm.config.key_table import Ignored, Refused, Sets
from relm.config.loader import _schema_keys, load_config_with_warnings
from relm.config.schema import RelmConfig
from relm.config.specs import RunSpec
from relm.config.translate import translate
from tests.unit.test_verl_configs import RELEASES, _config_dir, _default_file, _leaves

SCHEMA = _schema_keys(RelmConfig, "")
TABLE = key_table.build_table()
SETS = sorted(key for key, entry in TABLE.items() if isinstance(entry, Sets))

# Values that a type-driven guess would get wrong (a choice among names, a value another key bounds).
VALUES: dict[str, Any] = {
    "data.truncation": "left",
    "actor_rollout_ref.model.path": "zoo:tiny/llama",
    "actor_rollout_ref.model.dtype": "bfloat16",
    "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-mean",
    "actor_rollout_ref.actor.kl_loss_type": "mse",
    "actor_rollout_ref.actor.policy_loss.loss_mode": "gspo",
    "actor_rollout_ref.actor.optim.warmup_style": "cosine",
    "actor_rollout_ref.actor.optim.lr_scheduler_type": "cosine",
    "actor_rollout_ref.actor.optim.moments_dtype": "bfloat16",
    "actor_rollout_ref.actor.optim.betas": [0.8, 0.9],
    "actor_rollout_ref.actor.ppo_micro_batch_size": 8,
    "actor_rollout_ref.ref.log_prob_micro_batch_size": 8,
    "actor_rollout_ref.rollout.log_prob_micro_batch_size": 8,
    "actor_rollout_ref.rollout.name": "hf",
    "actor_rollout_ref.rollout.dtype": "float16",
    "actor_rollout_ref.rollout.quantization": "fp8",
    "actor_rollout_ref.rollout.multi_turn.format": "other",
    "actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side": "left",
    "critic.loss_agg_mode": "seq-mean-token-mean",
    "critic.optim.warmup_style": "cosine",
    "critic.optim.lr_scheduler_type": "cosine",
    "critic.optim.moments_dtype": "bfloat16",
    "critic.optim.betas": [0.8, 0.9],
    "critic.ppo_micro_batch_size": 8,
    "reward_model.reward_manager": "dapo",
    "reward.reward_manager.name": "dapo",
    "reward_manager.name": "dapo",
    "reward_model.rollout.name": "hf",
    "algorithm.adv_estimator": "grpo",
    "algorithm.gdpo_reward_weights": [0.5, 2.0],
    "algorithm.kl_penalty": "mse",
    "algorithm.kl_ctrl.type": "adaptive",
    "algorithm.rollout_correction.rollout_is": "sequence",
    "algorithm.rollout_correction.rollout_rs": "seq_sum_k1",
    "algorithm.rollout_correction.rollout_rs_threshold": "0.4_2.5",
    "algorithm.rollout_correction.loss_type": "reinforce",
    "trainer.logger": ["console"],
    "trainer.device": "cpu",
    "trainer.resume_mode": "disable",
    "distillation.teacher_models": "{teacher_model:{model_path:/tmp/other}}",  # a mapping of mappings
}

# Keys that act only with another key set (the default threshold is read only with its option on).
WITH: dict[str, list[str]] = {
    "algorithm.rollout_correction.rollout_is_threshold": ["algorithm.rollout_correction.rollout_is=token"],
    "algorithm.rollout_correction.rollout_is_batch_normalize": [
        "algorithm.rollout_correction.rollout_is=token"
    ],
    "algorithm.rollout_correction.rollout_rs": ["algorithm.rollout_correction.rollout_rs_threshold=0.5_2.0"],
    "algorithm.rollout_correction.rollout_rs_threshold": [
        "algorithm.rollout_correction.rollout_rs=seq_sum_k1",
        "algorithm.rollout_correction.rollout_rs_threshold=0.5_2.0",
    ],
    "actor_rollout_ref.actor.ppo_micro_batch_size": [
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null"
    ],
    "critic.ppo_micro_batch_size": ["critic.ppo_micro_batch_size_per_gpu=null"],
    "actor_rollout_ref.ref.log_prob_micro_batch_size": [
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=null"
    ],
    "actor_rollout_ref.rollout.log_prob_micro_batch_size": [
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=null"
    ],
    "algorithm.rollout_correction.bypass_mode": [],
    # a size splits only where it divides the ranks (else it falls back to 1 with a line)
    "actor_rollout_ref.rollout.tensor_model_parallel_size": ["trainer.n_gpus_per_node=8"],
    "data.custom_cls.name": ["data.custom_cls.path=/tmp/dataset.py"],
    "data.custom_cls.path": ["data.custom_cls.name=MyDataset"],
    # the teachers are read only with distillation on, which needs a teacher
    "distillation.enabled": ["distillation.teacher_models.teacher_model.model_path=/tmp/teacher"],
    "distillation.teacher_models": [
        "distillation.enabled=true",
        "distillation.teacher_models.teacher_model.model_path=/tmp/teacher",
    ],
    "distillation.distillation_loss.topk": ["distillation.distillation_loss.loss_mode=forward_kl_topk"],
    "distillation.distillation_loss.clip_ratio": [
        "distillation.distillation_loss.clip_ratio_low=null",
        "distillation.distillation_loss.clip_ratio_high=null",
    ],
}


def _default_of(key: str) -> Any:
    node: Any = RelmConfig()
    for part in key.split("."):
        node = getattr(node, part)
    return node


def _other_value(key: str) -> Any:
    if key in VALUES:
        return VALUES[key]
    schema_key = dict((new, old) for new, old in verl_renames.RENAMED).get(key, key)
    default = _default_of(schema_key)
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 3 if default >= 0 else 5
    if isinstance(default, float):
        return default + 0.25
    if isinstance(default, dict):
        return {"extra": 1}
    if isinstance(default, list):
        return ["extra"]
    if isinstance(default, str):
        return "/tmp/other"
    # unset (None): a number where the hint takes one, else a text
    hint = str(_hint_of(schema_key))
    if "list" in hint:
        return ["/tmp/other.parquet"]
    if "int" in hint:
        return 7
    if "float" in hint:
        return 0.5
    if "bool" in hint:
        return True
    return "/tmp/other"


def _hint_of(key: str) -> Any:
    import typing

    cls: Any = RelmConfig
    *sections, leaf = key.split(".")
    for part in sections:
        cls = typing.get_type_hints(cls)[part]
    return typing.get_type_hints(cls)[leaf]


def _field(spec: RunSpec, path: str) -> Any:
    node: Any = spec
    for part in path.split("."):
        node = getattr(node, part)
    return node


@functools.cache
def _spec(*overrides: str) -> RunSpec:
    cfg, _ = load_config_with_warnings(["trainer.n_gpus_per_node=1", *overrides])
    return translate(cfg)[0]


def test_every_schema_key_has_exactly_one_entry():
    sources = {
        "spec": set(key_table.SPEC_KEYS),
        "refused schema": set(key_table.REFUSED_SCHEMA_KEYS),
        "ignored schema": set(key_table.IGNORED_SCHEMA_KEYS),
        "renamed": {new for new, _ in verl_renames.RENAMED} | set(verl_renames.MAX_RESP_LEN_KEYS),
        "verl ignored": set(verl_keys.ACCEPTED_UNUSED) - set(verl_keys.UNSUPPORTED_WHEN_ENABLED),
        "verl refused": set(verl_keys.UNSUPPORTED_WHEN_ENABLED),
    }
    for (name_a, keys_a), (name_b, keys_b) in (
        (a, b) for i, a in enumerate(sources.items()) for b in list(sources.items())[i + 1 :]
    ):
        assert not keys_a & keys_b, f"in both {name_a} and {name_b}: {sorted(keys_a & keys_b)}"
    assert set(SCHEMA) == sources["spec"] | sources["refused schema"] | sources["ignored schema"]
    # verl's `section.*` patterns cover the rest of a section whose schema keys relm reads; never one by name
    assert not set(SCHEMA) & set(verl_keys.ACCEPTED_UNUSED)


def test_no_entry_names_a_key_that_does_not_exist():
    default = _spec()
    for key, entry in TABLE.items():
        if isinstance(entry, Sets):
            _field(default, entry.field)  # the spec has the field
            assert key in SCHEMA or key in dict(verl_renames.RENAMED), key
        elif key in key_table.REFUSED_SCHEMA_KEYS or key in key_table.IGNORED_SCHEMA_KEYS:
            assert key in SCHEMA
        else:
            listed = {
                *verl_keys.ACCEPTED_UNUSED,
                *verl_keys.UNSUPPORTED_WHEN_ENABLED,
                *verl_renames.MAX_RESP_LEN_KEYS,
            }
            assert key not in SCHEMA and key in listed, key
        assert isinstance(entry, Sets | Ignored | Refused) and (
            entry.field if isinstance(entry, Sets) else entry.why
        ), key
    # A refused verl key is accepted (at its off value) under some entry the loader reads.
    for key in verl_keys.UNSUPPORTED_WHEN_ENABLED:
        assert verl_keys.match_accepted(key) is not None, key


@pytest.mark.parametrize("release", RELEASES)
def test_every_leaf_of_verls_default_config_has_an_entry(release: str, tmp_path: Path):
    leaves = list(_leaves(OmegaConf.load(_default_file(_config_dir(release, tmp_path)))))
    assert len(leaves) > 250
    dict_keys = [key for key in SCHEMA if isinstance(_default_of(key), dict)]
    missing = [
        key
        for key in leaves
        if key not in TABLE
        and verl_keys.match_accepted(key) is None
        and not any(key.startswith(f"{name}.") for name in dict_keys)
        and not any(
            key == section or key.startswith(f"{section}.") for section in verl_renames.RENAMED_SECTIONS
        )
    ]
    assert missing == []


@pytest.mark.parametrize("key", SETS)
def test_each_key_that_sets_a_spec_field_changes_it(key: str):
    field = TABLE[key]
    assert isinstance(field, Sets)
    base = WITH.get(key, [])
    value = _other_value(key)
    shown: Any = value  # the override's spelling: Hydra's grammar for lists and dicts
    if isinstance(value, list):
        shown = "[" + ",".join(str(item) for item in value) + "]"
    elif isinstance(value, dict):
        shown = "{" + ",".join(f"{k}:{v}" for k, v in value.items()) + "}"
    before = _field(_spec(*base), field.field)
    after = _field(_spec(*base, f"{key}={shown}"), field.field)
    assert after != before, f"{key}={shown} left {field.field} at {before!r}"


def test_the_five_once_ignored_keys_act_or_warn():
    """`data.trust_remote_code`, `*.optim.total_training_steps`, `critic.model.external_lib` set spec fields
    (read where the tokenizer, the schedule and the critic are built); `critic.model.tokenizer_path` warns;
    a tensor-parallel size sets the engine's (the native and HF engines split the model: no warning)."""
    for key in (
        "data.trust_remote_code",
        "actor_rollout_ref.actor.optim.total_training_steps",
        "critic.optim.total_training_steps",
        "critic.model.external_lib",
    ):
        assert isinstance(TABLE[key], Sets), key
    assert isinstance(TABLE["critic.model.tokenizer_path"], Ignored)
    _, warnings = load_config_with_warnings(["critic.model.tokenizer_path=/tmp/tok"])
    assert any("critic.model.tokenizer_path" in line for line in warnings)
    cfg, _ = load_config_with_warnings(
        ["actor_rollout_ref.rollout.tensor_model_parallel_size=2", "trainer.n_gpus_per_node=2"]
    )
    spec, unused = translate(cfg)
    assert spec.engine.tensor_parallel_size == 2
    assert not any("tensor_model_parallel_size" in line for line in unused)
