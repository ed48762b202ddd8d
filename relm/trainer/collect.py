"""The rollout phase of a step: generate, score, shape, and (DAPO) resample until the batch is full."""

from __future__ import annotations

import logging
from dataclasses import replace

import torch

from relm.algorithms.advantages import estimator_needs
from relm.algorithms.filtering import groups_with_variance
from relm.data.prompt_batch import PromptBatch
from relm.errors import UserError
from relm.learner.batch import Rollout, Scored
from relm.rewards.manager import RewardResult, place_on_last_token
from relm.rewards.model_reward import score_with_reward_model
from relm.rewards.shaping import overlong_penalty
from relm.rollout.base import GenerationOutput, SamplingParams
from relm.rollout.multi_turn.conversations import row_kwargs
from relm.trainer.components import ExperienceSources
from relm.trainer.experience import build_rollout

logger = logging.getLogger("relm")

SCORE_METRICS = ("score", "seq_reward", "seq_final_reward")
"""`algorithm.filter_groups.metric` values that mean the response's total score."""


def sampling_params(c: ExperienceSources, step: int, round_index: int = 0) -> SamplingParams:
    """This step's sampling; the seed comes from (seed, step, round) so a resumed run samples the same."""
    sampling = c.spec.engine.sampling
    return SamplingParams(
        seed=c.spec.loop.seed * 1_000_003 + step * 1_000 + round_index,
        n=sampling.n,
        max_new_tokens=c.spec.data.max_response_length,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        do_sample=sampling.do_sample,
        ignore_eos=c.spec.engine.ignore_eos,
    )


def _reward(c: ExperienceSources, batch: Rollout, prompts: PromptBatch, n: int) -> RewardResult:
    """Scores of whole responses (a multi-turn conversation's tool results included, as verl scores
    them), each placed on the last token the model sampled."""
    if c.reward_model is not None:
        scored = score_with_reward_model(
            c.reward_model,
            c.reward,
            c.tokenizer,
            sequences=[
                ids[mask.bool()].tolist()
                for ids, mask in zip(batch.input_ids, batch.attention_mask, strict=True)
            ],
            messages=[messages for messages in prompts.raw_prompts for _ in range(n)],
            response_ids=batch.response_ids,
            response_mask=batch.response_attention_mask,
            data_sources=batch.data_sources,
            ground_truths=batch.ground_truths,
            extra_infos=batch.extra_infos,
            custom_function=c.spec.reward.custom_function_path is not None,
        )
    else:
        scored = c.reward(
            batch.response_ids,
            batch.response_attention_mask,
            batch.data_sources,
            batch.ground_truths,
            batch.extra_infos,
        )
    if not torch.equal(batch.response_attention_mask, batch.response_mask):  # tool results in the responses
        return replace(scored, token_scores=place_on_last_token(scored.scores, batch.response_mask))
    return scored


def _generate(
    c: ExperienceSources,
    prompts: PromptBatch,
    params: SamplingParams,
    metrics: dict[str, float] | None = None,
) -> GenerationOutput:
    """The engine's responses, or with `rollout.multi_turn.enable` whole conversations with tools
    (their statistics into `metrics`)."""
    if c.multi_turn is None:
        return c.engine.generate(prompts.prompt_ids, params)
    out = c.multi_turn.generate(
        prompts.prompt_ids,
        params,
        **row_kwargs(prompts.extra_infos),
        # verl's interactions read the chat so far; the prompt's messages are kept whatever data.return_raw_chat.
        messages=prompts.raw_prompts or [c.loader.dataset[i]["raw_prompt"] for i in prompts.indices],
    )
    if metrics is not None:
        metrics.update(out.metrics)
    return out.generation


def _greedy_baseline(c: ExperienceSources, prompts: PromptBatch, n: int) -> torch.Tensor:
    """ReMax's baseline: the score of one greedy response per prompt, repeated for its `n` samples."""
    params = SamplingParams(n=1, max_new_tokens=c.spec.data.max_response_length, do_sample=False)
    greedy = build_rollout(prompts, _generate(c, prompts, params), n=1, pad_token_id=c.tokenizer.pad_token_id)
    return _reward(c, greedy, prompts, 1).scores.repeat_interleave(n)


def generate_and_score(
    c: ExperienceSources,
    prompts: PromptBatch,
    params: SamplingParams,
    group_offset: int = 0,
    metrics: dict[str, float] | None = None,
) -> tuple[Scored, dict[str, torch.Tensor]]:
    """One generation round: the scored responses, and the reward function's extras per row."""
    gen = _generate(c, prompts, params, metrics)
    rollout = build_rollout(
        prompts, gen, n=params.n, pad_token_id=c.tokenizer.pad_token_id, group_offset=group_offset
    )
    return score(c, rollout, prompts, params.n)


def score(
    c: ExperienceSources, rollout: Rollout, prompts: PromptBatch, n: int
) -> tuple[Scored, dict[str, torch.Tensor]]:
    """The `Scored` record of a rollout (DAPO's overlong penalty included, ReMax's greedy baseline where the
    estimator reads it), and the reward function's extras per row."""
    scored = _reward(c, rollout, prompts, n)
    extras = {name: torch.tensor(values, dtype=torch.float32) for name, values in scored.extra.items()}
    token_scores = scored.token_scores
    if "acc" not in extras:  # as verl's naive and DAPO managers do, a plain float score is also `acc`
        extras["acc"] = token_scores.sum(-1)
    overlong = c.spec.reward.overlong
    if overlong.enable:
        penalty = overlong_penalty(
            rollout.response_attention_mask.sum(-1),
            max_response_length=c.spec.reward.max_response_length,
            buffer_len=overlong.length,
            penalty_factor=overlong.penalty_factor,
        )
        token_scores = token_scores + place_on_last_token(penalty, rollout.response_mask)
        extras["overlong_penalty"] = penalty
    baseline = (
        _greedy_baseline(c, prompts, n)
        if estimator_needs(c.spec.algorithm.adv_estimator).greedy_baseline
        else None
    )
    record = Scored(
        rollout=rollout,
        token_scores=token_scores,
        reward_extras=[{k: float(v[row]) for k, v in extras.items()} for row in range(len(rollout))],
        baseline_scores=baseline,
    )
    return record, extras


def _filter_values(batch: Scored, extras: dict[str, torch.Tensor], metric: str) -> torch.Tensor:
    if metric in SCORE_METRICS:
        return batch.token_scores.sum(-1)
    if metric not in extras:
        raise UserError(
            f"`algorithm.filter_groups.metric={metric}`: the reward function returned no `{metric}`; "
            f"use one of {', '.join(SCORE_METRICS)} or a key it returns ({', '.join(sorted(extras)) or 'none'})"
        )
    return extras[metric]


def collect_experience(
    c: ExperienceSources, prompts: PromptBatch, step: int, metrics: dict[str, float]
) -> Scored:
    """Generate and score `prompts`; with DAPO's dynamic sampling, keep only groups whose responses
    differ and draw more prompts from the loader until `data.train_batch_size` groups are kept."""
    batch, extras = generate_and_score(c, prompts, sampling_params(c, step), metrics=metrics)
    if c.spec.algorithm.filter_groups:
        batch, extras = _fill_with_varied_groups(c, prompts, batch, extras, step, metrics)
    metrics.update(c.reward.take_failure_metrics())  # reward/timeouts, reward/errors, reward/non_finite
    for name, values in extras.items():
        # Rows whose function left a key out carry NaN there.
        metrics[f"reward_extra/{name}/mean"] = float(values.double().nanmean())
    return batch


def _fill_with_varied_groups(
    c: ExperienceSources,
    prompts: PromptBatch,
    batch: Scored,
    extras: dict[str, torch.Tensor],
    step: int,
    metrics: dict[str, float],
) -> tuple[Scored, dict[str, torch.Tensor]]:
    algo, n = c.spec.algorithm, c.spec.engine.sampling.n
    wanted = c.spec.data.prompts_per_step * n
    pad = c.tokenizer.pad_token_id
    kept, dropped = [], []
    rounds = 0
    while True:
        keep = groups_with_variance(
            batch.rollout.group_ids, _filter_values(batch, extras, algo.filter_metric)
        )
        kept.append((batch.select(torch.nonzero(keep).squeeze(-1)), {k: v[keep] for k, v in extras.items()}))
        dropped.append(
            (batch.select(torch.nonzero(~keep).squeeze(-1)), {k: v[~keep] for k, v in extras.items()})
        )
        rounds += 1
        num_kept = sum(len(b) for b, _ in kept)
        if num_kept >= wanted:
            break
        if 0 < algo.max_num_gen_batches <= rounds:
            logger.warning(
                "step %d: only %d of %d responses come from groups with differing %s after %d generation rounds "
                "(algorithm.filter_groups.max_num_gen_batches); filling up with uniform groups",
                step,
                num_kept,
                wanted,
                algo.filter_metric,
                rounds,
            )
            kept.extend(dropped)
            break
        offset = int(batch.rollout.group_ids.max()) + 1
        batch, extras = generate_and_score(c, c.loader.next_batch(), sampling_params(c, step, rounds), offset)
    metrics["train/num_gen_batches"] = float(rounds)
    merged = Scored.concat([b for b, _ in kept if len(b)], pad)
    merged_extras = {k: torch.cat([e[k] for b, e in kept if len(b)]) for k in kept[0][1]}
    rows = torch.arange(min(wanted, len(merged)))
    return merged.select(rows), {k: v[rows] for k, v in merged_extras.items()}
