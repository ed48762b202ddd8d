"""verl's newer spellings of keys relm reads, folded into relm's names before the config is built.

verl renamed some keys and kept the old ones beside them: 0.6 added `optim.lr_scheduler_type` (the old
`optim.warmup_style` stays, `null` in 0.9's default file) and `optim.clip_grad` next to `grad_clip`;
0.9 moved the reward settings into a `reward:` section (`reward.reward_manager.name`,
`reward.custom_reward_function.*`, `reward.reward_kwargs`) and writes the legacy keys as `null`. DAPO
scripts pass the overlong shaping as `reward_model.reward_kwargs.overlong_buffer_cfg.*`. relm's schema
keeps one name for each setting; this module moves a value given under the other name onto it. The
Megatron and VeOmni optimizer sections give the learning-rate floor in absolute terms (`optim.min_lr`,
`optim.lr_min`); it becomes relm's `optim.min_lr_ratio` (floor / lr).

Which one wins follows verl's own migration (verl/experimental/reward_loop: `migrate_legacy_reward_impl`,
and `FSDPOptimizerConfig` for `warmup_style`): an old key the user set to a value wins, otherwise the
new key's value is used, and an old key left `null` (verl 0.9's "unset") takes relm's default.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from relm.config.schema import RelmConfig
from relm.errors import UserError

_OVERLONG = ("enable", "len", "penalty_factor", "log")
_KWARGS_SECTIONS = ("reward_model.reward_kwargs", "reward.reward_kwargs")
RENAMED_SECTIONS = _KWARGS_SECTIONS
"""verl sections whose keys are read into relm's own when the config loads (not schema keys)."""

RENAMED: tuple[tuple[str, str], ...] = (
    ("actor_rollout_ref.actor.optim.lr_scheduler_type", "actor_rollout_ref.actor.optim.warmup_style"),
    ("critic.optim.lr_scheduler_type", "critic.optim.warmup_style"),
    ("actor_rollout_ref.actor.optim.clip_grad", "actor_rollout_ref.actor.grad_clip"),
    ("critic.optim.clip_grad", "critic.grad_clip"),
    # TorchTitan's optimizer section (verl 0.9.1's `optim/torchtitan.yaml`) names the floor this way.
    ("actor_rollout_ref.actor.optim.min_lr_factor", "actor_rollout_ref.actor.optim.min_lr_ratio"),
    ("critic.optim.min_lr_factor", "critic.optim.min_lr_ratio"),
    ("reward.custom_reward_function.path", "custom_reward_function.path"),
    ("reward.custom_reward_function.name", "custom_reward_function.name"),
    ("reward.reward_manager.name", "reward_model.reward_manager"),
    ("reward_manager.name", "reward_model.reward_manager"),  # verl 0.7's top-level section
    ("reward.reward_model.enable", "reward_model.enable"),
    # verl 0.9's reward model section (`migrate_legacy_reward_impl` moves the legacy keys here). Its
    # `rollout.name` names the server verl runs the model on (vllm, sglang); relm's judge engine is its own
    # choice (`reward_model.rollout.name`), so that one stays with the section's other serving knobs.
    ("reward.reward_model.model_path", "reward_model.model.path"),
    *(
        (f"reward.reward_model.rollout.{key}", f"reward_model.rollout.{key}")
        for key in ("prompt_length", "response_length", "temperature", "top_p", "top_k", "do_sample")
    ),
    ("reward.num_workers", "reward_model.num_workers"),
    ("reward.timeout", "reward_model.timeout"),
    *(
        (f"{section}.overlong_buffer_cfg.{key}", f"reward_model.overlong_buffer.{key}")
        for section in _KWARGS_SECTIONS
        for key in _OVERLONG
    ),
)
"""(verl's other spelling, the key relm reads)."""

MAX_RESP_LEN_KEYS = tuple(f"{section}.max_resp_len" for section in _KWARGS_SECTIONS)
"""DAPO's reward manager measures overlong responses against this; relm against `data.max_response_length`."""

_ABSENT = object()


def fold(merged: DictConfig, layers: list[DictConfig]) -> dict[str, Any]:
    """Move each renamed key's value onto relm's key in `merged` (in place); drop the renamed key.

    `layers` are the user's value layers, lowest first: of the two spellings, the one set (to a value,
    not `null`) in the later layer wins; within one layer, relm's (verl's legacy) key wins.
    Returns the values this module checks after the build (`max_resp_len`), by key.
    """
    for new, old in RENAMED:
        value = _select(merged, new)
        if value is _ABSENT:
            continue
        _drop(merged, new)
        if value is not None and _last_set(layers, new) > _last_set(layers, old):
            OmegaConf.update(merged, old, value, force_add=True)
    for _, old in RENAMED:
        if _select(merged, old) is None and _default(old) is not None:
            _drop(merged, old)  # verl 0.9 writes `null` for "unset" where relm has a default
    for section in OPTIM_SECTIONS:
        _fold_absolute_floor(merged, layers, section)
    checks = {}
    for key in MAX_RESP_LEN_KEYS:
        value = _select(merged, key)
        if value is not _ABSENT:
            checks[key] = value
            _drop(merged, key)
    return checks


OPTIM_SECTIONS = ("actor_rollout_ref.actor.optim", "critic.optim")
ABSOLUTE_FLOORS = ("min_lr", "lr_min")
"""Megatron's (`min_lr`) and VeOmni's (`lr_min`) absolute learning-rate floor: what the schedule decays to."""


def _fold_absolute_floor(merged: DictConfig, layers: list[DictConfig], section: str) -> None:
    """An absolute floor becomes relm's `min_lr_ratio` (floor / `lr`): Megatron's cosine decays from `lr`
    to `min_lr` as verl's FSDP one decays to `lr * min_lr_ratio`, and a constant schedule ignores both.
    A floor of 0 (the engines' default) is no floor; with `lr` not positive the key stays refused."""
    ratio_key = f"{section}.min_lr_ratio"
    for name in ABSOLUTE_FLOORS:
        key = f"{section}.{name}"
        floor, lr = _select(merged, key), _select(merged, f"{section}.lr")
        if floor in (_ABSENT, None, 0) or not isinstance(floor, int | float) or isinstance(floor, bool):
            continue
        if not isinstance(lr, int | float) or isinstance(lr, bool) or lr <= 0:
            continue
        if floor < 0 or floor > lr:
            raise UserError(
                f"`{key}={floor}` must lie between 0 and `{section}.lr={lr}` (the schedule decays to it)"
            )
        ratio = floor / lr
        given = _select(merged, ratio_key)
        if _last_set(layers, ratio_key) >= 0 and given not in (None, 0) and given != ratio:
            raise UserError(
                f"`{key}={floor}` and `{ratio_key}={given}` give two floors (`{name}` is `lr * min_lr_ratio`); keep one"
            )
        OmegaConf.update(merged, ratio_key, ratio, force_add=True)
        _drop(merged, key)


def _last_set(layers: list[DictConfig], key: str) -> int:
    """Index of the last layer that gives `key` a value other than `null` (-1: none)."""
    found = -1
    for index, layer in enumerate(layers):
        if _select(layer, key) not in (_ABSENT, None):
            found = index
    return found


def check_built(cfg: RelmConfig, checks: dict[str, Any]) -> None:
    """`max_resp_len` must agree with `data.max_response_length`, the length relm's shaping measures against."""
    for key, value in checks.items():
        if value is not None and value != cfg.data.max_response_length:
            raise UserError(
                f"`{key}={value}` differs from `data.max_response_length={cfg.data.max_response_length}`; relm's "
                "overlong shaping measures against `data.max_response_length`: set the two equal"
            )


def _select(tree: DictConfig, key: str) -> Any:
    try:
        value = OmegaConf.select(tree, key, default=_ABSENT, throw_on_missing=False)
    except OmegaConfBaseException as err:
        raise UserError(f"`{key}`: cannot resolve its value ({str(err).splitlines()[0]})") from err
    return value


def _drop(tree: DictConfig, key: str) -> None:
    """Delete a key, and the sections that deleting it left empty (an empty section reads as a leaf)."""
    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(tree, parent_key) if parent_key else tree
    if isinstance(parent, DictConfig) and leaf in parent:
        del parent[leaf]
        if parent_key and len(parent) == 0:
            _drop(tree, parent_key)


def _default(dotted: str) -> Any:
    node: Any = RelmConfig()
    for part in dotted.split("."):
        node = getattr(node, part)
    return node
