"""verl 0.9.1's rollout-correction keys (`algorithm.rollout_correction.*`) read once into a typed record.

verl parses its threshold strings inside the loss, on every call, and a wrong one surfaces as a
`ValueError` deep in a training step; relm parses them here, when the config is checked, so a wrong
value stops the run before any model loads with the key named (`relm.errors.UserError`). The rules are
verl's (`verl/trainer/ppo/rollout_corr_helper.py`: `_parse_rollout_is_threshold`,
`_parse_rollout_rs_thresholds`); the tensor functions that use the result are in
`relm.algorithms.rollout_correction`.
"""

from __future__ import annotations

from dataclasses import dataclass

from relm.config.schema import RolloutCorrectionConfig
from relm.errors import UserError

IS_LEVELS = ("token", "sequence")
RS_OPTIONS = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)
"""Rejection criteria: where the divergence is read (a token, or a response's sum, mean or max) and which
estimator of it (k1 = -log r, k2 = (log r)^2 / 2, k3 = r - 1 - log r, with r = pi_old / pi_rollout)."""
LOSS_TYPES = ("ppo_clip", "reinforce")

_PREFIX = "algorithm.rollout_correction"


@dataclass(frozen=True)
class RejectionBound:
    """One `rollout_rs` option with its bounds."""

    option: str
    """One of `RS_OPTIONS`."""
    upper: float
    """k1: the upper bound (a ratio; its log bounds the k1 statistic); k2/k3: the largest divergence kept."""
    lower: float | None
    """k1 only: the lower bound (a ratio); None for k2/k3, which are never negative."""


@dataclass(frozen=True)
class RolloutCorrection:
    """What the step does about the engine's gap, resolved from the config."""

    is_level: str | None
    """`token`, `sequence` or None (no importance weights)."""
    is_upper: float
    """Truncation bound of the weights (TIS), or the upper IcePop bound."""
    is_lower: float | None
    """IcePop's lower bound (weights outside [lower, upper] become 0); None for truncation."""
    is_batch_normalize: bool
    rejection: tuple[RejectionBound, ...]
    """Every option must pass for a token (or response) to stay in the loss; empty: no rejection."""
    bypass: bool
    """The engine's logprobs are the old ones; the corrections act in the loss against the current policy."""
    loss_type: str
    """Bypass mode's loss: `ppo_clip` or `reinforce`."""

    @property
    def changes_update(self) -> bool:
        """Whether weights or rejection act on the loss (else only the `rollout_corr/` metrics are computed)."""
        return self.is_level is not None or bool(self.rejection)


def parse_rollout_correction(section: RolloutCorrectionConfig) -> RolloutCorrection:
    """The section's values checked and parsed.

    Raises:
        UserError: a level, option, loss type or threshold verl would refuse, naming the key.
    """
    if section.rollout_is is not None and section.rollout_is not in IS_LEVELS:
        raise UserError(
            f"`{_PREFIX}.rollout_is={section.rollout_is}` is not supported; choose one of: token, sequence, null"
        )
    if section.loss_type not in LOSS_TYPES:
        raise UserError(
            f"`{_PREFIX}.loss_type={section.loss_type}` is not supported; choose one of: {', '.join(LOSS_TYPES)}"
        )
    upper, lower = 2.0, None
    if section.rollout_is is not None:  # verl reads the threshold only when weights are asked for
        upper, lower = _is_threshold(section.rollout_is_threshold)
    rejection: tuple[RejectionBound, ...] = ()
    if section.rollout_rs is not None:
        rejection = _rejection_bounds(section.rollout_rs, section.rollout_rs_threshold)
    return RolloutCorrection(
        is_level=section.rollout_is,
        is_upper=upper,
        is_lower=lower,
        is_batch_normalize=section.rollout_is_batch_normalize,
        rejection=rejection,
        bypass=section.bypass_mode,
        loss_type=section.loss_type,
    )


def _is_threshold(spec: float | str) -> tuple[float, float | None]:
    key = f"`{_PREFIX}.rollout_is_threshold={spec}`"
    text = str(spec).strip()
    lower_text, upper_text = text.split("_", 1) if "_" in text else (None, text)
    try:
        upper = float(upper_text)
        lower = None if lower_text is None else float(lower_text)
    except ValueError:
        raise UserError(
            f"{key} must be a number (truncation bound) or `lower_upper` (IcePop bounds), e.g. 2.0 or 0.5_5.0"
        ) from None
    if upper <= 0 or (lower is not None and lower <= 0):
        raise UserError(f"{key}: bounds must be positive")
    if lower is not None and lower > upper:
        raise UserError(f"{key}: the lower bound exceeds the upper one; write `lower_upper`")
    return upper, lower


def _rejection_bounds(options_text: str, spec: float | str | None) -> tuple[RejectionBound, ...]:
    options: list[str] = []
    for option in (part.strip() for part in options_text.split(",")):
        if not option:
            continue
        if option not in RS_OPTIONS:
            raise UserError(
                f"`{_PREFIX}.rollout_rs={options_text}`: `{option}` is not a rejection option; choose from: "
                f"{', '.join(RS_OPTIONS)} (comma-separated for several)"
            )
        if option not in options:
            options.append(option)
    if not options:
        raise UserError(f"`{_PREFIX}.rollout_rs={options_text!r}` names no option; set one or null")
    key = f"`{_PREFIX}.rollout_rs_threshold={spec}`"
    if spec is None:
        raise UserError(
            f"`{_PREFIX}.rollout_rs={options_text}` needs `{_PREFIX}.rollout_rs_threshold` (e.g. 0.5_2.0 for a k1 "
            "option, 0.01 for k2/k3)"
        )
    specs = [part.strip() for part in str(spec).split(",") if part.strip()]
    if len(specs) not in (1, len(options)):
        raise UserError(
            f"{key}: give one threshold for all {len(options)} options or one per option, comma-separated"
        )
    specs = specs * len(options) if len(specs) == 1 else specs
    return tuple(_bound(option, text, key) for option, text in zip(options, specs, strict=True))


def _bound(option: str, text: str, key: str) -> RejectionBound:
    is_k1 = option.endswith("k1")
    if "_" in text and not is_k1:
        raise UserError(f"{key}: `{option}` takes one upper bound, not `lower_upper`")
    try:
        if is_k1:
            lower_text, upper_text = text.split("_", 1) if "_" in text else (None, text)
            upper = float(upper_text)
            lower = 1.0 / upper if lower_text is None else float(lower_text)
        else:
            upper, lower = float(text), None
    except (ValueError, ZeroDivisionError):
        raise UserError(f"{key}: `{text}` is not a number (or `lower_upper` for a k1 option)") from None
    if upper <= 0 or (lower is not None and lower <= 0):
        raise UserError(f"{key}: the bounds of `{option}` must be positive")
    if lower is not None and lower > upper:
        raise UserError(f"{key}: the lower bound of `{option}` exceeds its upper bound")
    return RejectionBound(option=option, upper=upper, lower=lower)
