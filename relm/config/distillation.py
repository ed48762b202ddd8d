"""verl 0.9.1's `distillation.*` keys read once into a `DistillationSpec`, with verl's checks as one-line errors.

verl checks these in its config dataclasses (`verl/workers/config/distillation.py`) when the trainer
starts its workers; relm checks them here, before any model loads, and names the key. The teacher entries
follow verl's rules: the default `teacher_model` alone scores every response (its `key` becomes
`default`); once other entries are added (`+distillation.teacher_models.NAME.*`) it is dropped, each
entry needs its own `key`, and a response goes to the teacher whose key is its row's `teacher_key` value.
A teacher's `inference.*` (verl's vLLM/SGLang server for it) and `num_replicas`, and the section's own
`n_gpus_per_node`/`nnodes`, size verl's separate teacher pool: relm scores with the teacher in its
training processes, so those are accepted and reported as unused.
"""

from __future__ import annotations

from typing import Any

from relm.config.schema import DistillationConfig
from relm.config.specs import DistillationLoss, DistillationSpec, TeacherSpec
from relm.errors import UserError

ESTIMATOR_MODES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
"""Loss modes that read the teacher's log-probability of the sampled token only (single-sample estimators
of KL(student || teacher), `relm.algorithms.kl.kl_estimate`)."""
TOPK_MODES = ("forward_kl_topk",)
"""Loss modes that read the teacher's top-k log-probabilities and token ids at each position."""
LOSS_MODES = ESTIMATOR_MODES + TOPK_MODES
"""verl 0.9.1's `distillation.distillation_loss.loss_mode` values."""

_PREFIX = "distillation"
_TEACHER_KEYS = {"key", "model_path", "num_replicas", "inference", "_target_"}
_LONE = "teacher_model"


def parse_distillation(section: DistillationConfig) -> tuple[DistillationSpec, list[str]]:
    """The spec of `distillation.*` and the warning lines of its keys that do not act.

    Raises:
        UserError: with `enabled`, a loss verl refuses (an unknown mode, `k1` backpropagated directly, a
            policy loss other than `vanilla`, `forward_kl_topk` without `topk`) or a teacher entry without its
            path or key.
    """
    loss = section.distillation_loss
    low = loss.clip_ratio if loss.clip_ratio_low is None else loss.clip_ratio_low
    high = loss.clip_ratio if loss.clip_ratio_high is None else loss.clip_ratio_high
    warnings: list[str] = []
    teachers: tuple[TeacherSpec, ...] = ()
    if section.enabled:
        _check_loss(section)
        teachers, warnings = _teachers(section.teacher_models)
        if section.n_gpus_per_node * section.nnodes:
            warnings.append(
                f"`{_PREFIX}.n_gpus_per_node={section.n_gpus_per_node}`, `{_PREFIX}.nnodes={section.nnodes}`: "
                "accepted, not used (relm's teachers score in the training processes, on their GPUs)"
            )
    spec = DistillationSpec(
        enabled=section.enabled,
        teachers=teachers,
        loss=DistillationLoss(
            loss_mode=loss.loss_mode,
            use_policy_gradient=loss.use_policy_gradient,
            loss_max_clamp=loss.loss_max_clamp,
            clip_ratio_low=low,
            clip_ratio_high=high,
        ),
        use_task_rewards=loss.use_task_rewards,
        coef=loss.distillation_loss_coef,
        topk=loss.topk if loss.loss_mode in TOPK_MODES else None,
        log_prob_min_clamp=loss.log_prob_min_clamp,
    )
    return spec, warnings


def _check_loss(section: DistillationConfig) -> None:
    loss, key = section.distillation_loss, f"{_PREFIX}.distillation_loss"
    if loss.loss_mode not in LOSS_MODES:
        raise UserError(
            f"`{key}.loss_mode={loss.loss_mode}` is not a distillation loss; choose one of: {', '.join(LOSS_MODES)}"
        )
    if loss.loss_mode in TOPK_MODES and (loss.topk is None or loss.topk < 1):
        raise UserError(
            f"`{key}.topk={loss.topk}`: `{loss.loss_mode}` needs the teacher's top ids; set topk >= 1"
        )
    if loss.loss_mode == "k1" and not loss.use_policy_gradient:
        raise UserError(
            f"`{key}.loss_mode=k1` with use_policy_gradient=false: the gradient of k1 itself does not depend on the "
            "teacher; set use_policy_gradient=true or loss_mode=k3"
        )
    if loss.policy_loss_mode != "vanilla":
        raise UserError(
            f"`{key}.policy_loss_mode={loss.policy_loss_mode}`: verl's distillation takes only `vanilla`; set it to vanilla"
        )
    if section.teacher_key != "data_source":
        raise UserError(
            f"`{_PREFIX}.teacher_key={section.teacher_key}`: relm routes responses to teachers by their row's "
            "data_source only; set it to data_source"
        )


def _teachers(entries: dict[str, Any]) -> tuple[tuple[TeacherSpec, ...], list[str]]:
    """verl's `_resolve_teacher_models`: the lone default teacher, or the added ones without it."""
    named = dict(entries)
    if len(named) > 1:
        named.pop(_LONE, None)
    teachers, warnings, keys = [], [], set()
    for name, entry in named.items():
        where = f"{_PREFIX}.teacher_models.{name}"
        if not isinstance(entry, dict):
            raise UserError(f"`{where}` is a section, not a value; set `{where}.model_path=...`")
        unknown = sorted(set(entry) - _TEACHER_KEYS)
        if unknown:
            raise UserError(
                f"unknown key `{where}.{unknown[0]}`; a teacher takes key, model_path, num_replicas, inference.*"
            )
        if not entry.get("model_path"):
            raise UserError(f"`{where}.model_path` is not set; name the teacher's model folder (or Hub id)")
        key = "default" if len(named) == 1 else entry.get("key")
        if key is None:
            raise UserError(
                f"`{where}.key` is not set; with several teachers each names the data_source it scores"
            )
        if key in keys:
            raise UserError(f"`{where}.key={key}`: another teacher has that key; give each teacher its own")
        keys.add(key)
        teachers.append(TeacherSpec(name=name, key=str(key), path=str(entry["model_path"])))
        unused = [f"`{where}.{k}`" for k in ("num_replicas", "inference") if entry.get(k)]
        if unused:
            warnings.append(
                f"{', '.join(unused)}: accepted, not used (verl's teacher inference servers; relm scores with the "
                "teacher's own forward in the training processes)"
            )
    return tuple(teachers), warnings
