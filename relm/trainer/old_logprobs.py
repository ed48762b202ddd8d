"""Where a step's old logprobs come from, and the rollout correction that compares them with the engine's.

Three sources, decided once from the config (`old_logprob_source`):

- `engine`: verl's bypass mode: the engine's logprobs are the old ones; no actor forward, and the
  corrections act in the loss (`relm.algorithms.rollout_correction.bypass_policy_loss`).
- `update`: on-policy, the old logprobs are the current policy's at the update's first (only) pass:
  one epoch, one mini-batch a step (`ppo_mini_batch_size == train_batch_size`), and nothing reads them
  before the update (no KL in the reward, no importance weights or rejection). The forward that would
  compute them is skipped and the update's own forward, detached, stands for them (verl 0.5's
  `on_policy` in dp_actor.py, verl PR #3119, without the wasted forward its trainer still ran: verl
  issue #3996). The ratio is then exactly 1 at that pass, where a separate forward differs from it by
  rounding (bf16 kernels, other batch shapes).
- `actor`: otherwise, a no-grad actor forward before the update (decoupled mode: the corrections are
  computed once for the batch from these and the engine's logprobs, before the advantages).
"""

from __future__ import annotations

from typing import Literal

import torch

from relm.algorithms.rollout_correction import correct, offpolicy_metrics
from relm.config.rollout_correction import RolloutCorrection, parse_rollout_correction
from relm.config.schema import RelmConfig
from relm.learner.batch import ExperienceBatch

OldLogprobSource = Literal["actor", "engine", "update"]

ON_POLICY_MESSAGE = "old logprobs: taken from the update's first forward (on-policy)"


def old_logprob_source(cfg: RelmConfig) -> OldLogprobSource:
    """Which logprobs the update treats as old (see the module docstring)."""
    correction = parse_rollout_correction(cfg.algorithm.rollout_correction)
    if correction.bypass:
        return "engine"
    actor = cfg.actor_rollout_ref.actor
    one_pass = actor.ppo_epochs == 1 and actor.ppo_mini_batch_size >= cfg.data.train_batch_size
    read_before_update = cfg.algorithm.use_kl_in_reward or correction.changes_update
    return "update" if one_pass and not read_before_update else "actor"


def apply_rollout_correction(
    batch: ExperienceBatch, spec: RolloutCorrection, metrics: dict[str, float]
) -> None:
    """Decoupled mode: importance weights into `batch.rollout_is_weights`, rejection out of `batch.response_mask`
    (attention keeps every token: the model still reads a rejected one), the `rollout_corr/` metrics.

    Called before the advantages, as verl does, so a rejected token leaves GAE's and the critic's masks too.
    """
    assert batch.old_logprobs is not None and batch.rollout_logprobs is not None, "both logprobs are in"
    if not batch.response_mask.any():
        return  # nothing sampled to compare (verl raises here)
    corrected = correct(batch.old_logprobs, batch.rollout_logprobs, batch.response_mask, spec)
    metrics.update({name: float(value) for name, value in corrected.metrics.items()})
    batch.rollout_is_weights = corrected.weights
    if spec.rejection:
        batch.response_attention_mask = batch.response_tokens
        batch.response_mask = corrected.response_mask


def gap_metrics(batch: ExperienceBatch, with_offpolicy: bool) -> dict[str, float]:
    """`rollout/logprob_diff_max|mean` (the engine's logprobs against the trainer's, docs/rollout.md) and, with
    `with_offpolicy`, verl's `rollout_corr/` gap metrics (which `apply_rollout_correction` logs otherwise)."""
    assert batch.old_logprobs is not None and batch.rollout_logprobs is not None, "both logprobs are in"
    valid = batch.response_mask.bool()
    diff = (batch.old_logprobs - batch.rollout_logprobs).abs()[valid]
    if not diff.numel():
        return {}
    metrics = {"rollout/logprob_diff_max": diff.max().item(), "rollout/logprob_diff_mean": diff.mean().item()}
    if with_offpolicy:
        gap = offpolicy_metrics(batch.old_logprobs, batch.rollout_logprobs, batch.response_mask)
        metrics.update({f"rollout_corr/{name}": float(value) for name, value in gap.items()})
    return metrics


def empty_like_responses(batch: ExperienceBatch) -> torch.Tensor:
    """[N, R] fp32 zeros on the CPU for the update to write its first forward's logprobs into."""
    return torch.zeros(len(batch), batch.response_width)
