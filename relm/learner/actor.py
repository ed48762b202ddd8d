"""One PPO update of the policy over a step's responses."""

from __future__ import annotations

import functools

import torch
from torch import nn

from relm.algorithms.kl import kl_estimate
from relm.algorithms.losses import AggScale, agg_loss, compute_policy_loss
from relm.algorithms.rollout_correction import bypass_policy_loss
from relm.config.rollout_correction import RolloutCorrection
from relm.config.schema import ActorConfig
from relm.distributed.context import DistContext
from relm.distributed.gathering import Accumulation
from relm.learner.batch import ExperienceBatch
from relm.learner.forward import response_logprobs
from relm.learner.trainee import Trainee
from relm.learner.update_loop import UpdateResult, run_update


def update_actor(
    actor: Trainee,
    batch: ExperienceBatch,
    *,
    temperature: float,
    device: torch.device,
    generator: torch.Generator | None = None,
    dist: DistContext | None = None,
    bypass: RolloutCorrection | None = None,
    first_forward_out: torch.Tensor | None = None,
) -> UpdateResult:
    """`actor.batching.num_epochs` passes of policy-loss updates (plus entropy bonus and optional KL loss).

    Every micro-batch loss is normalised by its mini-batch's token/response counts (`AggScale`), so
    the accumulated gradient equals the mini-batch gradient whatever the micro-batch size, including
    micro-batches formed by token budget (`actor.microbatch.max_tokens`, verl's `use_dynamic_bsz`). With
    `dist` (data parallel, `batch` holding this rank's rows) the counts are those of the global
    mini-batch, so the ranks' summed gradients equal one process's over the whole batch. `temperature`
    divides the logits, as it did when the rollout sampled the responses; `actor.vocab_limit` (the
    tokenizer's length) cuts them as in `response_logprobs`.

    `bypass` (verl's bypass mode): the policy loss is `bypass_policy_loss` against the engine's logprobs, its
    corrections computed per micro-batch. `first_forward_out` ([N, R] on the CPU, on-policy runs): the batch
    has no old logprobs; each micro-batch's own logprobs, detached, stand for them (the update is one pass of
    one mini-batch, so they are the policy's before any step) and are written there for the step's metrics.
    """
    cfg = actor.cfg
    assert isinstance(cfg, ActorConfig)
    assert batch.advantages is not None
    if first_forward_out is None:
        assert batch.old_logprobs is not None, (
            "the old logprobs are computed, or taken from the first forward"
        )
    else:
        world = 1 if dist is None or not dist.is_distributed else dist.world_size
        if actor.batching.num_epochs != 1 or len(batch) > actor.batching.rows_per_minibatch // world:
            raise RuntimeError("old logprobs from the update's forward need one epoch of one mini-batch")
    if cfg.use_kl_loss:
        assert batch.ref_logprobs is not None, "use_kl_loss needs reference logprobs"
    accumulate = functools.partial(
        _accumulate_minibatch,
        model=actor.module,
        batch=batch,
        cfg=cfg,
        temperature=temperature,
        device=device,
        remove_padding=actor.batching.remove_padding,
        vocab_limit=actor.vocab_limit,
        bypass=bypass,
        first_forward_out=first_forward_out,
    )
    return run_update(actor, batch, accumulate, device=device, generator=generator, dist=dist)


def _accumulate_minibatch(
    micros: list[torch.Tensor],
    scale: AggScale,
    accumulation: Accumulation,
    *,
    model: nn.Module,
    batch: ExperienceBatch,
    cfg: ActorConfig,
    temperature: float,
    device: torch.device,
    remove_padding: bool,
    vocab_limit: int | None = None,
    bypass: RolloutCorrection | None = None,
    first_forward_out: torch.Tensor | None = None,
) -> list[dict]:
    """Forward and backward of one mini-batch's micro-batches (`scale` normalises their losses); their metrics."""
    assert cfg.clip_ratio_low is not None and cfg.clip_ratio_high is not None, "the loader fills them"
    collected = []
    for index, micro in enumerate(micros):
        mb = batch.select(micro).to(device)
        logprobs, entropy = response_logprobs(
            model,
            mb.input_ids,
            mb.attention_mask,
            mb.position_ids,
            mb.response_width,
            temperature=temperature,
            compute_entropy=True,
            # entropy_coeff 0 (the default): the entropy is only a metric, kept out of backward
            entropy_grad=cfg.entropy_coeff != 0,
            remove_padding=remove_padding,
            vocab_limit=vocab_limit,
        )
        mask = mb.response_mask
        assert mb.advantages is not None, "set before the update"
        clips = dict(
            clip_ratio_low=cfg.clip_ratio_low,
            clip_ratio_high=cfg.clip_ratio_high,
            clip_ratio_c=cfg.clip_ratio_c,
        )
        if bypass is not None:
            assert mb.rollout_logprobs is not None, "every engine returns the logprobs of what it sampled"
            pg_loss, pg_metrics = bypass_policy_loss(
                cfg.policy_loss.loss_mode, bypass, rollout_logprobs=mb.rollout_logprobs, logprobs=logprobs,
                advantages=mb.advantages, response_mask=mask, loss_agg_mode=cfg.loss_agg_mode, agg_scale=scale,
                **clips,
            )  # fmt: skip
        else:
            if first_forward_out is None:
                assert mb.old_logprobs is not None, "computed before the update"
                old_logprobs = mb.old_logprobs
            else:
                old_logprobs = logprobs.detach()
                first_forward_out[micro] = old_logprobs.float().cpu()
            pg_loss, pg_metrics = compute_policy_loss(
                cfg.policy_loss.loss_mode, old_logprobs=old_logprobs, logprobs=logprobs, advantages=mb.advantages,
                response_mask=mask, loss_agg_mode=cfg.loss_agg_mode, agg_scale=scale,
                rollout_is_weights=mb.rollout_is_weights, **clips,
            )  # fmt: skip
        assert entropy is not None, "asked for with compute_entropy=True"
        entropy_loss = agg_loss(entropy, mask, cfg.loss_agg_mode, scale)
        loss = pg_loss - cfg.entropy_coeff * entropy_loss
        micro_metrics: dict[str, torch.Tensor | float] = {
            "pg_loss": pg_loss.detach(),
            "entropy": entropy_loss.detach(),
            **pg_metrics,
        }
        if cfg.use_kl_loss:
            assert mb.ref_logprobs is not None, "use_kl_loss builds a reference model"
            kl = kl_estimate(logprobs, mb.ref_logprobs, cfg.kl_loss_type)
            kl_loss = agg_loss(kl, mask, cfg.loss_agg_mode, scale)
            loss = loss + cfg.kl_loss_coef * kl_loss
            micro_metrics.update(kl_loss=kl_loss.detach(), kl_coef=cfg.kl_loss_coef)
        accumulation.backward(loss, last=index == len(micros) - 1)
        collected.append(micro_metrics)
    return collected
