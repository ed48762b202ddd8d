"""KL to the reference policy: per-token estimators, the coefficient controllers, the reward penalty.

The KL enters training in one of two places (verl's split): subtracted from the token rewards
(`algorithm.use_kl_in_reward`, PPO/RLHF style, coefficient from a controller) or added to the actor
loss (`actor.use_kl_loss`, GRPO style). Both use `kl_estimate`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from relm.algorithms.masked import masked_mean

_BASE_KL_KINDS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
KL_KINDS = _BASE_KL_KINDS + tuple(kind + "+" for kind in _BASE_KL_KINDS)
"""Estimator names of `algorithm.kl_penalty` and `actor.kl_loss_type`, verl 0.9.1's set: a `+` suffix
keeps the estimator's value and takes the gradient of `k2` (straight-through)."""


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from the sampled tokens' logprobs.

    Estimators from Schulman, "Approximating KL Divergence" (2020), with r = pi_ref / pi:
    - `kl` / `k1`: log pi - log pi_ref; unbiased, high variance, can be negative.
    - `abs`: |log pi - log pi_ref|.
    - `mse` / `k2`: 0.5 (log pi - log pi_ref)^2; biased, low variance, >= 0.
    - `low_var_kl` / `k3`: r - log r - 1; unbiased and >= 0. The log-ratio is clamped to
      [-20, 20] before `exp` and the result to [-10, 10], as verl does, because one token the
      reference finds very unlikely would otherwise dominate the loss.
    - any of these with `+` (`k3+`, `low_var_kl+`, ...): the value of the named estimator with the
      gradient of `k2`. As a loss, k1 and k3 are unbiased in value but not in gradient, while the
      gradient of k2 is the gradient of the true KL in expectation (verl's straight-through trick).

    Args:
        logprobs: [N, R] log pi of the sampled tokens.
        ref_logprobs: [N, R] log pi_ref of the same tokens.
        kind: one of `KL_KINDS`.

    Returns:
        [N, R], unmasked (callers aggregate over their mask).
    """
    if kind.endswith("+") and kind[:-1] in _BASE_KL_KINDS:
        value = _kl_value(logprobs, ref_logprobs, kind[:-1])
        k2 = 0.5 * (logprobs - ref_logprobs).square()  # [N, R]
        return k2 - k2.detach() + value.detach()
    return _kl_value(logprobs, ref_logprobs, kind)


def _kl_value(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str) -> torch.Tensor:
    """The estimator named `kind` (no `+`), with its own gradient."""
    diff = logprobs - ref_logprobs  # [N, R]
    if kind in ("kl", "k1"):
        return diff
    if kind == "abs":
        return diff.abs()
    if kind in ("mse", "k2"):
        return 0.5 * diff.square()
    if kind in ("low_var_kl", "k3"):
        log_ratio = (-diff).clamp(min=-20.0, max=20.0)  # log(pi_ref / pi)
        return (log_ratio.exp() - log_ratio - 1.0).clamp(min=-10.0, max=10.0)
    raise ValueError(f"unknown KL estimator {kind!r}; valid kinds: {', '.join(KL_KINDS)}")


class FixedKLController:
    """A constant KL coefficient (`algorithm.kl_ctrl.type=fixed`)."""

    def __init__(self, kl_coef: float) -> None:
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Nothing to adapt; present so the trainer treats both controllers alike."""

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])


class AdaptiveKLController:
    """Proportional controller steering the observed KL towards a target (Ziegler et al. 2019,
    arXiv:1909.08593, section 2.2).

    coef <- coef * (1 + clip(KL / target - 1, -0.2, 0.2) * n_steps / horizon): a KL above the target
    raises the penalty, below lowers it; the clip bounds the change per update so one noisy batch
    cannot swing it.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        if target_kl <= 0:
            raise ValueError(f"adaptive KL controller: target_kl must be > 0, got {target_kl}")
        if horizon <= 0:
            raise ValueError(f"adaptive KL controller: horizon must be > 0, got {horizon}")
        self.value = float(init_kl_coef)
        self.target_kl = float(target_kl)
        self.horizon = int(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Adjust the coefficient after a batch of `n_steps` responses whose mean KL was `current_kl`."""
        error = float(np.clip(current_kl / self.target_kl - 1.0, -0.2, 0.2))
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])


KLController = FixedKLController | AdaptiveKLController


def make_kl_controller(kind: str, kl_coef: float, target_kl: float, horizon: int) -> KLController:
    """The controller named by `algorithm.kl_ctrl.type` (`fixed` or `adaptive`)."""
    if kind == "fixed":
        return FixedKLController(kl_coef)
    if kind == "adaptive":
        return AdaptiveKLController(kl_coef, target_kl, horizon)
    raise ValueError(f"unknown KL controller type {kind!r}; valid types: fixed, adaptive")


def apply_kl_penalty(
    token_scores: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    kl_coef: float,
    kind: str,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Token rewards = task scores minus `kl_coef` times the per-token KL (Ziegler et al. 2019).

    Penalising every token (not only the last) gives the critic a dense signal of how far the
    policy drifted.

    Args:
        token_scores: [N, R] task score (usually on the last valid token).
        logprobs: [N, R] logprobs of the policy that sampled (verl uses the old logprobs).
        ref_logprobs: [N, R].
        response_mask: [N, R] 0/1.
        kl_coef: the controller's current value.
        kind: a `kl_estimate` kind (`algorithm.kl_penalty`).

    Returns:
        token_rewards [N, R] (0 outside the mask) and {"reward_kl": mean over responses with at
        least one token of each response's mean KL}; feed `reward_kl` to the controller's update.
    """
    valid = response_mask != 0  # [N, R]
    kl = torch.where(valid, kl_estimate(logprobs, ref_logprobs, kind), 0.0)  # [N, R]
    token_rewards = torch.where(valid, token_scores - kl_coef * kl, 0.0)
    per_seq_kl = masked_mean(kl, valid, dim=-1)  # [N]
    reward_kl = masked_mean(per_seq_kl, valid.any(dim=-1))
    return token_rewards, {"reward_kl": reward_kl.detach()}
