"""Where a step's old logprobs come from, and the rollout correction that compares them with the engine's.

Three sources, decided once from the config (`old_logprob_source`):

- `engine`: verl's bypass mode: the engine's logprobs are the old ones; no actor forward, and the
  corrections act in the loss (`relm.algorithms.rollout_correction.bypass_policy_loss`).
- `update`: on-policy, the old logprobs are the current policy's at the update's first (only) pass:
  one epoch, one mini-batch a step (`ppo_mini_batch_size == train_batch_size`), and nothing reads them
  before the update (no KL in the reward, no importance weights or rejection, no optimal token baseline). The forward that would
  compute them is skipped and the update's own forward, detached, stands for them (verl 0.5's
  `on_policy` in dp_actor.py, verl PR #3119, without the wasted forward its trainer still ran: verl
  issue #3996). The ratio is then exactly 1 at that pass, where a separate forward differs from it by
  rounding (bf16 kernels, other batch shapes).
- `actor`: otherwise, a no-grad actor forward before the update (decoupled mode: the corrections are
  computed once for the batch from these and the engine's logprobs, before the advantages).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from relm.algorithms.advantages import estimator_needs
from relm.algorithms.rollout_correction import correct, offpolicy_metrics
from relm.config.rollout_correction import RolloutCorrection
from relm.config.specs import RunSpec
from relm.learner.batch import Rollout

OldLogprobSource = Literal["actor", "engine", "update"]

ON_POLICY_MESSAGE = "old logprobs: taken from the update's first forward (on-policy)"


def old_logprob_source(spec: RunSpec) -> OldLogprobSource:
    """Which logprobs the update treats as old (see the module docstring)."""
    correction = spec.algorithm.rollout_correction
    if correction.bypass:
        return "engine"
    update = spec.actor.update
    one_pass = update.num_epochs == 1 and update.prompts_per_minibatch >= spec.data.prompts_per_step
    read_before_update = (
        spec.algorithm.use_kl_in_reward
        or correction.changes_update
        or estimator_needs(spec.algorithm.adv_estimator).sum_pi_squared  # the optimal token baselines
    )
    return "update" if one_pass and not read_before_update else "actor"


@dataclass(frozen=True)
class Correction:
    """What decoupled mode's rollout correction gives a batch (`rollout_correction`)."""

    loss_mask: torch.Tensor
    """[N, R] the sampled tokens less the rejected ones (all of them without `rollout_rs`)."""
    weights: torch.Tensor | None
    """[N, R] importance weights; absent without `rollout_is`."""
    metrics: dict[str, float]
    """verl's `rollout_corr/` metrics."""


def rollout_correction(old_logprobs: torch.Tensor, rollout: Rollout, spec: RolloutCorrection) -> Correction:
    """Decoupled mode: importance weights and rejection from the actor's old logprobs [N, R] against the
    engine's. Rejection leaves a token out of the loss mask only: the model still attends to it.

    Called before the advantages, as verl does, so a rejected token leaves GAE's and the critic's masks too.
    """
    if not rollout.response_mask.any():  # nothing sampled to compare (verl raises here)
        return Correction(loss_mask=rollout.response_mask, weights=None, metrics={})
    corrected = correct(old_logprobs, rollout.rollout_logprobs, rollout.response_mask, spec)
    return Correction(
        loss_mask=corrected.response_mask if spec.rejection else rollout.response_mask,
        weights=corrected.weights,
        metrics={name: float(value) for name, value in corrected.metrics.items()},
    )


def gap_metrics(old_logprobs: torch.Tensor, rollout: Rollout, with_offpolicy: bool) -> dict[str, float]:
    """`rollout/logprob_diff_max|mean` (the engine's logprobs against the trainer's `old_logprobs` [N, R],
    docs/rollout.md) and, with `with_offpolicy`, verl's `rollout_corr/` gap metrics (which
    `rollout_correction` gives otherwise)."""
    valid = rollout.response_mask.bool()
    diff = (old_logprobs - rollout.rollout_logprobs).abs()[valid]
    if not diff.numel():
        return {}
    metrics = {"rollout/logprob_diff_max": diff.max().item(), "rollout/logprob_diff_mean": diff.mean().item()}
    if with_offpolicy:
        gap = offpolicy_metrics(old_logprobs, rollout.rollout_logprobs, rollout.response_mask)
        metrics.update({f"rollout_corr/{name}": float(value) for name, value in gap.items()})
    return metrics
