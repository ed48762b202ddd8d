"""The rollout protocol: token ids in; response ids, their logprobs and finish reasons out.

Every rollout engine (the HF engine, the native engine, vLLM, a test double) implements
`RolloutEngine`. Keeping the surface this narrow is what lets the trainer swap engines with one
config key and lets parity tests compare two engines on the same prompts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

FINISH_STOP = "stop"
"""The response ended with an eos token (included in the response)."""
FINISH_LENGTH = "length"
"""The response reached `max_new_tokens` without eos."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample; one set per `generate` call."""

    n: int = 1
    """Responses per prompt; outputs are grouped prompt by prompt ([p0s0, p0s1, ..., p1s0, ...])."""
    max_new_tokens: int = 512
    """Response length limit; also the width of the padded outputs."""
    temperature: float = 1.0
    """0 (or `do_sample=False`) is greedy."""
    top_p: float = 1.0
    """Nucleus threshold; 1.0 is off."""
    top_k: int = -1
    """Top-k; -1 or 0 is off."""
    do_sample: bool = True
    """False is greedy whatever the temperature."""
    ignore_eos: bool = False
    """Keep generating past eos (fixed-length benchmarks)."""
    seed: int | None = None
    """Seed for this call's sampling; None continues the engine's generator."""

    @property
    def greedy(self) -> bool:
        return not self.do_sample or self.temperature <= 0.0


@dataclass
class GenerationOutput:
    """What an engine returns for `num_prompts * n` responses, right-padded to `max_new_tokens`.

    Logprobs are of the sampled token under the distribution that was sampled from after
    temperature scaling (as vLLM and verl report them); 0 at padding.
    """

    response_ids: torch.Tensor
    """[N, R] int64, padded with the tokenizer's pad id; N = num_prompts * n, R = max_new_tokens."""
    response_mask: torch.Tensor
    """[N, R] int64, 1 on generated tokens (eos included), 0 on padding."""
    logprobs: torch.Tensor
    """[N, R] float32, logprob of each generated token; 0 on padding."""
    finish_reasons: list[str]
    """N entries, `stop` or `length`."""
    model_mask: torch.Tensor | None = None
    """[N, R] int64, 1 on the tokens the model sampled, 0 on tool results a multi-turn rollout appended
    (which `response_mask` covers too); None when every response token was sampled."""
    extra_fields: list[dict[str, Any]] | None = None
    """N dicts a multi-turn rollout adds to each response's `extra_info` for the reward function
    (verl's `turn_scores`, `tool_rewards`); None otherwise."""
    token_versions: torch.Tensor | None = None
    """[N, R] int64, the weight version that sampled each token, -1 after a response's end: set by a partial
    rollout (`relm.rollout.partial`), whose responses may span versions; None when one version made them all."""

    @property
    def response_lengths(self) -> torch.Tensor:
        """[N] number of generated tokens per response."""
        return self.response_mask.sum(dim=-1)

    def to_cpu(self) -> GenerationOutput:
        """The same output with its tensors on the CPU (logprobs float32), to send to other processes."""
        return GenerationOutput(
            self.response_ids.cpu(),
            self.response_mask.cpu(),
            self.logprobs.float().cpu(),
            list(self.finish_reasons),
            model_mask=None if self.model_mask is None else self.model_mask.cpu(),
            extra_fields=None if self.extra_fields is None else list(self.extra_fields),
            token_versions=None if self.token_versions is None else self.token_versions.cpu(),
        )

    @staticmethod
    def empty(width: int) -> GenerationOutput:
        """No responses, `width` wide: the share of a process that had no prompts."""
        return GenerationOutput(
            torch.zeros(0, width, dtype=torch.long),
            torch.zeros(0, width, dtype=torch.long),
            torch.zeros(0, width, dtype=torch.float32),
            [],
        )


def concat_outputs(parts: list[GenerationOutput]) -> GenerationOutput:
    """Several calls' outputs, rows in the order given, as one (the ranks' shares of a data-parallel
    rollout); `model_mask`, `extra_fields` and `token_versions` are kept when every part has them."""
    model_masks = [p.model_mask for p in parts if p.model_mask is not None]
    extra_fields = [p.extra_fields for p in parts if p.extra_fields is not None]
    versions = [p.token_versions for p in parts if p.token_versions is not None]
    if any(len(kept) not in (0, len(parts)) for kept in (model_masks, extra_fields, versions)):
        raise ValueError("some outputs carry model_mask, extra_fields or token_versions and others do not")
    return GenerationOutput(
        torch.cat([p.response_ids for p in parts]),
        torch.cat([p.response_mask for p in parts]),
        torch.cat([p.logprobs for p in parts]),
        [reason for p in parts for reason in p.finish_reasons],
        model_mask=torch.cat(model_masks) if model_masks else None,
        extra_fields=[field for fields in extra_fields for field in fields] if extra_fields else None,
        token_versions=torch.cat(versions) if versions else None,
    )


def check_generate_args(prompts: list[list[int]], params: SamplingParams) -> None:
    """What every engine's `generate` refuses before any work: no prompts, an empty prompt, n or
    max_new_tokens below 1."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("generate needs at least one prompt and no empty prompt")
    if params.n < 1 or params.max_new_tokens < 1:
        raise ValueError(f"n ({params.n}) and max_new_tokens ({params.max_new_tokens}) must be >= 1")


def logprob_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(max, mean) |engine - trainer| logprob allowed for the same tokens when the engine runs in `dtype`.

    The two paths differ only in kernels (KV-cached decoding vs one full-sequence forward): in fp32
    that is ~1e-6 (0 was measured on an H200). bf16 rounds every activation, and the gap grows with
    depth: measured maxima on random-weight models were 0.03 (Qwen2.5-0.5B) to 0.12 (Phi-3-mini,
    32 layers), so bf16 gets a loose max and a mean bound that a wrong model would break.
    """
    return (2e-3, 2e-4) if dtype == torch.float32 else (0.5, 0.05)


class RolloutEngine(Protocol):
    """An engine the trainer drives; implementations live beside this file."""

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> GenerationOutput:
        """Sample `params.n` responses for each prompt (token ids, no padding)."""
        ...

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load the actor's current weights (HF parameter names) into the engine, in memory."""
        ...

    def release_memory(self) -> None:
        """Free generation-only memory (KV cache, captured graphs) so the update can use it."""
        ...
