"""The reference rollout engine: a plain sampling loop over an HF causal LM with its KV cache.

It exists to be obviously correct (the engine the others are checked against) and to run anywhere
transformers runs. It is written out instead of calling `model.generate` so that every choice the
trainer depends on is visible here: grouped repetition, left padding and positions, which
distribution the reported logprob comes from, and what a finished row emits.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable

import torch
from torch import nn
from transformers import DynamicCache

from relm.rollout.base import GenerationOutput, SamplingParams, check_generate_args
from relm.rollout.padding import left_pad
from relm.rollout.sampling import SampledColumns, filter_top_k_top_p, sample_next_token

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
        # Grouped repetition [p0, p0, .., p1, ..] before prefill: each copy is then an ordinary row
        # everywhere below, and the order is the one GenerationOutput promises.
        repeated = [prompt for prompt in prompts for _ in range(params.n)]
        input_ids, attention_mask = (
            t.to(self.device) for t in left_pad(repeated, self.pad_token_id)
        )  # [N, P]
        position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)  # [N, P]: left padding does not shift
        num_rows = input_ids.shape[0]
        forward = _CacheStepper(self.model)
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
        DTensors are gathered first, which is a collective: call this on every rank.

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
            target.copy_(tensor)


class _CacheStepper:
    """One forward of a decoding loop, with the model's own cache carried from step to step.

    Attention models take a `DynamicCache` as `past_key_values` (built from the config, so hybrid
    linear-attention layers get their state layers); recurrent ones name their state otherwise:
    Mamba, Mamba-2, FalconMamba and xLSTM take `cache_params`, RWKV `state`, each returned by the
    forward for the next step. A model that takes none of these (GPT-1; XLM keeps a `cache` dict of its
    own), or whose config transformers' cache cannot read (BLT), runs over the whole sequence so far each
    step with `use_cache=False`, as the trainer's forward does. Position ids and
    `logits_to_keep` go only to a forward that takes them.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        parameters = inspect.signature(model.forward).parameters
        keys = ("past_key_values", "cache_params", "state")
        self.cache_key = next((key for key in keys if key in parameters), None)
        self.recurrent = self.cache_key in ("cache_params", "state")
        self.takes_positions = "position_ids" in parameters
        self.takes_logits_to_keep = "logits_to_keep" in parameters
        self.takes_use_cache = "use_cache" in parameters
        self.cache: object = None
        if self.cache_key == "past_key_values":
            try:
                self.cache = DynamicCache(config=getattr(model, "config", None))
            except (AttributeError, KeyError, TypeError):
                # A config a cache cannot read a layer plan from (BLT's four sub-models have no
                # num_hidden_layers): run over the whole sequence so far each step, as without a cache.
                self.cache_key, self.recurrent = None, False
        self.seen: tuple[torch.Tensor, torch.Tensor] | None = None
        """Without a cache: the ids and positions fed so far."""
        self.own_cache = False
        """The model refused a DynamicCache and carries the cache it built (MiniMax)."""

    def __call__(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        logits_to_keep: int | None = None,
    ) -> torch.Tensor:
        """The last position's logits [N, V] for `input_ids` [N, Q] after what the cache holds."""
        kwargs: dict[str, object] = {}
        if self.cache_key is None:
            if self.seen is not None:
                input_ids = torch.cat([self.seen[0], input_ids], dim=1)
                position_ids = torch.cat([self.seen[1], position_ids], dim=1)
            self.seen = (input_ids, position_ids)
            if self.takes_use_cache:
                kwargs["use_cache"] = False  # it would otherwise build a cache of its own (BLT)
        else:
            kwargs |= {self.cache_key: self.cache, "use_cache": True}
        if self.takes_positions:
            kwargs["position_ids"] = position_ids
        if logits_to_keep is not None and self.takes_logits_to_keep:
            kwargs["logits_to_keep"] = logits_to_keep
        if self.recurrent:
            # A recurrent model's mask covers only the tokens it is given (the state holds the rest).
            attention_mask = attention_mask[:, -input_ids.shape[1] :]
        try:
            output = self.model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        except ValueError as exc:
            if self.own_cache or not isinstance(self.cache, DynamicCache) or "cache" not in str(exc):
                raise
            # A model that refuses a DynamicCache (MiniMax's own cache class) builds its own when given
            # none; the forward returns it for the next step.
            self.own_cache = True
            kwargs[str(self.cache_key)] = None
            output = self.model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        if self.recurrent or self.own_cache:
            self.cache = getattr(output, str(self.cache_key))  # the model's own state for the next step
        return output.logits[:, -1]


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
