"""The reference rollout engine: a plain sampling loop over an HF causal LM with its KV cache.

It exists to be obviously correct (the engine the others are checked against) and to run anywhere
transformers runs. It is written out instead of calling `model.generate` so that every choice the
trainer depends on is visible here: grouped repetition, left padding and positions, which
distribution the reported logprob comes from, and what a finished row emits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

import torch
from torch import nn

from relm.models.padding_probe import reads_padding_mask
from relm.rollout.base import GenerationOutput, SamplingParams, check_generate_args, concat_outputs
from relm.rollout.cache_stepper import CacheStepper, batched_steps_match
from relm.rollout.padding import left_pad
from relm.rollout.sampling import SampledColumns, filter_top_k_top_p, sample_next_token
from relm.rollout.tensor_parallel import copy_whole_into

# The sampling functions moved to relm.rollout.sampling (the native engine shares them); they stay
# importable from here.
__all__ = ["HFRolloutEngine", "filter_top_k_top_p", "sample_next_token"]


class HFRolloutEngine:
    """`RolloutEngine` over an HF causal LM (usually the actor's own module, colocated).

    Args:
        model: the causal LM to generate with; its training mode is restored after each call.
        pad_token_id: id written after a response ends (mask 0 there).
        eos_token_ids: ids that end a response (the eos token is kept, mask 1); may be empty.
        device: where prompts go and the sampling generator lives (the model's device).
        seed: initial seed of the engine's generator; `SamplingParams.seed` resets it per call.
        vocab_limit: ids at or past this (the tokenizer's length) are never sampled; None: every
            embedding row may be (see `SampledColumns`).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        pad_token_id: int,
        eos_token_ids: list[int],
        device: torch.device | str,
        seed: int = 0,
        vocab_limit: int | None = None,
    ) -> None:
        self.model = model
        self.pad_token_id = pad_token_id
        self.vocab_limit = vocab_limit
        self.device = torch.device(device)
        self.eos_token_ids = torch.tensor(sorted(set(eos_token_ids)), dtype=torch.long, device=self.device)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        self.heartbeat: Callable[[], None] = _no_progress_listener
        """Called once per decoding step; the trainer's stall watchdog points it at its clock."""
        # Asked here, before any generation, so a call's forwards are its own: whether a batch's cached
        # step gives each row its own logits (a recurrent model's state code may mix them: RWKV's; a
        # probe of two rows, only for recurrent caches), and whether the model reads the attention mask
        # (measured when it was loaded, `relm.models.padding_probe`).
        self.steps_match = batched_steps_match(model)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> GenerationOutput:
        """Sample `params.n` responses per prompt, grouped prompt by prompt; tensors come back on CPU.

        CPU output is what every engine returns (vLLM's are Python lists), so the trainer does not
        depend on which engine ran; the copy is [N, R] ints and floats, negligible beside decoding.
        """
        check_generate_args(prompts, params)
        if params.seed is not None:
            self.generator.manual_seed(params.seed)
        was_training = self.model.training
        self.model.eval()
        try:
            return self._generate(prompts, params)
        finally:
            self.model.train(was_training)

    def _generate(self, prompts: list[list[int]], params: SamplingParams) -> GenerationOutput:
        # A model whose cached step mixes a batch's rows (RWKV) decodes one row at a time.
        if not self.steps_match:
            one = dataclasses.replace(params, n=1)
            return concat_outputs([self._generate_padded([p], one) for p in prompts for _ in range(params.n)])
        # A model that does not read the attention mask would read left pads into its state: prompts of
        # one length need none, so each length is generated on its own.
        if reads_padding_mask(self.model) or len({len(p) for p in prompts}) == 1:
            return self._generate_padded(prompts, params)
        groups = equal_length_groups([len(p) for p in prompts])
        parts = [self._generate_padded([prompts[i] for i in group], params) for group in groups]
        # Row r of the joined parts is copy k of prompt i: put it back at row i * n + k.
        n = params.n
        source = torch.tensor([i * n + k for group in groups for i in group for k in range(n)])
        return _select_rows(concat_outputs(parts), torch.argsort(source))

    def _generate_padded(self, prompts: list[list[int]], params: SamplingParams) -> GenerationOutput:
        # Grouped repetition [p0, p0, .., p1, ..] before prefill: each copy is then an ordinary row
        # everywhere below, and the order is the one GenerationOutput promises.
        repeated = [prompt for prompt in prompts for _ in range(params.n)]
        input_ids, attention_mask = (
            t.to(self.device) for t in left_pad(repeated, self.pad_token_id)
        )  # [N, P]
        position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)  # [N, P]: left padding does not shift
        num_rows = input_ids.shape[0]
        forward = CacheStepper(self.model)
        logits = forward(input_ids, attention_mask, position_ids, logits_to_keep=1)  # [N, V]
        next_position = position_ids[:, -1] + 1  # [N]

        finished = torch.zeros(num_rows, dtype=torch.bool, device=self.device)
        stopped_by_eos = torch.zeros_like(finished)
        columns = SampledColumns(self.pad_token_id, self.vocab_limit)
        for step in range(params.max_new_tokens):
            token = columns.sample(logits, finished, params, self.generator)  # [N]
            self.heartbeat()
            if not params.ignore_eos and self.eos_token_ids.numel():
                hit_eos = ~finished & torch.isin(token, self.eos_token_ids)
                stopped_by_eos |= hit_eos
                finished |= hit_eos
            # One host sync a step; decoding is memory-bound, so it costs little beside the forward.
            if step + 1 == params.max_new_tokens or bool(finished.all()):
                break
            # Finished rows keep feeding pad with mask 1: their outputs are discarded, and a constant
            # batch shape keeps the cache simple.
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones(num_rows, 1)], dim=1)
            logits = forward(token[:, None], attention_mask, next_position[:, None])  # [N, V]
            next_position = next_position + 1
        return columns.pack(stopped_by_eos, params.max_new_tokens)

    def release_memory(self) -> None:
        """Nothing to free: this engine's KV cache lives only for the duration of one `generate` call."""

    @torch.no_grad()
    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy tensors into the engine's model by HF parameter/buffer name.

        Colocated with the actor's own module the tensors are the engine's own and nothing moves;
        with a separate copy (another dtype or device) each is copied with its shape checked.
        Floating tensors may change dtype (fp32 master weights into a bf16 engine copy). Sharded
        DTensors are gathered first, which is a collective: call this on every rank. A parameter of a
        tensor-parallel copy (`relm.rollout.tensor_parallel`) takes its own piece of the whole tensor.

        Raises:
            KeyError: a name the engine's model does not have.
            ValueError: a shape mismatch, or a dtype change between floating and integer tensors.
        """
        own: dict[str, torch.Tensor] = dict(self.model.named_parameters(remove_duplicate=False))
        own.update(self.model.named_buffers(remove_duplicate=False))
        for name, tensor in named_tensors:
            target = own.get(name)
            if target is None:
                raise KeyError(f"sync_weights: `{name}` is not a parameter or buffer of the rollout model")
            tensor = _full(tensor)
            if tensor.shape != target.shape:
                raise ValueError(
                    f"sync_weights: `{name}` has shape {tuple(tensor.shape)}, expected {tuple(target.shape)}"
                )
            if tensor.dtype.is_floating_point != target.dtype.is_floating_point:
                raise ValueError(
                    f"sync_weights: `{name}` is {tensor.dtype}, the rollout model holds {target.dtype}"
                )
            if _same_memory(tensor, target):
                continue
            copy_whole_into(target, tensor)  # a tensor-parallel copy's parameter takes its own piece


def equal_length_groups(lengths: list[int]) -> list[list[int]]:
    """Indices of `lengths` grouped by equal value, groups in the order their length first appears."""
    groups: dict[int, list[int]] = {}
    for index, length in enumerate(lengths):
        groups.setdefault(length, []).append(index)
    return list(groups.values())


def _select_rows(output: GenerationOutput, rows: torch.Tensor) -> GenerationOutput:
    """`output`'s rows in the order `rows` gives (the HF engine's own outputs: no multi-turn fields)."""
    return GenerationOutput(
        output.response_ids[rows],
        output.response_mask[rows],
        output.logprobs[rows],
        [output.finish_reasons[int(row)] for row in rows],
    )


def _no_progress_listener() -> None:
    """The default `heartbeat`: nobody is watching."""


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor behind a possibly sharded DTensor (FSDP2 parameters)."""
    full_tensor = getattr(tensor, "full_tensor", None)
    return full_tensor() if callable(full_tensor) else tensor


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.device == b.device
        and a.dtype == b.dtype
        and a.data_ptr() == b.data_ptr()
        and a.stride() == b.stride()
    )
