"""The PPO loop: generate, score, annotate, estimate advantages, update, sync. Read top to bottom.

One step, as data flows (shapes: N = train_batch_size * rollout.n responses, R = max_response_length):

    prompts ──engine.generate──▶ responses [N, R] ──reward──▶ token_scores [N, R]
      ──actor / ref / critic forward──▶ old_logprobs, ref_logprobs, values [N, R]
      ──KL penalty──▶ token_rewards ──estimator──▶ advantages, returns [N, R]
      ──critic update, actor update──▶ new weights ──engine.sync_weights──▶ next step
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from relm.algorithms.advantages import compute_advantages, estimator_needs
from relm.algorithms.kl import KLController, apply_kl_penalty
from relm.config.specs import AlgorithmSpec
from relm.data.prompt_batch import PromptBatch
from relm.errors import UserError
from relm.learner.actor import update_actor
from relm.learner.batch import (
    ActorForward,
    Advantaged,
    Annotated,
    EngineLogprobs,
    OldLogprobs,
    Rollout,
    Scored,
    TeacherTopK,
    UpdateForward,
)
from relm.learner.critic import update_critic
from relm.rollout.watchdog import engine_stage
from relm.trainer.async_rollout import AsyncRollout
from relm.trainer.collect import collect_experience
from relm.trainer.components import RunComponents
from relm.trainer.data_parallel import gather_rows, local_rows, on_rank_rows, rank_rows, reduce_update_metrics
from relm.trainer.experience import (
    batched_logprobs,
    batched_logprobs_and_sum_pi_squared,
    batched_topk,
    batched_values,
    unpack_topk,
)
from relm.trainer.flops import peak_flops, training_flops
from relm.trainer.metrics import (
    data_metrics,
    mean_of_lists,
    memory_metrics,
    plan_metrics,
)
from relm.trainer.objectives import actor_objective_of, critic_objective_of
from relm.trainer.old_logprobs import gap_metrics, old_logprob_source, rollout_correction
from relm.trainer.run import Run
from relm.trainer.samples import dump_rollout
from relm.trainer.teachers import teacher_scores

logger = logging.getLogger("relm")


@contextlib.contextmanager
def timed(metrics: dict[str, float], name: str) -> Iterator[None]:
    """Record the wall time of a phase as `timing_s/<name>`."""
    start = time.perf_counter()
    yield
    metrics[f"timing_s/{name}"] = time.perf_counter() - start


def ppo_step(c: RunComponents, prompts: PromptBatch, step: int) -> dict[str, float]:
    """One full step on one batch of prompts; returns the step's metrics under verl's names."""
    metrics: dict[str, float] = {}
    step_start = time.perf_counter()

    with (
        timed(metrics, "gen"),
        c.residency.phase("generate"),
        engine_stage(c.engine, f"rollout of step {step}"),
    ):
        # Generation and scoring (and DAPO's resampling rounds) are one phase; scoring is cheap beside it.
        scored = collect_experience(c.experience_sources, prompts, step, metrics)
        if c.spec.engine.free_cache_engine:
            c.engine.release_memory()
    return learn(c, scored, step, metrics, step_start)


def async_step(c: RunComponents, rollout: AsyncRollout, step: int) -> dict[str, float]:
    """One step of an asynchronous run: the rollout process's batch for `step` (generated ahead, within the
    staleness bound), learned from as `ppo_step` learns; then the new weights go to the rollout process."""
    step_start = time.perf_counter()
    batch, metrics = rollout.take(step)
    metrics = learn(c, batch.scored, step, metrics, step_start)
    rollout.send_weights(step)
    return metrics


def learn(
    c: RunComponents, scored: Scored, step: int, metrics: dict[str, float], step_start: float
) -> dict[str, float]:
    """Everything after the rollout phase: annotate, estimate advantages, update; `metrics` (the rollout
    phase's) completed with the step's."""
    if c.dist.is_main and c.spec.loop.rollout_data_dir:
        dump_rollout(c.spec.loop.rollout_data_dir, c.tokenizer, scored, step)  # every rank holds every row

    # Forward and backward passes compute in bf16 on a GPU; weights and optimizer states stay fp32.
    # There the layers' norms, MLPs and rotary embeddings also run as compiled, fused kernels.
    with c.precision.autocast(), c.fused.applied():
        annotated, annotate_metrics = annotate(c, scored)
        metrics.update(annotate_metrics)
        with timed(metrics, "adv"):
            batch, advantage_metrics = estimate_advantages(c.spec.algorithm, c.kl_ctrl, annotated)
        metrics.update(advantage_metrics)
        skipped, update_metrics = update_models(c, batch, step)
        metrics.update(update_metrics)
    if skipped:
        logger.warning(
            "step %d: %d optimizer update(s) skipped for a non-finite gradient norm", step, skipped
        )
    metrics["training/skipped_updates"] = float(skipped)

    metrics["timing_s/step"] = time.perf_counter() - step_start
    metrics.update(perf_metrics(c, batch.rollout, metrics))
    metrics.update(data_metrics(batch))
    metrics.update(memory_metrics(c.device))
    metrics.update(plan_metrics(c.memory, c.actor.microbatch.largest_tokens))
    return metrics


def annotate(c: RunComponents, scored: Scored) -> tuple[Annotated, dict[str, float]]:
    """Old logprobs (actor), reference and teacher logprobs and values, each in forward passes of a few rows;
    their metrics.

    Data-parallel, each rank computes them for its own rows and every rank gets them for all rows.
    """
    metrics: dict[str, float] = {}
    rollout = scored.rollout
    rows = rank_rows(rollout, c.dist, c.trainees, balance=c.spec.loop.balance_batch)
    actor = c.actor
    # The actor's token budget (made smaller by an update that ran out of memory) also cuts the
    # reference's forwards: the two models have one shape.
    logprobs: dict[str, Any] = dict(
        temperature=c.sizes.logprob_temperature,
        device=c.device,
        remove_padding=actor.batching.remove_padding,
        max_tokens_per_forward=actor.microbatch.max_tokens,
        dist=c.dist,
        vocab_limit=len(c.tokenizer),  # the engines never sample past the tokenizer's ids
    )
    old_logprobs: OldLogprobs
    source = old_logprob_source(c.spec)  # relm.trainer.old_logprobs says which and why
    if source == "engine":
        # verl's bypass mode: the engine's logprobs stand for the old policy's; no actor forward, so no
        # gap to measure here (the update's rollout_corr/ metrics and actor/ppo_kl show it instead).
        old_logprobs = EngineLogprobs(rollout.rollout_logprobs)
    elif source == "update":
        old_logprobs = UpdateForward()  # on-policy: the update's first forward stands for them
    else:
        # The optimal token baselines also read each position's sum of squared probabilities, from the same forwards.
        with_squares = estimator_needs(c.spec.algorithm.adv_estimator).sum_pi_squared
        forward = batched_logprobs_and_sum_pi_squared if with_squares else batched_logprobs
        with timed(metrics, "old_log_prob"), c.residency.phase("old_log_prob"):
            outputs = on_rank_rows(
                c.dist,
                rollout,
                rows,
                lambda b: forward(
                    actor.module, b, rows_per_forward=actor.batching.rows_per_forward, **logprobs
                ),
            )
        computed = outputs[..., 0].contiguous() if with_squares else outputs  # [N, R]
        squares = outputs[..., 1].contiguous() if with_squares else None
        old_logprobs = ActorForward(computed, sum_pi_squared=squares)
        metrics.update(gap_metrics(computed, rollout, with_offpolicy=False))
    ref_logprobs = None
    reference = c.reference()
    if reference is not None:
        with timed(metrics, "ref"), c.residency.phase("reference"), reference as ref:
            ref_logprobs = on_rank_rows(
                c.dist,
                rollout,
                rows,
                lambda b: batched_logprobs(ref, b, rows_per_forward=c.sizes.rows_per_ref_forward, **logprobs),
            )
    teacher, teacher_topk = None, None
    if c.teachers is not None:
        with timed(metrics, "teacher"), c.residency.phase("teacher"):
            teacher, teacher_topk = _teacher_annotations(c, rollout, rows, logprobs)
    values = None
    critic = c.critic
    if critic is not None:
        with timed(metrics, "values"), c.residency.phase("values"):
            values = on_rank_rows(
                c.dist,
                rollout,
                rows,
                lambda b: batched_values(
                    critic.module,
                    b,
                    rows_per_forward=critic.batching.rows_per_forward,
                    device=c.device,
                    remove_padding=critic.batching.remove_padding,
                    max_tokens_per_forward=critic.microbatch.max_tokens,
                    dist=c.dist,
                ),
            )
    annotated = Annotated(
        scored=scored, old_logprobs=old_logprobs, ref_logprobs=ref_logprobs, values=values,
        teacher_logprobs=teacher, teacher_topk=teacher_topk,
    )  # fmt: skip
    return annotated, metrics


def _teacher_annotations(
    c: RunComponents, rollout: Rollout, rows: torch.Tensor | None, logprobs: dict[str, Any]
) -> tuple[torch.Tensor | None, TeacherTopK | None]:
    """The teachers' logprobs of the sampled tokens, or (`forward_kl_topk`) their top-k ids and logprobs.

    At temperature 1 (verl asks its teacher servers for prompt logprobs, which no temperature touches);
    the teachers are whole on every rank, so each scores its rank's rows with no collective."""
    teachers, distill = c.teachers, c.spec.distillation
    assert teachers is not None
    forward = dict(logprobs, temperature=1.0, dist=None)

    def sampled(model: nn.Module, sub: Rollout) -> torch.Tensor:
        return batched_logprobs(model, sub, rows_per_forward=c.sizes.rows_per_ref_forward, **forward)

    if distill.topk is None:
        return on_rank_rows(c.dist, rollout, rows, lambda b: teacher_scores(teachers, b, sampled)), None
    k = distill.topk

    def top(model: nn.Module, sub: Rollout) -> torch.Tensor:
        return batched_topk(
            model, sub, k, rows_per_forward=c.sizes.rows_per_ref_forward, device=c.device,
            max_tokens_per_forward=forward["max_tokens_per_forward"], vocab_limit=forward["vocab_limit"],
        )  # fmt: skip

    return None, unpack_topk(on_rank_rows(c.dist, rollout, rows, lambda b: teacher_scores(teachers, b, top)))


def estimate_advantages(
    algo: AlgorithmSpec, kl_ctrl: KLController, annotated: Annotated
) -> tuple[Advantaged, dict[str, float]]:
    """Token rewards (scores minus the in-reward KL penalty, if any), the loss mask (less the tokens the rollout
    correction rejects), then advantages and returns; the metrics of each."""
    metrics: dict[str, float] = {}
    rollout, token_scores, old = annotated.rollout, annotated.scored.token_scores, annotated.old_logprobs
    if algo.use_kl_in_reward:
        if isinstance(old, UpdateForward) or annotated.ref_logprobs is None:
            raise RuntimeError(
                "a KL penalty in the reward needs old logprobs before the update and a reference"
            )
        token_rewards, kl_metrics = apply_kl_penalty(
            token_scores, old.logprobs, annotated.ref_logprobs, rollout.response_mask,
            kl_ctrl.value, algo.kl_penalty,
        )  # fmt: skip
        metrics["actor/reward_kl_penalty"] = float(kl_metrics["reward_kl"])
        metrics["actor/reward_kl_penalty_coeff"] = kl_ctrl.value
        kl_ctrl.update(float(kl_metrics["reward_kl"]), n_steps=len(annotated))
    else:
        token_rewards = token_scores
    if isinstance(old, ActorForward):  # verl's decoupled mode
        # parsed once, by relm.config.translate
        correction = rollout_correction(old.logprobs, rollout, algo.rollout_correction)
        loss_mask, weights = correction.loss_mask, correction.weights
        metrics.update(correction.metrics)
    else:
        loss_mask, weights = rollout.response_mask, None
    advantages, returns = compute_advantages(
        algo.adv_estimator,
        token_rewards=token_rewards,
        response_mask=loss_mask,
        sampled_mask=rollout.response_mask,
        values=annotated.values,
        group_ids=rollout.group_ids,
        gamma=algo.gamma,
        lam=algo.lam,
        norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo,
        baseline_scores=annotated.scored.baseline_scores,
        old_logprobs=old.logprobs if isinstance(old, ActorForward) else None,
        sum_pi_squared=old.sum_pi_squared if isinstance(old, ActorForward) else None,
        rollout_is_weights=weights,
        **(
            _score_components(annotated.scored, algo)
            if estimator_needs(algo.adv_estimator).score_components
            else {}
        ),
    )
    advantaged = Advantaged(
        annotated=annotated,
        token_rewards=token_rewards,
        loss_mask=loss_mask,
        rollout_is_weights=weights,
        advantages=advantages,
        returns=returns,
    )
    return advantaged, metrics


def _score_components(scored: Scored, algo: AlgorithmSpec) -> dict[str, torch.Tensor | None]:
    """GDPO's inputs: the reward function's numbers under `algorithm.gdpo_reward_keys` ([K, N], float32 as
    verl reads them) and their weights ([K] or None).

    Raises:
        UserError: a key the reward function did not return for every response (a row that left it out
            carries NaN in `reward_extras`).
    """
    rows = scored.reward_extras
    values = torch.tensor(
        [[row.get(key, math.nan) for row in rows] for key in algo.gdpo_reward_keys], dtype=torch.float32
    )
    for key, column in zip(algo.gdpo_reward_keys, values, strict=True):
        if not bool(torch.isfinite(column).all()):
            returned = sorted(rows[0]) if rows else []
            raise UserError(
                f"`algorithm.gdpo_reward_keys` names `{key}`, which the reward function did not return as a finite "
                f"number for every response (its dict keys: {', '.join(returned) or 'none'}); return `{key}` "
                "beside `score` or drop it from the list"
            )
    device = scored.token_scores.device
    weights = algo.gdpo_reward_weights
    return {
        "score_components": values.to(device),
        "score_weights": None
        if weights is None
        else torch.tensor(weights, dtype=torch.float32, device=device),
    }


def update_models(c: RunComponents, batch: Advantaged, step: int) -> tuple[int, dict[str, float]]:
    """Critic update, then (after `trainer.critic_warmup` steps) actor update and weight sync.

    Data-parallel, each rank updates with its own rows (`rank_rows`), a 1/world share of every
    mini-batch, and the sharded models sum the ranks' gradients. An update that runs out of GPU
    memory leaves its trainee's micro-batches smaller for the rest of the run (`Trainee.microbatch`).

    Returns:
        How many optimizer steps were skipped for a non-finite gradient norm, and the updates' metrics.
    """
    metrics: dict[str, float] = {}
    skipped = 0
    rows = rank_rows(batch.rollout, c.dist, c.trainees, balance=c.spec.loop.balance_batch)
    mine = local_rows(batch, rows)
    shared: dict[str, Any] = dict(device=c.device, rng=c.generator, dist=c.dist)
    if c.critic is not None:
        with timed(metrics, "update_critic"), c.residency.phase("update_critic"):
            result = update_critic(c.critic, mine, critic_objective_of(c.spec), **shared)
        metrics.update(mean_of_lists(reduce_update_metrics(result.metrics, c.dist)))
        skipped += result.num_skipped_updates
    if step > c.spec.loop.critic_warmup:
        with timed(metrics, "update_actor"), c.residency.phase("update_actor"):
            result = update_actor(
                c.actor, mine, actor_objective_of(c.spec), temperature=c.sizes.logprob_temperature, **shared
            )
        metrics.update(mean_of_lists(reduce_update_metrics(result.metrics, c.dist)))
        if isinstance(batch.annotated.old_logprobs, UpdateForward):
            # on-policy: the gap to the engine, measured on the update's forward
            first_forward = gather_rows(c.dist, len(batch), rows, result.first_forward)
            metrics.update(gap_metrics(first_forward, batch.rollout, with_offpolicy=True))
        skipped += result.num_skipped_updates
        with timed(metrics, "sync"), c.residency.phase("sync"):
            c.engine.sync_weights(c.weight_sync.tensors())
            c.weight_sync.verify()
    return skipped, metrics


def perf_metrics(c: RunComponents, batch: Rollout, metrics: dict[str, float]) -> dict[str, float]:
    """Throughput over the whole step (verl's `perf/throughput`, per GPU) and actor MFU where the peak is known."""
    trainer = c.spec.loop
    num_tokens = int(batch.attention_mask.sum())
    perf = {
        "perf/total_num_tokens": float(num_tokens),
        "perf/throughput": num_tokens
        / metrics["timing_s/step"]
        / max(1, trainer.n_gpus_per_node * trainer.nnodes),
    }
    peak = peak_flops(c.device)
    if peak is not None and "timing_s/update_actor" in metrics:
        seq_lens = batch.attention_mask.sum(-1).tolist()
        flops = training_flops(c.actor.module, seq_lens, c.actor.batching.num_epochs)  # type: ignore[arg-type]  # the actor's module is an HF causal LM
        # FLOPs of the whole batch, done by every rank together.
        perf["perf/mfu/actor"] = flops / metrics["timing_s/update_actor"] / (peak * c.dist.world_size)
    return perf


@contextlib.contextmanager
def _rollout_process(c: RunComponents, run: Run) -> Iterator[AsyncRollout | None]:
    """With `async_training.enable`, the rollout process that generates the run's remaining steps; else None."""
    if not c.spec.asynchronous.enabled:
        yield None
        return
    with AsyncRollout.start(c, first_step=run.start + 1, last_step=run.total) as rollout:
        yield rollout


def train(c: RunComponents) -> None:
    """Run `total_training_steps` steps, logging every step and saving every `save_freq` (`Run` does all but
    the steps).

    SIGTERM or SIGINT stops the run after the step in progress, with a checkpoint of that step and
    exit code 0 (a second signal aborts at once; see `trainer/signals.py`). More than
    `trainer.max_skipped_steps` steps in a row with skipped updates raise `TrainingDiverged`.

    Data-parallel, every rank runs this loop on the same prompts (see `relm.trainer.data_parallel`).
    Asynchronous (`async_training.enable`), a rollout process generates the steps' batches ahead
    (`relm.trainer.async_rollout`).
    """
    run = Run.open(c)
    if run is None:  # resumed a finished run
        return
    if c.spec.loop.val_only:
        run.validate_only()
        return
    with run.running() as stop, _rollout_process(c, run) as rollout:
        for step in range(run.start + 1, run.total + 1):
            if c.dist.any_true(stop.requested):
                break
            run.begin_step(step)
            if rollout is None:
                metrics = ppo_step(c, c.loader.next_batch(), step)
            else:
                metrics = async_step(c, rollout, step)
            run.end_step(step, metrics)
    run.report_end()
