"""Validation: generate over the whole validation set, score it, and report verl's `val-core/...` metrics.

The metric names and their grouping follow verl's trainer, so dashboards built for verl read relm's runs:
per data source and per scored variable (`reward`, plus any number a scoring function returns in its
dict), `mean@N` over each prompt's N samples averaged over prompts, and with N > 1 `std@N`,
`best@k/{mean,std}` and `worst@k/{mean,std}` for k = 2, 4, 8, ... and N. `mean@N` and `best@N/*` of the
core variable (`acc` when the function reports one, else `reward`) go under `val-core/`, everything
else under `val-aux/`. Where verl estimates best@k and worst@k by bootstrap (1000 resamples), relm
computes the exact expectation those resamples estimate, so the numbers are deterministic.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from relm.config.specs import RunSpec, SamplingSpec
from relm.data.dataset import PromptDataset
from relm.data.demo_task import write_demo_parquet
from relm.models.zoo import default_cache_dir
from relm.rewards.manager import RewardManager, RewardResult
from relm.rollout.base import RolloutEngine, SamplingParams
from relm.rollout.multi_turn.conversations import ConversationRollout, row_kwargs
from relm.trainer.samples import GenerationSample

CORE_VARIABLES = ("acc", "reward")
"""The first of these a data source reports is its headline (`val-core`) variable, as in verl."""


@dataclass
class ValidationResult:
    """What one validation produced."""

    metrics: dict[str, float]
    """verl's `val-core/...`, `val-aux/...`, `val/response_length/mean` and `timing_s/testing`."""
    samples: list[GenerationSample] = field(default_factory=list)
    """Every generated response as text, in dataset order (filled only when asked: `keep_samples`)."""


def build_val_params(
    val_kwargs: SamplingSpec, max_new_tokens: int, *, seed: int | None = None
) -> SamplingParams:
    """Sampling for validation from `rollout.val_kwargs`; greedy when `do_sample` is false or temperature 0.

    A fixed `seed` makes every validation draw the same noise, so sampled validations at different
    steps differ by the policy alone.
    """
    return SamplingParams(
        n=val_kwargs.n,
        max_new_tokens=max_new_tokens,
        temperature=val_kwargs.temperature,
        top_p=val_kwargs.top_p,
        top_k=val_kwargs.top_k,
        do_sample=val_kwargs.do_sample,
        seed=seed,
    )


def make_val_dataset(
    spec: RunSpec, tokenizer: PreTrainedTokenizerBase, tools: list[dict[str, Any]] | None = None
) -> PromptDataset | None:
    """The validation prompts: `data.val_files`, else the demo task's when training on the demo, else None.
    `tools`: a multi-turn run's tool schemas, listed in every prompt as in training."""
    files = list(spec.data.val_files or [])
    if not files:
        if spec.data.train_files:
            return None
        _, val = write_demo_parquet(default_cache_dir() / "demo")
        files = [str(val)]
    return PromptDataset.from_spec(
        spec.data,
        files,
        tokenizer,
        chat_template=spec.actor.source.chat_template,
        builtin_scorers=spec.reward.uses_builtin_scorers,
        files_key="data.val_files",
        tools=tools,
    )


def is_validation_step(step: int, total_steps: int, test_freq: int) -> bool:
    """verl's schedule after a training step: every `test_freq` steps and after the last; never when <= 0."""
    return test_freq > 0 and (step % test_freq == 0 or step == total_steps)


def run_validation(
    engine: RolloutEngine,
    reward: RewardManager,
    dataset: PromptDataset | Sequence[dict[str, Any]],
    *,
    params: SamplingParams,
    batch_size: int | None = None,
    keep_samples: bool = False,
    multi_turn: ConversationRollout | None = None,
) -> ValidationResult:
    """Generate `params.n` responses for every prompt of `dataset`, score them, and reduce to metrics.

    Args:
        engine: The rollout engine, holding the current policy weights.
        reward: Scores the responses (the training reward manager is the right one).
        dataset: `PromptDataset` items (`prompt_ids`, `data_source`, `ground_truth`, `extra_info`).
        params: From `build_val_params`.
        batch_size: Prompts per `generate` call (`data.val_batch_size`); None sends them all at once.
        keep_samples: Also return every generated response as text (greedy validation generates one
            response per prompt and counts it N times: that one is kept once).
        multi_turn: With `rollout.multi_turn.enable`, the conversations with tools run through it (each
            row's `extra_info.tools_kwargs` reaching its tools), as in training; data-parallel, each rank
            runs its share of them and every rank gets them all.

    Returns:
        Metrics under verl's names (`val-core/<data_source>/reward/mean@N`, the `val-aux/...` spread
        metrics, `val/response_length/mean`, `timing_s/testing`) and, if asked, the samples.
    """
    start = time.perf_counter()
    num_prompts = len(dataset)
    batch_size = num_prompts if batch_size is None else batch_size
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    # Greedy samples of one prompt are all the same: generate one and count it N times.
    num_generated = 1 if params.greedy else params.n
    copies = params.n // num_generated

    data_sources: list[str] = []
    prompt_indices: list[int] = []
    variables: dict[str, list[float]] = {"reward": []}
    lengths: list[float] = []
    samples: list[GenerationSample] = []
    with _engine_rng_preserved(engine):
        for first in range(0, num_prompts, batch_size):
            items = [dataset[i] for i in range(first, min(first + batch_size, num_prompts))]
            # Seeding only the first call gives one seeded stream over the set, not the same noise per batch.
            batch_params = replace(params, n=num_generated, seed=params.seed if first == 0 else None)
            prompt_ids = [list(item["prompt_ids"]) for item in items]
            if multi_turn is None:
                gen = engine.generate(prompt_ids, batch_params)
            else:
                gen = multi_turn.generate(
                    prompt_ids,
                    batch_params,
                    **row_kwargs([item["extra_info"] for item in items]),
                    messages=[list(item.get("raw_prompt") or []) for item in items],
                ).generation
            extra_infos = _repeat([dict(item["extra_info"]) for item in items], num_generated)
            if (
                gen.extra_fields is not None
            ):  # a multi-turn rollout's turn_scores and tool_rewards, as in verl
                extra_infos = [
                    {**info, **extra} for info, extra in zip(extra_infos, gen.extra_fields, strict=True)
                ]
            scored = reward(
                gen.response_ids,
                gen.response_mask,
                _repeat([item["data_source"] for item in items], num_generated),
                _repeat([item["ground_truth"] for item in items], num_generated),
                extra_infos,
            )
            if keep_samples:
                samples += _samples(reward, items, num_generated, scored)
            rows_before, num_rows = len(data_sources), len(items) * params.n
            data_sources += _repeat([item["data_source"] for item in items], params.n)
            prompt_indices += _repeat(list(range(first, first + len(items))), params.n)
            lengths += _repeat(gen.response_lengths.float().tolist(), copies)
            variables["reward"] += _repeat(scored.scores.tolist(), copies)
            # Extra values a scoring function returned; "reward" is the score's own name.
            for name in sorted((set(variables) | set(scored.extra)) - {"reward"}):
                column = variables.setdefault(name, [math.nan] * rows_before)
                values = scored.extra.get(name)
                column += _repeat(values, copies) if values is not None else [math.nan] * num_rows

    metrics = validation_metrics(data_sources, prompt_indices, dict(variables))
    metrics["val/response_length/mean"] = sum(lengths) / len(lengths)
    metrics["timing_s/testing"] = time.perf_counter() - start
    # Validation's failed reward calls, apart from the training step's.
    metrics.update({f"val-aux/{k}": v for k, v in reward.take_failure_metrics().items()})
    return ValidationResult(metrics, samples)


def _samples(
    reward: RewardManager, items: list[dict[str, Any]], n: int, scored: RewardResult
) -> list[GenerationSample]:
    """One batch's responses as text: prompt i's `n` responses are rows i*n .. i*n+n-1."""
    inputs = reward.tokenizer.batch_decode(
        [list(item["prompt_ids"]) for item in items], skip_special_tokens=True
    )
    scores = scored.scores.tolist()
    return [
        GenerationSample(
            input=inputs[row // n],
            output=scored.texts[row],
            gts=items[row // n]["ground_truth"],
            score=scores[row],
            extras={name: values[row] for name, values in scored.extra.items()},
        )
        for row in range(len(scores))
    ]


def _repeat(values: list[Any], times: int) -> list[Any]:
    """Each value `times` times in a row: the grouped order engines return samples in."""
    return [value for value in values for _ in range(times)]


def validation_metrics(
    data_sources: list[str], prompt_indices: list[int], variables: dict[str, list[float]]
) -> dict[str, float]:
    """verl's validation metrics from per-response values.

    Args:
        data_sources: M values, one per response.
        prompt_indices: M values; responses with the same index are samples of one prompt.
        variables: name -> M values (NaN where a response has none; those are left out).
    """
    # data source -> variable -> metric name -> one value per prompt
    per_prompt: dict[str, dict[str, dict[str, list[float]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list))
    )
    groups: dict[tuple[str, int], list[int]] = defaultdict(list)
    for row, key in enumerate(zip(data_sources, prompt_indices, strict=True)):
        groups[key].append(row)
    for (source, _), rows in groups.items():
        for name, column in variables.items():
            values = [column[row] for row in rows if not math.isnan(column[row])]
            for metric, value in _prompt_metrics(values).items():
                per_prompt[source][name][metric].append(value)

    metrics: dict[str, float] = {}
    for source, by_variable in per_prompt.items():
        core = next((name for name in CORE_VARIABLES if name in by_variable), None)
        for name, by_metric in by_variable.items():
            largest = max(_sample_count(metric) for metric in by_metric)
            for metric, values in by_metric.items():
                headline = metric.startswith(("mean", "best")) and _sample_count(metric) == largest
                section = "val-core" if name == core and headline else "val-aux"
                metrics[f"{section}/{source}/{name}/{metric}"] = sum(values) / len(values)
    return metrics


def _prompt_metrics(values: list[float]) -> dict[str, float]:
    """`mean@N`, and with N > 1 `std@N` and best/worst-of-k for one prompt's N sample values."""
    num = len(values)
    if num == 0:
        return {}
    mean = sum(values) / num
    metrics = {f"mean@{num}": mean}
    if num == 1:
        return metrics
    metrics[f"std@{num}"] = math.sqrt(sum((v - mean) ** 2 for v in values) / num)  # population std, as np.std
    k = 2
    while True:
        k = min(k, num)
        metrics[f"best@{k}/mean"], metrics[f"best@{k}/std"] = best_of_k(values, k)
        worst_mean, worst_std = best_of_k([-v for v in values], k)
        metrics[f"worst@{k}/mean"], metrics[f"worst@{k}/std"] = -worst_mean, worst_std
        if k == num:
            return metrics
        k *= 2


def best_of_k(values: list[float], k: int) -> tuple[float, float]:
    """Mean and std of the largest of k draws (with replacement) from `values`, exactly.

    Sorted ascending, the i-th value (1-based) of N is the maximum with probability (i/N)^k - ((i-1)/N)^k:
    all k draws land at or below position i, and not all below it. Ties are harmless, as each position
    is its own atom. This is the limit of verl's bootstrap estimate.
    """
    ordered = sorted(values)
    num = len(ordered)
    probs = [((i + 1) / num) ** k - (i / num) ** k for i in range(num)]
    mean = sum(p * v for p, v in zip(probs, ordered, strict=True))
    second = sum(p * v * v for p, v in zip(probs, ordered, strict=True))
    return mean, math.sqrt(max(second - mean * mean, 0.0))


def _sample_count(metric: str) -> int:
    """N of `mean@N`, k of `best@k/mean`."""
    return int(metric.split("@")[1].split("/")[0])


@contextmanager
def _engine_rng_preserved(engine: RolloutEngine) -> Iterator[None]:
    """Restore the engine's sampling generator afterwards, when it exposes one.

    Validation (especially with a fixed seed, which re-seeds the generator) must not change the
    samples training draws next: a run with `test_freq` set should train exactly as one without.
    """
    generator = getattr(engine, "generator", None)
    state = generator.get_state() if isinstance(generator, torch.Generator) else None
    try:
        yield
    finally:
        if state is not None and generator is not None:
            generator.set_state(state)
