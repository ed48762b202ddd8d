"""One PPO update of the policy over a step's responses."""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from relm.algorithms.losses import AggScale
from relm.distributed.context import DistContext
from relm.distributed.gathering import Accumulation
from relm.learner.actor_objective import ActorObjective, PolicyTensors, actor_objective
from relm.learner.batch import Advantaged, UpdateForward
from relm.learner.forward import response_logprobs, response_logprobs_at
from relm.learner.trainee import Trainee
from relm.learner.update_loop import MicroStep, UpdateResult, run_update
from relm.memory.host_allocator import release_heap_fragments


def update_actor(
    actor: Trainee,
    batch: Advantaged,
    objective: ActorObjective,
    *,
    temperature: float,
    device: torch.device,
    rng: torch.Generator | None = None,
    dist: DistContext | None = None,
) -> UpdateResult:
    """`actor.batching.num_epochs` passes of `objective` (policy loss, entropy bonus, optional KL loss).

    Every micro-batch loss is normalised by its mini-batch's token/response counts (`AggScale`), so
    the accumulated gradient equals the mini-batch gradient whatever the micro-batch size, including
    micro-batches formed by token budget (`actor.microbatch.max_tokens`, verl's `use_dynamic_bsz`). With
    `dist` (data parallel, `batch` holding this rank's rows) the counts are those of the global
    mini-batch, so the ranks' summed gradients equal one process's over the whole batch. `temperature`
    divides the logits, as it did when the rollout sampled the responses; `actor.vocab_limit` (the
    tokenizer's length) cuts them as in `response_logprobs`. `rng` shuffles the mini-batches.

    On-policy (`UpdateForward` old logprobs) the update must be one pass of one mini-batch: each
    micro-batch's own logprobs then stand for the old ones, and the result's `first_forward` holds them.
    """
    if isinstance(batch.annotated.old_logprobs, UpdateForward):
        world = 1 if dist is None or not dist.is_distributed else dist.world_size
        if actor.batching.num_epochs != 1 or len(batch) > actor.batching.rows_per_minibatch // world:
            raise RuntimeError("old logprobs from the update's forward need one epoch of one mini-batch")
    accumulate = functools.partial(
        _accumulate_minibatch,
        model=actor.module,
        batch=batch,
        objective=objective,
        temperature=temperature,
        device=device,
        remove_padding=actor.batching.remove_padding,
        vocab_limit=actor.vocab_limit,
    )
    return run_update(actor, batch, accumulate, device=device, rng=rng, dist=dist)


def _accumulate_minibatch(
    micros: list[torch.Tensor],
    scale: AggScale,
    accumulation: Accumulation,
    *,
    model: nn.Module,
    batch: Advantaged,
    objective: ActorObjective,
    temperature: float,
    device: torch.device,
    remove_padding: bool,
    vocab_limit: int | None,
) -> list[MicroStep]:
    """Forward, objective and backward of each of a mini-batch's micro-batches (`scale` normalises their losses)."""
    steps = []
    for index, micro in enumerate(micros):
        mb = batch.select(micro).to(device)
        rollout = mb.rollout
        topk = mb.annotated.teacher_topk
        forward: dict[str, Any] = dict(
            temperature=temperature,
            compute_entropy=True,
            # entropy_coeff 0 (the default): the entropy is only a metric, kept out of backward
            entropy_grad=objective.entropy_coeff != 0,
            vocab_limit=vocab_limit,
        )
        student_topk = None
        if topk is None:
            logprobs, entropy = response_logprobs(
                model, rollout.input_ids, rollout.attention_mask, rollout.position_ids, rollout.response_width,
                remove_padding=remove_padding, **forward,
            )  # fmt: skip
        else:  # forward_kl_topk: the same forward also gives the student's logprobs at the teacher's top ids
            logprobs, entropy, student_topk = response_logprobs_at(
                model, rollout.input_ids, rollout.attention_mask, rollout.position_ids, rollout.response_width,
                topk.ids, **forward,
            )  # fmt: skip
        assert entropy is not None, "asked for with compute_entropy=True"
        tensors = policy_tensors(mb)
        loss, metrics = actor_objective(
            logprobs, entropy, tensors, objective, scale, student_topk=student_topk
        )
        accumulation.backward(loss, last=index == len(micros) - 1)
        steps.append(MicroStep(rows=micro, metrics=metrics, forward=logprobs.detach().float().cpu()))
        release_heap_fragments()  # a CPU run's kept heap, bounded between micro-batches
    return steps


def policy_tensors(batch: Advantaged) -> PolicyTensors:
    """What `actor_objective` reads of a (micro-)batch."""
    return PolicyTensors(
        loss_mask=batch.loss_mask,
        advantages=batch.advantages,
        old_logprobs=batch.annotated.old_logprobs,
        ref_logprobs=batch.annotated.ref_logprobs,
        rollout_is_weights=batch.rollout_is_weights,
        teacher_logprobs=batch.annotated.teacher_logprobs,
        teacher_topk_logprobs=None
        if batch.annotated.teacher_topk is None
        else batch.annotated.teacher_topk.logprobs,
    )
