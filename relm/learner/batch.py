"""A step's experience, one frozen record per phase: `Rollout` -> `Scored` -> `Annotated` -> `Advantaged`.

Each phase's record is made by one function (`trainer/experience.build_rollout`, `trainer/collect.score`,
`trainer/ppo.annotate`, `trainer/ppo.estimate_advantages`) and holds the one before it, so nothing is
written into a record after it is made and a field that a stage has not computed yet does not exist yet.

Layout follows verl: the prompt block is left-padded and the response block right-padded, so the
concatenation `[prompt | response]` has the boundary at a fixed column P and every response token
t sits at column P + t. Tensors over response tokens are all [N, R]; N = num_prompts * n responses.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Any, TypeVar

import torch

R = TypeVar("R")


def select_rows(record: R, index: torch.Tensor | list[int]) -> R:
    """The rows at `index` of a frozen record: tensors indexed, lists picked, records within it likewise,
    everything else (settings, markers) kept as it is. For mini/micro-batches and data-parallel shares."""
    idx = torch.as_tensor(index, dtype=torch.long)
    picked: dict[str, Any] = {}
    for f in fields(record):  # type: ignore[arg-type]  # every caller passes one of this module's records
        value = getattr(record, f.name)
        if isinstance(value, torch.Tensor):
            picked[f.name] = value[idx.to(value.device)]
        elif isinstance(value, list):
            picked[f.name] = [value[i] for i in idx.tolist()]
        elif is_dataclass(value) and not isinstance(value, type):
            picked[f.name] = select_rows(value, idx)
    return replace(record, **picked)  # type: ignore[type-var]


def to_device(record: R, device: torch.device | str) -> R:
    """A copy of a frozen record with every tensor in it (records within it included) on `device`."""
    moved: dict[str, Any] = {}
    for f in fields(record):  # type: ignore[arg-type]
        value = getattr(record, f.name)
        if isinstance(value, torch.Tensor):
            moved[f.name] = value.to(device)
        elif is_dataclass(value) and not isinstance(value, type):
            moved[f.name] = to_device(value, device)
    return replace(record, **moved)  # type: ignore[type-var]


@dataclass(frozen=True)
class Rollout:
    """What the rollout engine generated for a step's prompts, joined with the prompts and their rows."""

    prompt_ids: torch.Tensor
    """[N, P] int64, left-padded."""
    prompt_mask: torch.Tensor
    """[N, P] int64."""
    response_ids: torch.Tensor
    """[N, R] int64, right-padded."""
    response_mask: torch.Tensor
    """[N, R] int64, 1 on the tokens the model sampled (a multi-turn rollout's tool results are 0)."""
    response_attention_mask: torch.Tensor
    """[N, R] int64, 1 on every response token the model attends to: the sampled ones and, in a
    multi-turn rollout, the tool results between them (equal to `response_mask` otherwise)."""
    group_ids: torch.Tensor
    """[N] int64, the prompt each response answers (GRPO-style groups)."""
    data_sources: list[str]
    ground_truths: list[Any]
    extra_infos: list[dict[str, Any]]
    finish_reasons: list[str]
    rollout_logprobs: torch.Tensor
    """[N, R] fp32 logprobs the rollout engine reported for the tokens it sampled."""
    token_versions: torch.Tensor | None = None
    """[N, R] int64, the weight version that sampled each token (-1 after the end): a partial rollout's
    (`relm.rollout.partial`, asynchronous training); None when one version sampled the whole batch."""

    def __len__(self) -> int:
        return self.response_ids.shape[0]

    @property
    def input_ids(self) -> torch.Tensor:
        """[N, P + R] prompt and response."""
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        """[N, P + R]."""
        return torch.cat([self.prompt_mask, self.response_attention_mask], dim=1)

    @property
    def position_ids(self) -> torch.Tensor:
        """[N, P + R]: 0 at each row's first real token, so left padding does not shift positions."""
        return (self.attention_mask.cumsum(dim=1) - 1).clamp(min=0)

    @property
    def response_width(self) -> int:
        return self.response_ids.shape[1]

    def select(self, index: torch.Tensor | list[int]) -> Rollout:
        return select_rows(self, index)

    def to(self, device: torch.device | str) -> Rollout:
        return to_device(self, device)

    @staticmethod
    def concat(rollouts: list[Rollout], pad_token_id: int) -> Rollout:
        """Rows of several rollouts in order; prompt blocks are re-left-padded to a common width.

        Group ids must already be distinct across them (`build_rollout`'s `group_offset`).
        """
        width = max(r.prompt_ids.shape[1] for r in rollouts)

        def left_widen(t: torch.Tensor, fill: int) -> torch.Tensor:
            return torch.nn.functional.pad(t, (width - t.shape[1], 0), value=fill)

        merged: dict[str, Any] = {}
        for f in fields(Rollout):
            values = [getattr(r, f.name) for r in rollouts]
            if f.name == "prompt_ids":
                merged[f.name] = torch.cat([left_widen(v, pad_token_id) for v in values])
            elif f.name == "prompt_mask":
                merged[f.name] = torch.cat([left_widen(v, 0) for v in values])
            elif f.name == "token_versions":
                present = [v for v in values if v is not None]
                if len(present) not in (0, len(values)):
                    raise ValueError("some rollouts carry token_versions and others do not")
                merged[f.name] = torch.cat(present) if present else None
            elif isinstance(values[0], torch.Tensor):
                merged[f.name] = torch.cat(values)
            else:
                merged[f.name] = [item for v in values for item in v]
        return Rollout(**merged)


@dataclass(frozen=True)
class Scored:
    """A rollout with the reward's verdict on each response (`trainer/collect.score`)."""

    rollout: Rollout
    token_scores: torch.Tensor
    """[N, R] task score on the last sampled response token (plus DAPO's overlong penalty), 0 elsewhere."""
    reward_extras: list[dict[str, float]]
    """N dicts: the numbers the reward function returned beside each score (for the sample dumps)."""
    baseline_scores: torch.Tensor | None
    """[N] score of the greedy response to the same prompt: ReMax's baseline, scored only for an estimator
    that reads it (`estimator_needs(...).greedy_baseline`); absent for every other."""

    def __len__(self) -> int:
        return len(self.rollout)

    def select(self, index: torch.Tensor | list[int]) -> Scored:
        return select_rows(self, index)

    @staticmethod
    def concat(batches: list[Scored], pad_token_id: int) -> Scored:
        """Rows of several scored rollouts in order (see `Rollout.concat`)."""
        baselines = [b.baseline_scores for b in batches]
        return Scored(
            rollout=Rollout.concat([b.rollout for b in batches], pad_token_id),
            token_scores=torch.cat([b.token_scores for b in batches]),
            reward_extras=[extra for b in batches for extra in b.reward_extras],
            baseline_scores=None if baselines[0] is None else torch.cat(baselines),  # type: ignore[arg-type]
        )


@dataclass(frozen=True)
class ActorForward:
    """Old logprobs from a no-grad actor forward before the update (verl's decoupled mode)."""

    logprobs: torch.Tensor
    """[N, R] fp32."""
    sum_pi_squared: torch.Tensor | None = None
    """[N, R] fp32 sum over the vocabulary of the old policy's squared probabilities at each response position,
    from the same forward; computed only for an estimator that reads it (`estimator_needs(...).sum_pi_squared`,
    the optimal token baselines), absent for every other."""


@dataclass(frozen=True)
class EngineLogprobs:
    """Old logprobs are the engine's (verl's bypass mode: the rollout correction acts in the loss)."""

    logprobs: torch.Tensor
    """[N, R] fp32, the rollout's own `rollout_logprobs`."""


@dataclass(frozen=True)
class UpdateForward:
    """On-policy: the update's first forward, detached, stands for the old logprobs; no tensor before
    the update (`relm.trainer.old_logprobs`)."""


OldLogprobs = ActorForward | EngineLogprobs | UpdateForward
"""Where the update's old logprobs come from, with the tensor where one exists before the update."""


@dataclass(frozen=True)
class TeacherTopK:
    """A distillation teacher's `k` most likely ids at each response position (temperature 1)."""

    logprobs: torch.Tensor
    """[N, R, k] fp32."""
    ids: torch.Tensor
    """[N, R, k] int64."""


@dataclass(frozen=True)
class Annotated:
    """A scored rollout with the frozen models' view of it (`trainer/ppo.annotate`)."""

    scored: Scored
    old_logprobs: OldLogprobs
    ref_logprobs: torch.Tensor | None
    """[N, R] reference-model logprobs; absent in a run with no reference model (no KL anywhere)."""
    values: torch.Tensor | None
    """[N, R] critic values V(s_t) before the update; absent in a run with no critic."""
    teacher_logprobs: torch.Tensor | None = None
    """[N, R] each sampled token's logprob under its distillation teacher (temperature 1); absent without
    distillation, and with `forward_kl_topk`, which reads `teacher_topk` instead."""
    teacher_topk: TeacherTopK | None = None
    """The teacher's top ids and their logprobs at each position (`forward_kl_topk` only)."""

    def __len__(self) -> int:
        return len(self.scored)

    @property
    def rollout(self) -> Rollout:
        return self.scored.rollout


@dataclass(frozen=True)
class Advantaged:
    """What the updates train on: rewards, the loss mask, advantages and returns (`trainer/ppo.estimate_advantages`)."""

    annotated: Annotated
    token_rewards: torch.Tensor
    """[N, R] scores minus the in-reward KL penalty (the scores themselves without it)."""
    loss_mask: torch.Tensor
    """[N, R] 0/1, the tokens losses, KL, entropy and advantages cover: the sampled tokens less those the
    rollout correction rejected (`algorithm.rollout_correction.rollout_rs`; all of them without it)."""
    rollout_is_weights: torch.Tensor | None
    """[N, R] importance weights multiplying the policy loss (`algorithm.rollout_correction.rollout_is`);
    absent when that is off."""
    advantages: torch.Tensor
    """[N, R]."""
    returns: torch.Tensor
    """[N, R]."""

    def __len__(self) -> int:
        return len(self.annotated)

    @property
    def rollout(self) -> Rollout:
        return self.annotated.scored.rollout

    def select(self, index: torch.Tensor | list[int]) -> Advantaged:
        return select_rows(self, index)

    def to(self, device: torch.device | str) -> Advantaged:
        return to_device(self, device)
