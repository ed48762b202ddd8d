"""A reward model in the run: built from `reward_model.*`, and its score joined with the rule reward.

How the two combine follows verl 0.9.1's reward loop: with `reward_model.enable` and no
`custom_reward_function`, the reward model's score is the reward (verl's `compute_score_disrm`); the
rule scorer of the row's data_source, where one is registered, still runs and is logged as
`reward_extra/rule_score/mean`, so a run keeps its ground-truth metric while it optimises the model's
preference. With a custom function, the function's value is the reward, as in verl, and it receives
the reward model's score as `extra_info["rm_score"]` (verl's function asks the model itself over HTTP;
here the score is already computed), so a mix of rule and model is one line of the user's code.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any, Protocol

import torch
from transformers import PreTrainedTokenizerBase

from relm.config.remote_code import REWARD_MODEL_KEY
from relm.config.specs import RewardModelSpec
from relm.memory.offload import ParkedModel
from relm.models.loading import load_causal_lm, resolve_model_dir
from relm.models.tokenizer import end_of_turn_ids, load_tokenizer
from relm.rewards.judge import JudgeRewardModel, JudgeSettings, load_template
from relm.rewards.manager import RewardResult, place_on_last_token
from relm.rewards.registry import _scorer_for
from relm.rewards.reward_model import (
    DEFAULT_MICRO_BATCH,
    ModelScores,
    ScoringInputs,
    load_discriminative_reward_model,
)
from relm.rollout.base import RolloutEngine, SamplingParams
from relm.rollout.hf_engine import HFRolloutEngine
from relm.rollout.native.engine import NativeRolloutEngine

logger = logging.getLogger("relm")


class ModelScorer(Protocol):
    """A discriminative reward model or an LLM judge."""

    def score(self, batch: ScoringInputs) -> ModelScores: ...


def build_reward_model(
    rm: RewardModelSpec, *, device: torch.device, policy_tokenizer: PreTrainedTokenizerBase | None = None
) -> ModelScorer:
    """The scorer `reward_model.*` describes: an LLM judge when a judge template is set, else a classifier
    or exported critic. Frozen, in eval mode; bf16 on a GPU, fp32 on a CPU.

    A classifier reads the policy's token ids only where both share one vocabulary: with another
    (Skywork-Reward-Llama-3.1 beside a Mistral policy) those ids mean other tokens or lie past its
    embedding, so the conversation is re-rendered in its own chat template, as `input_tokenizer` asks
    and as verl 0.9's reward loop always does.

    Raises:
        UserError: the model, its tokenizer or the judge template cannot be used.
    """
    assert rm.path is not None  # validated: enable needs a path
    folder = resolve_model_dir(rm.path)
    tokenizer = load_tokenizer(
        folder, trust_remote_code=rm.trust_remote_code, path_key="reward_model.model.path"
    )
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    micro_batch_size = rm.rows_per_forward or DEFAULT_MICRO_BATCH
    judge = rm.judge
    if judge.prompt_template is None and judge.prompt_template_path is None:
        return load_discriminative_reward_model(
            rm.path,
            tokenizer=tokenizer,
            device=device,
            dtype=dtype,
            micro_batch_size=micro_batch_size,
            max_length=rm.max_length,
            rerender=rm.input_tokenizer is not None
            or not _same_vocabulary(policy_tokenizer, tokenizer, rm.path),
            trust_remote_code=rm.trust_remote_code,
        )
    template = load_template(judge.prompt_template, judge.prompt_template_path)
    model = load_causal_lm(
        folder,
        dtype=dtype,
        device=device,
        trust_remote_code=rm.trust_remote_code,
        trust_key=REWARD_MODEL_KEY,
    )
    model.requires_grad_(False).eval()
    settings = JudgeSettings(
        template=template,
        pattern=re.compile(judge.score_regex),
        default_score=judge.default_score,
        sampling=SamplingParams(
            n=1,
            max_new_tokens=rm.response_length,
            temperature=rm.sampling.temperature,
            top_p=rm.sampling.top_p,
            top_k=rm.sampling.top_k,
            do_sample=rm.sampling.do_sample,
        ),
        prompt_length=rm.prompt_length,
        micro_batch_size=micro_batch_size,
    )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    engine_kwargs: dict[str, Any] = dict(
        pad_token_id=int(pad or 0),
        eos_token_ids=end_of_turn_ids(tokenizer, getattr(model, "generation_config", None)),
        device=device,
        seed=rm.seed,
        vocab_limit=len(tokenizer),
    )
    engine: RolloutEngine = (
        HFRolloutEngine(model, **engine_kwargs)
        if rm.engine == "hf"
        else NativeRolloutEngine(model, **engine_kwargs)
    )
    parked = ParkedModel(model, device) if device.type == "cuda" else None
    return JudgeRewardModel(engine, tokenizer, settings, parked)


RuleReward = Callable[..., RewardResult]
"""`RewardManager.__call__`: (response_ids, response_mask, data_sources, ground_truths, extra_infos)."""


def score_with_reward_model(
    scorer: ModelScorer,
    rule_reward: RuleReward,
    policy_tokenizer: PreTrainedTokenizerBase,
    *,
    sequences: list[list[int]],
    messages: list[list[dict[str, Any]]],
    response_ids: torch.Tensor,
    response_mask: torch.Tensor,
    data_sources: list[str],
    ground_truths: list[Any],
    extra_infos: list[dict[str, Any]],
    custom_function: bool,
) -> RewardResult:
    """Score N responses with the reward model and join the rule reward as the module docstring says.

    Args:
        sequences: N policy token ids (prompt + response, no padding).
        messages: N prompts' chat messages.
        response_ids, response_mask: [N, R].
        custom_function: A `custom_reward_function` is set: its value is the reward.
    """
    num_rows = response_ids.shape[0]
    ids = [response_ids[row][response_mask[row].bool()].tolist() for row in range(num_rows)]
    texts = policy_tokenizer.batch_decode(ids, skip_special_tokens=True)
    model = scorer.score(ScoringInputs(sequences, messages, texts, ground_truths))
    extra = {"rm_score": model.scores.tolist(), **{k: v.tolist() for k, v in model.extra.items()}}
    if custom_function:
        infos = [
            {**(info or {}), "rm_score": float(s)} for info, s in zip(extra_infos, model.scores, strict=True)
        ]
        result = rule_reward(response_ids, response_mask, data_sources, ground_truths, infos)
        result.extra = {**extra, **result.extra}
        return result
    rule_scores = [float("nan")] * num_rows
    ruled = [row for row in range(num_rows) if _scorer_for(data_sources[row]) is not None]
    if ruled:
        index = torch.tensor(ruled)
        rule = rule_reward(
            response_ids[index],
            response_mask[index],
            [data_sources[r] for r in ruled],
            [ground_truths[r] for r in ruled],
            [extra_infos[r] for r in ruled],
        )
        for position, row in enumerate(ruled):
            rule_scores[row] = float(rule.scores[position])
    return RewardResult(
        scores=model.scores,
        token_scores=place_on_last_token(model.scores, response_mask),
        extra={**extra, "rule_score": rule_scores},
        texts=texts,
    )


def _same_vocabulary(
    policy: PreTrainedTokenizerBase | None, reward: PreTrainedTokenizerBase, path: str
) -> bool:
    """Whether the reward model can read the policy's token ids as they are (True when the policy's is unknown)."""
    if policy is None or policy.get_vocab() == reward.get_vocab():
        return True
    logger.info(
        "reward_model.model.path=%s has its own vocabulary: each conversation is re-rendered in its chat "
        "template (as with reward_model.model.input_tokenizer set)",
        path,
    )
    return False
