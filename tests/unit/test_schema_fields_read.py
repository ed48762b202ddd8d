"""Every config field is read by the code that runs, not only by the loader and the validator.

A field of `relm/config/schema.py` that nothing outside `relm/config/` reads is a key the user sets in
vain (as `ref.log_prob_micro_batch_size_per_gpu` and `critic.forward_micro_batch_size_per_gpu` once
were). The walk is by attribute name (`x.field` anywhere in `relm/` outside `relm/config/`): it cannot
tell two sections' fields of the same name apart, but it catches a key that is read nowhere.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import relm
from relm.config import schema

RELM = Path(relm.__file__).parent

NOT_READ = {
    "ActorConfig.strategy": "verl's fsdp/fsdp2/megatron switch: validated to fsdp or fsdp2, which relm always runs",
    "CriticConfig.strategy": "the same for the critic",
    "ActorRolloutRefConfig.hybrid_engine": "verl's colocation switch: relm's engine always shares the actor's GPU",
    "ActorConfig.ppo_micro_batch_size": "deprecated global size, turned into ppo_micro_batch_size_per_gpu on load",
    "CriticConfig.ppo_micro_batch_size": "the same for the critic",
    "RefConfig.log_prob_micro_batch_size": "deprecated global size, turned into the _per_gpu key on load",
    "RolloutConfig.log_prob_micro_batch_size": "the same for the rollout",
    "DataConfig.custom_cls": "custom dataset classes are refused by the validator when set",
    **{
        f"RolloutCorrectionConfig.{name}": "parsed once by relm.config.rollout_correction into the record the step reads"
        for name in (
            "bypass_mode",
            "rollout_is",
            "rollout_is_threshold",
            "rollout_is_batch_normalize",
            "rollout_rs",
            "rollout_rs_threshold",
        )
    },  # fmt: skip
}
"""Fields nothing outside relm/config/ reads, each with the reason; keep it short and true."""


def attributes_read_outside_config() -> set[str]:
    names: set[str] = set()
    for path in RELM.rglob("*.py"):
        if path.relative_to(RELM).parts[0] == "config":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute):
                names.add(node.attr)
    return names


def schema_fields() -> list[tuple[str, str]]:
    return [
        (cls.__name__, field.name)
        for cls in vars(schema).values()
        if isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__module__ == schema.__name__
        for field in dataclasses.fields(cls)
    ]


def test_every_schema_field_is_read_outside_config():
    read = attributes_read_outside_config()
    fields = schema_fields()
    assert len(fields) > 100  # the walk found the schema
    unread = sorted(
        f"{cls}.{name}" for cls, name in fields if name not in read and f"{cls}.{name}" not in NOT_READ
    )
    assert not unread, (
        f"config fields read nowhere outside relm/config/ (wire them, or list them with a reason): {unread}"
    )


def test_the_list_of_unread_fields_is_true():
    """A listed field that the code now reads, or that the schema lost, leaves the list."""
    read = attributes_read_outside_config()
    known = {f"{cls}.{name}": name for cls, name in schema_fields()}
    stale = sorted(key for key in NOT_READ if key not in known or known[key] in read)
    assert not stale, f"remove from NOT_READ: {stale}"
