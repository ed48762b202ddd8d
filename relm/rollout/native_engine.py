"""The native rollout engine (`rollout.name=native`): HF model code, relm's cache, attention and loop.

The model stays the HF module (usually the actor's own, colocated), so every architecture that
transformers runs keeps its exact math: soft-capping, sliding windows, MoE routing, q/k norms.
What changes while it generates:

- attention goes through `relm.rollout.native_attention` (grouped-query products that read each KV
  head once, instead of HF's per-layer copy of the KV heads);
- the KV cache is preallocated for the batch (`PreallocatedKVCache`), and the `n` samples of a
  prompt share one prefill: unique prompts are prefilled and their states written into n rows;
- on CUDA each decode step is a replayed CUDA graph (`relm.rollout.cuda_graphs`), per row bucket
  and length bucket, so Python launch overhead disappears, and the layers' norms, MLPs and rotary
  embeddings run as compiled, fused kernels (`relm.models.fused_layers`);
- sampling, eos handling and logprobs are the HF engine's (`relm.rollout.sampling`), so with the
  same seed both engines draw the same tokens; on CUDA the race is compiled into a couple of fused
  passes over the logits, which stay in the model's dtype.

Architectures whose code does not dispatch attention through transformers' `AttentionInterface`
(or that ask it for attention sinks, position biases, ...) run on the HF engine instead, with one
warning naming why. Continuous batching is not implemented: a batch decodes until its longest row
ends (checked every few steps), as the HF engine does.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from relm.data.records import left_pad
from relm.models.fused_layers import FusedLayers
from relm.rollout.base import FINISH_LENGTH, FINISH_STOP, GenerationOutput, SamplingParams
from relm.rollout.cuda_graphs import DecodeGraphs
from relm.rollout.hf_engine import HFRolloutEngine
from relm.rollout.kv_cache import PreallocatedKVCache
from relm.rollout.memory_budget import check_rollout_memory
from relm.rollout.native_attention import (
    NATIVE_ATTENTION,
    NativeAttentionUnsupported,
    register_native_attention,
)
from relm.rollout.sampling import exponential_race, sample_next_token

logger = logging.getLogger("relm")


@dataclass
class _DecodeBuffers:
    """Everything a decode step reads or writes, at fixed addresses (what a CUDA graph needs)."""

    cache: PreallocatedKVCache
    input_ids: torch.Tensor  # [rows_cap, 1] long
    position_ids: torch.Tensor  # [rows_cap, 1] long
    mask: torch.Tensor  # [rows_cap, 1, 1, L_cap] bool, True = attend
    logits: torch.Tensor | None = None  # [rows_cap, V] model dtype, allocated at the first prefill

    @property
    def num_rows(self) -> int:
        return self.cache.num_rows

    @property
    def max_length(self) -> int:
        return self.cache.max_length


class NativeRolloutEngine:
    """`RolloutEngine` over an HF causal LM with a preallocated cache, grouped attention and CUDA graphs.

    Args:
        model: the causal LM (usually the actor's own module); its training mode and attention
            implementation are restored after each call, so training is unaffected.
        pad_token_id: id written after a response ends (mask 0 there).
        eos_token_ids: ids that end a response (kept, mask 1); may be empty.
        device: the model's device.
        seed: initial seed of the sampling generator; `SamplingParams.seed` resets it per call.
        gpu_memory_utilization: share of the GPU's memory the weights, KV cache and sampling buffers
            may take (`actor_rollout_ref.rollout.gpu_memory_utilization`); checked on CUDA only.
        use_cuda_graphs: capture decode steps in CUDA graphs; None means on CUDA devices.
        compile_layers: run norms, MLPs, rotary embeddings and sampling as torch.compile'd fused
            kernels while generating; None means on CUDA devices (on CPU compiling costs more than
            it saves at test sizes).
        max_prefill_tokens: prompt tokens per prefill forward (rows are chunked to stay under it).
        eos_check_interval: decode steps between host checks for "every row finished"; None is
            1 on CPU and 8 on CUDA, where each check stalls the launch queue.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        pad_token_id: int,
        eos_token_ids: list[int],
        device: torch.device | str,
        seed: int = 0,
        gpu_memory_utilization: float = 0.5,
        use_cuda_graphs: bool | None = None,
        compile_layers: bool | None = None,
        max_prefill_tokens: int = 8192,
        eos_check_interval: int | None = None,
    ) -> None:
        self.model = model
        self.pad_token_id = pad_token_id
        self.device = torch.device(device)
        self.eos_token_ids = torch.tensor(sorted(set(eos_token_ids)), dtype=torch.long, device=self.device)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        self.gpu_memory_utilization = gpu_memory_utilization
        self.max_prefill_tokens = max_prefill_tokens
        self.eos_check_interval = eos_check_interval or (8 if self.device.type == "cuda" else 1)
        # The reference engine on the same module and generator: the fallback for architectures
        # the native path cannot run, and the owner of weight syncing.
        self.reference = HFRolloutEngine(
            model, pad_token_id=pad_token_id, eos_token_ids=eos_token_ids, device=self.device
        )
        self.reference.generator = self.generator
        use_cuda_graphs = self.device.type == "cuda" if use_cuda_graphs is None else use_cuda_graphs
        if use_cuda_graphs and self.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, not {self.device}")
        self.graphs = DecodeGraphs(self._decode_step, self._weight_tensors) if use_cuda_graphs else None
        compile_layers = self.device.type == "cuda" if compile_layers is None else compile_layers
        self.fused = FusedLayers(model, enabled=compile_layers)
        self._race = self.fused.compiled(exponential_race)
        self._buffers: _DecodeBuffers | None = None
        self.fallback_reason = _native_blocker(model)
        """Why this model generates on the HF engine instead; None when the native path runs."""
        if self.fallback_reason:
            logger.warning("native rollout: %s; generating with the HF engine instead", self.fallback_reason)
        self.last_stats: dict[str, float] = {}
        """Timings of the last call: prefill_s, decode_s, decode_steps, graphs (captured so far)."""

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> GenerationOutput:
        """Sample `params.n` responses per prompt, grouped prompt by prompt; tensors come back on CPU."""
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("generate needs at least one prompt and no empty prompt")
        if params.n < 1 or params.max_new_tokens < 1:
            raise ValueError(f"n ({params.n}) and max_new_tokens ({params.max_new_tokens}) must be >= 1")
        if self.fallback_reason:
            return self.reference.generate(prompts, params)
        if params.seed is not None:
            self.generator.manual_seed(params.seed)
        was_training = self.model.training
        previous_attention = self.model.config._attn_implementation
        self.model.eval()
        self.model.set_attn_implementation(NATIVE_ATTENTION)
        try:
            with self.fused.applied():
                return self._generate(prompts, params)
        except NativeAttentionUnsupported as exc:
            # Raised by the first prefill forward, before any sampling, so the fallback draws the
            # same random numbers this call would have.
            self.fallback_reason = str(exc)
            self.release_memory()
            logger.warning("native rollout: %s; generating with the HF engine instead", exc)
        finally:
            self.model.set_attn_implementation(previous_attention)
            self.model.train(was_training)
        return self.reference.generate(prompts, params)

    def _generate(self, prompts: list[list[int]], params: SamplingParams) -> GenerationOutput:
        n, width = params.n, params.max_new_tokens
        num_rows = len(prompts) * n
        started = time.perf_counter()
        prompt_ids, prompt_mask = (t.to(self.device) for t in left_pad(prompts, self.pad_token_id))  # [U, P]
        prompt_width = prompt_ids.shape[1]
        rows = self._row_bucket(num_rows)
        buffers = self._ensure_buffers(rows, prompt_width + width)
        if self.graphs is not None:
            self.graphs.check_weights()
        self._prefill(buffers, prompt_ids, prompt_mask, n)
        positions = (prompt_mask.cumsum(dim=1) - 1).clamp(min=0)  # [U, P]
        next_position = positions[:, -1].repeat_interleave(n) + 1  # [N]
        self._sync()
        prefill_done = time.perf_counter()

        finished = torch.zeros(num_rows, dtype=torch.bool, device=self.device)
        stopped_by_eos = torch.zeros_like(finished)
        check_eos = not params.ignore_eos and self.eos_token_ids.numel() > 0
        tokens, masks, logprobs = [], [], []
        for step in range(width):
            token, logprob = sample_next_token(buffers.logits[:num_rows], params, self.generator, self._race)
            live = ~finished
            token = torch.where(live, token, self.pad_token_id)
            tokens.append(token)
            masks.append(live.long())
            logprobs.append(torch.where(live, logprob, 0.0))
            if check_eos:
                hit_eos = live & torch.isin(token, self.eos_token_ids)
                stopped_by_eos |= hit_eos
                finished |= hit_eos
            if step + 1 == width:
                break
            # A host check stalls the queue of launched work, so it runs every few steps; steps
            # past the last live row only append padding, which `_pack` would have written anyway.
            if check_eos and (step + 1) % self.eos_check_interval == 0 and bool(finished.all()):
                break
            column = prompt_width + step  # where this token's keys/values go
            buffers.mask[:, 0, 0, column] = True
            buffers.cache.write_column.fill_(column)
            buffers.input_ids[:num_rows, 0].copy_(token)
            buffers.position_ids[:num_rows, 0].copy_(next_position)
            kv_length = self._length_bucket(column + 1, buffers.max_length)
            if self.graphs is None or not self.graphs.run(rows, kv_length):
                self._decode_step(rows, kv_length)
            next_position = next_position + 1
        output = _pack(tokens, masks, logprobs, stopped_by_eos, width, self.pad_token_id)
        self.last_stats = {
            "prefill_s": prefill_done - started,
            "decode_s": time.perf_counter() - prefill_done,
            "decode_steps": float(len(tokens) - 1),
            "graphs": float(self.graphs.num_graphs if self.graphs else 0),
            "compiled": float(self.fused.active),
        }
        return output

    def _prefill(
        self, buffers: _DecodeBuffers, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, n: int
    ) -> None:
        """Run the unique prompts [U, P] in row chunks; write their states into n rows each, the decode
        mask and inputs for the first step, and the first logits into `buffers.logits`."""
        num_prompts, prompt_width = prompt_ids.shape
        valid = prompt_mask.bool()  # [U, P]
        positions = (prompt_mask.cumsum(dim=1) - 1).clamp(min=0)
        causal = torch.ones(prompt_width, prompt_width, dtype=torch.bool, device=self.device).tril()
        # A padding query attends only itself: every query row then has an attended column (no 0/0
        # in softmax), and its own column is the last one it attends, as native_attention assumes.
        own = torch.eye(prompt_width, dtype=torch.bool, device=self.device)
        logits_kwargs = {"logits_to_keep": 1} if _accepts_logits_to_keep(self.model) else {}
        chunk = max(1, self.max_prefill_tokens // prompt_width)
        first_logits = []
        for start in range(0, num_prompts, chunk):
            rows = slice(start, min(start + chunk, num_prompts))
            mask = (valid[rows, None, None, :] & causal) | own  # [u, 1, P, P]
            buffers.cache.begin_prefill(start * n, n)
            out = self.model(
                input_ids=prompt_ids[rows],
                attention_mask=mask,
                position_ids=positions[rows],
                past_key_values=buffers.cache,
                use_cache=True,
                **logits_kwargs,
            )
            first_logits.append(out.logits[:, -1])  # [u, V]
        logits = torch.cat(first_logits).repeat_interleave(n, dim=0)  # [N, V]
        num_rows, vocab = logits.shape
        if buffers.logits is None or buffers.logits.shape[1] != vocab or buffers.logits.dtype != logits.dtype:
            # The model's own logits dtype: sampling upcasts inside its fused kernel, and a bf16
            # buffer halves what each step writes and reads at 152k vocabulary entries a row.
            buffers.logits = torch.zeros(buffers.num_rows, vocab, dtype=logits.dtype, device=self.device)
        buffers.logits[:num_rows].copy_(logits)
        # Decode state: prompt columns as the prompt mask says, response columns switched on step by
        # step; rows past num_rows (row-bucket padding) attend only their own new column.
        buffers.mask.zero_()
        buffers.mask[:num_rows, 0, 0, :prompt_width] = valid.repeat_interleave(n, dim=0)
        buffers.input_ids.fill_(self.pad_token_id)
        buffers.position_ids.zero_()

    def _decode_step(self, rows: int, kv_length: int) -> None:
        """One token for rows [0, rows) from the fixed buffers into `buffers.logits`; graph-capturable."""
        buffers = self._buffers
        buffers.cache.begin_decode(rows, kv_length)
        logits = self.model(
            input_ids=buffers.input_ids[:rows],
            position_ids=buffers.position_ids[:rows],
            attention_mask=buffers.mask[:rows, :, :, :kv_length],
            past_key_values=buffers.cache,
            use_cache=True,
        ).logits  # [rows, 1, V]
        buffers.logits[:rows].copy_(logits[:, -1])

    def _row_bucket(self, num_rows: int) -> int:
        """Rows a decode step runs: exact when eager; with graphs rounded up so that batches of
        nearby sizes (validation, dynamic sampling rounds) replay the same graphs."""
        if self.graphs is None:
            return num_rows
        if num_rows <= 128:
            return 1 << (num_rows - 1).bit_length()
        return -(-num_rows // 128) * 128

    def _length_bucket(self, live_columns: int, max_length: int) -> int:
        """Cache columns a step reads: exact when eager; with graphs rounded up to one of at most
        ~16 lengths, so attention reads little more than the live part and few graphs are captured."""
        if self.graphs is None:
            return live_columns
        granularity = max(64, -(-max_length // 16 // 64) * 64)
        return min(max_length, -(-live_columns // granularity) * granularity)

    def _ensure_buffers(self, rows: int, length: int) -> _DecodeBuffers:
        """Buffers of at least rows x length; reallocating drops every graph (they read the old ones)."""
        current = self._buffers
        if current is not None and current.num_rows >= rows and current.max_length >= length:
            return current
        if current is not None:
            rows, length = max(rows, current.num_rows), max(length, current.max_length)
        self.release_memory()
        self._check_memory_budget(rows, length)
        self._buffers = _DecodeBuffers(
            cache=PreallocatedKVCache(rows, length, self.device),
            input_ids=torch.full((rows, 1), self.pad_token_id, dtype=torch.long, device=self.device),
            position_ids=torch.zeros(rows, 1, dtype=torch.long, device=self.device),
            mask=torch.zeros(rows, 1, 1, length, dtype=torch.bool, device=self.device),
        )
        return self._buffers

    def _check_memory_budget(self, rows: int, length: int) -> None:
        """Refuse, before allocating, buffers that would not fit the engine's share of the GPU."""
        if self.device.type == "cuda":
            check_rollout_memory(
                self.model.config.get_text_config(),
                weight_bytes=sum(t.numel() * t.element_size() for t in self._weight_tensors()),
                dtype_bytes=next(self.model.parameters()).element_size(),
                rows=rows,
                length=length,
                gpu_memory_utilization=self.gpu_memory_utilization,
                total_bytes=torch.cuda.get_device_properties(self.device).total_memory,
            )

    def _weight_tensors(self) -> list[torch.Tensor]:
        return [*self.model.parameters(), *self.model.buffers()]

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def release_memory(self) -> None:
        """Free the KV cache, buffers and graphs (the next call reallocates and recaptures)."""
        self._buffers = None
        if self.graphs is not None:
            self.graphs.clear()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load the actor's weights by HF name, in place (see `HFRolloutEngine.sync_weights`); in-place
        copies keep every address, so captured graphs stay valid."""
        self.reference.sync_weights(named_tensors)


def _native_blocker(model: nn.Module) -> str | None:
    """Why the native path cannot drive `model` (one clause), or None."""
    if not hasattr(model, "set_attn_implementation") or not hasattr(model, "config"):
        return f"{type(model).__name__} is not a transformers model"
    if not model._can_set_attn_implementation():
        return f"{type(model).__name__} does not dispatch attention through transformers' AttentionInterface"
    register_native_attention()
    return None


def _accepts_logits_to_keep(model: nn.Module) -> bool:
    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def _pack(
    tokens: list[torch.Tensor],
    masks: list[torch.Tensor],
    logprobs: list[torch.Tensor],
    stopped_by_eos: torch.Tensor,
    width: int,
    pad_token_id: int,
) -> GenerationOutput:
    """Stack per-step columns ([N] each) into CPU tensors right-padded to `width` = max_new_tokens."""
    num_rows, num_steps = tokens[0].shape[0], len(tokens)
    response_ids = torch.full((num_rows, width), pad_token_id, dtype=torch.long)
    response_mask = torch.zeros((num_rows, width), dtype=torch.long)
    response_logprobs = torch.zeros((num_rows, width), dtype=torch.float32)
    response_ids[:, :num_steps] = torch.stack(tokens, dim=1).cpu()
    response_mask[:, :num_steps] = torch.stack(masks, dim=1).cpu()
    response_logprobs[:, :num_steps] = torch.stack(logprobs, dim=1).float().cpu()
    reasons = [FINISH_STOP if stop else FINISH_LENGTH for stop in stopped_by_eos.tolist()]
    return GenerationOutput(response_ids, response_mask, response_logprobs, reasons)
