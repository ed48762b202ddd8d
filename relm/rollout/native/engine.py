"""The native rollout engine (`rollout.name=native`): HF model code, relm's cache, attention and loop.

The model stays the HF module (usually the actor's own, colocated), so every architecture that
transformers runs keeps its exact math: soft-capping, sliding windows, MoE routing, q/k norms.
What changes while it generates:

- attention goes through `relm.rollout.native.attention` (grouped-query products that read each KV
  head once, instead of HF's per-layer copy of the KV heads);
- the KV cache is preallocated (`PreallocatedKVCache`), and the `n` samples of a prompt share one
  prefill: unique prompts are prefilled and their states written into n rows; a prompt longer than
  `max_prefill_tokens` is prefilled in chunks of columns;
- on CUDA each decode step is a replayed CUDA graph (`relm.rollout.native.cuda_graphs`), per row bucket
  and length bucket, so Python launch overhead disappears, and the layers' norms, MLPs and rotary
  embeddings run as compiled, fused kernels (`relm.models.fused_layers`);
- when the batch has more rows than slots (`max_num_seqs`, or what fits in
  `gpu_memory_utilization`), it is continuously batched: a slot whose row finished takes the next
  waiting row between steps (`relm.rollout.native.slot_scheduler`, `relm.rollout.native.decode_state`).
  When every row has a slot the batch decodes in lock-step, with one write column for all rows,
  exactly as before continuous batching existed: same graphs, same host checks;
- sampling, eos handling and logprobs are the HF engine's (`relm.rollout.sampling`), so with the
  same seed both engines draw the same tokens; on CUDA the race is compiled into a couple of fused
  passes over the logits, which stay in the model's dtype.

Architectures whose code does not dispatch attention through transformers' `AttentionInterface`
(or that ask it for attention sinks, position biases, ...) run on the HF engine instead, with one
warning naming why.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn
from transformers.cache_utils import DynamicCache, get_layer_types_and_kwargs

from relm.config.validate import ROLLOUT_QUANTIZATIONS
from relm.memory.rollout_budget import check_rollout_memory, rows_within_budget
from relm.models.fused_layers import FusedLayers
from relm.models.padding_probe import reads_padding_mask
from relm.rollout.base import GenerationOutput, SamplingParams, check_generate_args
from relm.rollout.hf_engine import HFRolloutEngine
from relm.rollout.native.attention import (
    CAUSAL_PREFILL,
    NATIVE_ATTENTION,
    NativeAttentionUnsupported,
    register_native_attention,
)
from relm.rollout.native.cuda_graphs import DecodeGraphs
from relm.rollout.native.decode_state import DecodeBuffers, Prompts, admit_rows, gather_rows
from relm.rollout.native.fp8 import Fp8Weights, activation_parts
from relm.rollout.native.fused_projections import FusedProjections
from relm.rollout.native.slot_scheduler import SlotScheduler
from relm.rollout.padding import left_pad
from relm.rollout.sampling import SampledColumns, exponential_race
from relm.rollout.tensor_parallel import group_size, local_numel

logger = logging.getLogger("relm")

COMPILE_MODES = (None, "default", "max-autotune-no-cudagraphs")
"""torch.compile modes the compiled pieces may use: those that leave CUDA graphs to the engine."""


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
            may take (`actor_rollout_ref.rollout.gpu_memory_utilization`); on CUDA a batch whose
            rows do not all fit decodes as many as fit at a time.
        use_cuda_graphs: capture decode steps in CUDA graphs; None means on CUDA devices.
        compile_layers: run norms, MLPs, rotary embeddings and sampling as torch.compile'd fused
            kernels while generating; None means on CUDA devices (on CPU compiling costs more than
            it saves at test sizes).
        max_prefill_tokens: prompt tokens per prefill forward: rows are chunked to stay under it,
            and a longer prompt is prefilled in chunks of this many columns
            (`actor_rollout_ref.rollout.max_num_batched_tokens`).
        eos_check_interval: decode steps between host checks for finished rows; None is 1 on CPU
            and 8 on CUDA, where each check stalls the launch queue.
        max_num_seqs: rows decoded at once (`actor_rollout_ref.rollout.max_num_seqs`); a batch with
            more rows is continuously batched. None: no limit but memory.
        compile_mode: torch.compile's mode for the compiled pieces (None: its default; the
            benchmark compares "max-autotune-no-cudagraphs", which also tunes the MLP products).
        fuse_projections: compute q/k/v and gate/up as one product each when the model is frozen
            (`relm.rollout.native.fused_projections`); False keeps them separate.
        vocab_limit: ids at or past this (the tokenizer's length) are never sampled; None: every
            embedding row may be (see `relm.rollout.sampling.SampledColumns`).
        quantization: "fp8" generates with FP8 copies of the linear layers' weights, re-quantized at
            every `sync_weights` (`relm.rollout.native.fp8`; `actor_rollout_ref.rollout.quantization`);
            None generates with the model's own weights.

    A model split over a tensor-parallel group (`relm.rollout.tensor_parallel`) generates eagerly:
    no CUDA graphs, compiled layers, fused projections or FP8 weights.
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
        max_num_seqs: int | None = None,
        compile_mode: str | None = None,
        fuse_projections: bool = True,
        vocab_limit: int | None = None,
        quantization: str | None = None,
    ) -> None:
        if quantization is not None and quantization not in ROLLOUT_QUANTIZATIONS:
            raise ValueError(
                f"quantization must be None or one of {ROLLOUT_QUANTIZATIONS}, got {quantization!r}"
            )
        if max_num_seqs is not None and max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        if compile_mode not in COMPILE_MODES:
            # The others capture CUDA graphs of their own, inside the engine's graph capture.
            raise ValueError(f"compile_mode must be one of {COMPILE_MODES}, got {compile_mode!r}")
        self.tp_size = group_size(model)
        """Ranks the model is split over (`relm.rollout.tensor_parallel`); 1 for a whole model."""
        if self.tp_size > 1:
            # A tensor-parallel copy (`relm.rollout.tensor_parallel`): its DTensor layers run eagerly;
            # fusing re-points weights into one buffer, which DTensor pieces cannot share.
            if quantization is not None:
                raise ValueError("FP8 rollout weights do not take a tensor-parallel model")
            use_cuda_graphs, compile_layers, fuse_projections = False, False, False
        self.model = model
        self.pad_token_id = pad_token_id
        self.vocab_limit = vocab_limit
        self.device = torch.device(device)
        self.eos_token_ids = torch.tensor(sorted(set(eos_token_ids)), dtype=torch.long, device=self.device)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        self.gpu_memory_utilization = gpu_memory_utilization
        self.max_prefill_tokens = max_prefill_tokens
        self.max_num_seqs = max_num_seqs
        self.eos_check_interval = eos_check_interval or (8 if self.device.type == "cuda" else 1)
        # The HF engine on the same module and sampling generator: the fallback for architectures
        # the native path cannot run, and the owner of weight syncing.
        self.hf_fallback = HFRolloutEngine(
            model, pad_token_id=pad_token_id, eos_token_ids=eos_token_ids, device=self.device,
            vocab_limit=vocab_limit,
        )  # fmt: skip
        self.hf_fallback.generator = self.generator
        self.heartbeat: Callable[[], None] = lambda: None
        """Called once per decoding step; the trainer's stall watchdog points it at its clock."""
        self.hf_fallback.heartbeat = lambda: self.heartbeat()  # the fallback reports through this engine
        use_cuda_graphs = self.device.type == "cuda" if use_cuda_graphs is None else use_cuda_graphs
        if use_cuda_graphs and self.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, not {self.device}")
        self.graphs = DecodeGraphs(self._decode_step, self._weight_tensors) if use_cuda_graphs else None
        compile_layers = self.device.type == "cuda" if compile_layers is None else compile_layers
        self.fused = FusedLayers(model, enabled=compile_layers, mode=compile_mode)
        # A frozen engine copy (the trainer's on GPU) gets its q/k/v and gate/up weights fused.
        self.projections = FusedProjections(model, enabled=fuse_projections)
        # FP8 copies of the linear weights (a fused group is one), quantized before the first call and
        # again at every sync; the actor's own weights are never touched.
        self.fp8 = (
            Fp8Weights(model, self.projections.groups, self.device, self.fused.compiled(activation_parts))
            if quantization
            else None
        )
        self._race = self.fused.compiled(exponential_race)
        self._buffers: DecodeBuffers | None = None
        self.fallback_reason = _native_blocker(model)
        """Why this model generates on the HF engine instead; None when the native path runs."""
        if self.fallback_reason:
            logger.warning("native rollout: %s; generating with the HF engine instead", self.fallback_reason)
        self.last_stats: dict[str, float] = {}
        """The last call: prefill_s, decode_s, decode_steps, slots (rows decoded at once), admissions
        (continuous batching's refills), graphs (captured so far), compiled."""

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> GenerationOutput:
        """Sample `params.n` responses per prompt, grouped prompt by prompt; tensors come back on CPU."""
        check_generate_args(prompts, params)
        if self.fallback_reason:
            return self._generate_on_fallback(prompts, params)
        if params.seed is not None:
            self.generator.manual_seed(params.seed)
        was_training = self.model.training
        previous_attention = self.model.config._attn_implementation  # type: ignore[union-attr]  # nn.Module hides the HF model's API
        self.model.eval()
        self.model.set_attn_implementation(NATIVE_ATTENTION)  # type: ignore[operator]  # nn.Module hides the HF model's API
        try:
            with (
                self.projections.applied(),
                self.fp8.applied() if self.fp8 else contextlib.nullcontext(),
                self.fused.applied(),
                _contiguous_head_input(self.model),
            ):
                return self._generate(prompts, params)
        except NativeAttentionUnsupported as exc:
            # Raised by the first prefill forward, before any sampling, so the fallback draws the
            # same random numbers this call would have.
            self.fallback_reason = str(exc)
            self.release_memory()
            logger.warning("native rollout: %s; generating with the HF engine instead", exc)
        finally:
            self.model.set_attn_implementation(previous_attention)  # type: ignore[operator]  # nn.Module hides the HF model's API
            self.model.train(was_training)
        return self._generate_on_fallback(prompts, params)

    def _generate_on_fallback(self, prompts: list[list[int]], params: SamplingParams) -> GenerationOutput:
        """The HF engine's call, with the FP8 weights when they are on (fused groups included)."""
        if self.fp8 is None:
            return self.hf_fallback.generate(prompts, params)
        with self.projections.applied(), self.fp8.applied():
            return self.hf_fallback.generate(prompts, params)

    def _generate(self, prompts: list[list[int]], params: SamplingParams) -> GenerationOutput:
        started = time.perf_counter()
        padded = Prompts(*(t.to(self.device) for t in left_pad(prompts, self.pad_token_id)))  # [U, P]
        num_rows = len(prompts) * params.n
        buffers, slots = self._ensure_buffers(num_rows, padded.width + params.max_new_tokens)
        if self.graphs is not None:
            self.graphs.check_weights()
        # Every row has a slot: lock-step, the one path there was before continuous batching, so a
        # batch that fits pays nothing for it (same graphs, same host checks).
        decode = self._decode_lock_step if slots >= num_rows else self._decode_continuously
        output, prefill_done, decode_steps, admissions = decode(buffers, padded, params, slots)
        self.last_stats = {
            "prefill_s": prefill_done - started,
            "decode_s": time.perf_counter() - prefill_done,
            "decode_steps": float(decode_steps),
            "slots": float(min(slots, num_rows)),
            "admissions": float(admissions),
            "graphs": float(self.graphs.num_graphs if self.graphs else 0),
            "compiled": float(self.fused.active),
        }
        return output

    def _decode_lock_step(
        self, buffers: DecodeBuffers, prompts: Prompts, params: SamplingParams, slots: int
    ) -> tuple[GenerationOutput, float, int, int]:
        """All rows at once, one shared write column, until the longest row ends (checked every few
        steps). Returns the output, when the prefill was done, decode steps and admissions (0)."""
        n, width, prompt_width = params.n, params.max_new_tokens, prompts.width
        num_rows = prompts.ids.shape[0] * n
        rows = self._row_bucket(num_rows)
        self._prefill(prompts.ids, prompts.mask, torch.arange(num_rows, device=self.device).view(-1, n))
        # Prompt columns as the prompt mask says, response columns switched on step by step; rows
        # past num_rows (row-bucket padding) attend only their own new column.
        buffers.mask.zero_()
        buffers.mask[:num_rows, 0, 0, :prompt_width] = prompts.mask.bool().repeat_interleave(n, dim=0)
        buffers.input_ids.fill_(self.pad_token_id)
        buffers.position_ids.zero_()
        next_position = prompts.mask.sum(dim=1).repeat_interleave(n)  # [N]: left padding does not shift
        self._sync()
        prefill_done = time.perf_counter()

        finished = torch.zeros(num_rows, dtype=torch.bool, device=self.device)
        stopped_by_eos = torch.zeros_like(finished)
        check_eos = not params.ignore_eos and self.eos_token_ids.numel() > 0
        columns = SampledColumns(self.pad_token_id, self.vocab_limit)
        for step in range(width):
            assert buffers.logits is not None, "the prefill wrote the first ones"
            token = columns.sample(buffers.logits[:num_rows], finished, params, self.generator, self._race)
            self.heartbeat()
            if check_eos:
                hit_eos = ~finished & torch.isin(token, self.eos_token_ids)
                stopped_by_eos |= hit_eos
                finished |= hit_eos
            if step + 1 == width:
                break
            # A host check stalls the queue of launched work, so it runs every few steps; steps
            # past the last live row only append padding, which `pack` would have written anyway.
            if check_eos and (step + 1) % self.eos_check_interval == 0 and bool(finished.all()):
                break
            column = prompt_width + step  # where this token's keys/values go
            buffers.lock_step_inputs(column, token, next_position)
            self._run_decode(rows, self._length_bucket(column + 1, buffers.max_length))
            next_position = next_position + 1
        output = columns.pack(stopped_by_eos, width)
        return output, prefill_done, len(columns.tokens) - 1, 0

    def _decode_continuously(
        self, buffers: DecodeBuffers, prompts: Prompts, params: SamplingParams, slots: int
    ) -> tuple[GenerationOutput, float, int, int]:
        """More rows than slots: each step decodes the slots' rows, each at its own column; between
        steps finished rows leave and waiting rows enter (see `relm.rollout.native.slot_scheduler`).

        Finishing by length is known to the host without looking at tokens; finishing by eos is
        seen at the host checks every `eos_check_interval` steps, which are also when freed slots
        refill. Random draws: each step draws for the slots, in slot order, so a seed gives other
        samples than the lock-step engines (greedy tokens are the same).
        """
        width, prompt_width = params.max_new_tokens, prompts.width
        scheduler = SlotScheduler(prompts.ids.shape[0], params.n, slots, width)
        rows = self._row_bucket(slots)
        buffers.reset_slots(self.pad_token_id)
        finished = torch.ones(slots, dtype=torch.bool, device=self.device)  # [S]; True = idle or done

        def admit(step: int, stash: torch.Tensor | None) -> torch.Tensor | None:
            plan = scheduler.admit(step)
            return (
                stash if plan is None else admit_rows(plan, buffers, prompts, finished, stash, self._prefill)
            )

        stash = admit(0, None)
        self._sync()
        prefill_done = time.perf_counter()
        check_eos = not params.ignore_eos and self.eos_token_ids.numel() > 0
        columns = SampledColumns(self.pad_token_id, self.vocab_limit)
        step, decode_steps = 0, 0
        while True:
            assert buffers.logits is not None, "the prefill wrote the first ones"
            token = columns.sample(buffers.logits[:slots], finished, params, self.generator, self._race)
            self.heartbeat()
            if check_eos:
                finished |= ~finished & torch.isin(token, self.eos_token_ids)
            leaving = scheduler.reaching_length(step)
            host_check = check_eos and (step + 1) % self.eos_check_interval == 0
            if host_check:
                done = finished.tolist()
                leaving += [slot for slot in scheduler.active_slots if done[slot]]
            if leaving:
                scheduler.retire(leaving, step)
                buffers.park(leaving, prompt_width)
            if scheduler.done:
                break
            if scheduler.num_active:
                buffers.per_row_inputs(token)
                live_columns = prompt_width + scheduler.longest_response(step)
                self._run_decode(rows, self._length_bucket(live_columns, buffers.max_length), per_row=True)
                decode_steps += 1
            # After the decode, whose logits for the new rows' slots their prefill overwrites. With
            # eos checked, refills wait for the host check, so that one prefill serves the rows that
            # ended by eos and those that reached their length since the last one.
            if host_check or not check_eos or not scheduler.num_active:
                stash = admit(step + 1, stash)
            step += 1
        output = gather_rows(
            columns.tokens, columns.masks, columns.logprobs, scheduler, width, self.pad_token_id,
            self.eos_token_ids if check_eos else None,
        )  # fmt: skip
        return output, prefill_done, decode_steps, scheduler.num_admissions - 1

    def _prefill(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, targets: torch.Tensor) -> None:
        """Run prompts [u, P] through the model and write prompt i's states and first logits into the rows
        `targets[i]` ([u, r]) of the cache and of `logits`.

        Prompts go through in forwards of at most `max_prefill_tokens` tokens, grouped by length
        (`prefill_chunks`): a forward covers only the columns its longest prompt uses, so the left
        padding that a batch of varied lengths carries is mostly not computed, and a forward of
        equal-length prompts has none and attends through the plain causal path. A prompt longer than
        the budget goes in chunks of columns.
        """
        buffers = self._buffers
        assert buffers is not None, "`_ensure_buffers` allocates them first"
        prompt_width = prompt_ids.shape[1]
        valid = prompt_mask.bool()  # [u, P]
        positions = (prompt_mask.cumsum(dim=1) - 1).clamp(min=0)
        causal = torch.ones(prompt_width, prompt_width, dtype=torch.bool, device=self.device).tril()
        # A padding query attends only itself: every query row then has an attended column (no 0/0
        # in softmax), and its own column is the last one it attends, as native_attention assumes.
        own = torch.eye(prompt_width, dtype=torch.bool, device=self.device)
        logits_kwargs = {"logits_to_keep": 1} if _accepts_logits_to_keep(self.model) else {}
        columns_per_chunk = min(prompt_width, self.max_prefill_tokens)
        lengths = valid.sum(dim=1).tolist()  # one host sync a prefill
        for rows, start in prefill_chunks(lengths, prompt_width, self.max_prefill_tokens):
            index = torch.tensor(rows, device=self.device)
            ids, mask_rows, pos, row_targets = (
                prompt_ids[index],
                valid[index],
                positions[index],
                targets[index],
            )
            # Longest first, so the group's first prompt fills every column from `start`: the group
            # has no padding when its last prompt is as long (known on the host, no device check).
            no_padding = lengths[rows[-1]] == prompt_width - start
            for first in range(start, prompt_width, columns_per_chunk):
                end = min(first + columns_per_chunk, prompt_width)
                # [u, 1, q, end - start]: queries first..end-1 over columns start..end-1, up to theirs
                seen = slice(start, end)
                mask = (mask_rows[:, None, None, seen] & causal[first:end, seen]) | own[first:end, seen]
                buffers.cache.begin_prefill(row_targets, first, start)
                unpadded = no_padding and first == start
                logits = self.model(
                    input_ids=ids[:, first:end],
                    attention_mask=mask,
                    position_ids=pos[:, first:end],
                    past_key_values=buffers.cache,
                    use_cache=True,
                    **logits_kwargs,
                    **({CAUSAL_PREFILL: True} if unpadded else {}),
                ).logits[:, -1]  # [u, V]
            self._store_logits(logits, row_targets)  # type: ignore[possibly-undefined]  # a group always has columns past `start`

    def _store_logits(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        """Write first-token logits [u, V] into the rows `targets` [u, r] of the logits buffer."""
        buffers = self._buffers
        assert buffers is not None, "`_ensure_buffers` allocates them first"
        vocab = logits.shape[1]
        if buffers.logits is None or buffers.logits.shape[1] != vocab or buffers.logits.dtype != logits.dtype:
            # The model's own logits dtype: sampling upcasts inside its fused kernel, and a bf16
            # buffer halves what each step writes and reads at 152k vocabulary entries a row.
            buffers.logits = torch.zeros(buffers.num_rows, vocab, dtype=logits.dtype, device=self.device)
        for rows in targets.t().contiguous():
            buffers.logits.index_copy_(0, rows, logits)

    def _run_decode(self, rows: int, kv_length: int, per_row: bool = False) -> None:
        """One decode step: the captured graph when there is one, else eagerly."""
        key = (rows, kv_length, True) if per_row else (rows, kv_length)
        if self.graphs is None or not self.graphs.run(*key):
            self._decode_step(*key)

    def _decode_step(self, rows: int, kv_length: int, per_row: bool = False) -> None:
        """One token for rows [0, rows) from the fixed buffers into `buffers.logits`; graph-capturable."""
        buffers = self._buffers
        assert buffers is not None, "`_ensure_buffers` allocates them first"
        buffers.cache.begin_decode(rows, kv_length, per_row)
        logits = self.model(
            input_ids=buffers.input_ids[:rows],
            position_ids=buffers.position_ids[:rows],
            attention_mask=buffers.mask[:rows, :, :, :kv_length],
            past_key_values=buffers.cache,
            use_cache=True,
        ).logits  # [rows, 1, V]
        assert buffers.logits is not None, "the prefill allocates them"
        buffers.logits[:rows].copy_(logits[:, -1])

    def _row_bucket(self, num_rows: int) -> int:
        """Rows a decode step runs: exact when eager; with graphs rounded up so that batches of
        nearby sizes (validation, dynamic sampling rounds) replay the same graphs."""
        if self.graphs is None:
            return num_rows
        if num_rows <= 128:
            return 1 << (num_rows - 1).bit_length()
        return -(-num_rows // 128) * 128

    def _bucket_at_most(self, num_rows: int) -> int:
        """The largest row bucket of at most `num_rows` rows (>= 1)."""
        if self.graphs is None:
            return num_rows
        return num_rows // 128 * 128 if num_rows >= 128 else 1 << (num_rows.bit_length() - 1)

    def _length_bucket(self, live_columns: int, max_length: int) -> int:
        """Cache columns a step reads: exact when eager; with graphs rounded up to one of at most
        ~16 lengths, so attention reads little more than the live part and few graphs are captured."""
        if self.graphs is None:
            return live_columns
        granularity = max(64, -(-max_length // 16 // 64) * 64)
        return min(max_length, -(-live_columns // granularity) * granularity)

    def _ensure_buffers(self, num_rows: int, length: int) -> tuple[DecodeBuffers, int]:
        """Buffers of at least `length` columns, and the slots (rows decoded at once) they give a call
        of `num_rows` rows: all of them, or fewer when `max_num_seqs` or the memory budget says so.
        Smaller calls reuse the buffers; reallocating drops every graph (they read the old ones)."""
        wanted = min(num_rows, self.max_num_seqs or num_rows)
        current = self._buffers
        rows = self._row_bucket(wanted)
        if current is not None:
            rows, length = max(rows, current.num_rows), max(length, current.max_length)
        rows = self._rows_within_budget(rows, length)
        if current is None or current.num_rows < rows or current.max_length < length:
            self.release_memory()
            current = self._buffers = DecodeBuffers.allocate(rows, length, self.pad_token_id, self.device)
        return current, min(wanted, current.num_rows)

    def _rows_within_budget(self, rows: int, length: int) -> int:
        """`rows`, or on CUDA the largest row bucket under it whose cache fits the engine's share of
        the GPU; not even one row fitting is the user's error (raised before allocating)."""
        if self.device.type != "cuda":
            return rows
        budget = dict(
            config=self.model.config.get_text_config(),  # type: ignore[union-attr,operator]  # nn.Module hides the HF model's API
            weight_bytes=sum(local_numel(t) * t.element_size() for t in self._weight_tensors()),
            dtype_bytes=next(self.model.parameters()).element_size(),
            length=length,
            gpu_memory_utilization=self.gpu_memory_utilization,
            total_bytes=torch.cuda.get_device_properties(self.device).total_memory,
            tp_size=self.tp_size,
        )
        fit = rows_within_budget(**budget)
        if fit >= rows:
            return rows
        if fit < 1:
            check_rollout_memory(rows=1, **budget)  # raises, naming the share and the need
        fitted = self._bucket_at_most(fit)
        logger.info(
            "native rollout: %d rows of %d tokens exceed gpu_memory_utilization=%s; decoding %d at a time",
            rows, length, self.gpu_memory_utilization, fitted,
        )  # fmt: skip
        return fitted

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
        """Load the actor's weights by HF name, in place (see `HFRolloutEngine.sync_weights`), and
        re-quantize the FP8 copies from them; in-place copies keep every address, so captured graphs
        stay valid."""
        self.hf_fallback.sync_weights(named_tensors)
        if self.fp8 is not None:
            self.fp8.quantize()


def _native_blocker(model: nn.Module) -> str | None:
    """Why the native path cannot drive `model` (one clause), or None."""
    if not hasattr(model, "set_attn_implementation") or not hasattr(model, "config"):
        return f"{type(model).__name__} is not a transformers model"
    if not model._can_set_attn_implementation():  # type: ignore[operator]  # nn.Module hides the HF model's API
        return f"{type(model).__name__} does not dispatch attention through transformers' AttentionInterface"
    if "past_key_values" not in inspect.signature(model.forward).parameters:
        return f"{type(model).__name__} keeps a cache of its own (its forward takes no past_key_values)"
    try:
        DynamicCache(config=model.config)  # type: ignore[arg-type]  # nn.Module hides the HF model's API
    except (AttributeError, KeyError, TypeError) as exc:
        # BLT: its four sub-models give transformers' cache no layer plan, and its forward wraps any cache
        # it is given in one it builds from the config.
        return (
            f"transformers' cache cannot read {type(model).__name__}'s config ({type(exc).__name__}: {exc})"
        )
    stateful = _stateful_layer_types(model.config)
    if stateful:
        return (
            f"{type(model).__name__} has {', '.join(stateful)} layers, whose state (recurrent, convolution "
            "or sparse-index keys) the native KV cache does not carry"
        )
    if not reads_padding_mask(model):
        return (
            f"{type(model).__name__} does not read the attention mask, and the native engine runs prompts "
            "of different lengths left-padded together"
        )
    register_native_attention()
    return None


_KV_LAYER_TYPES = frozenset({"full_attention", "sliding_attention", "chunked_attention"})
"""Layer kinds whose whole cache is keys and values, what `PreallocatedKVCache` holds."""


_STATELESS_BLOCKS = frozenset({"attention", "moe", "mlp", "dense"})
"""Block names (outside `layer_types`) whose cache is keys and values, or nothing."""


def _stateful_layer_types(config: Any) -> list[str]:
    """The layer kinds of `config` (as transformers' own cache reads them) that keep more than keys and
    values: linear attention, SSM or convolution state, sparse indexers' keys (`indexed_attention`)."""
    try:
        layer_types, _ = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
    except Exception:  # noqa: BLE001 - a config transformers' cache cannot read: the first forward will tell
        return []
    text = config.get_text_config(decoder=True)
    # Older hybrids name their blocks elsewhere (RecurrentGemma's block_types, Zamba's layers_block_type).
    blocks = [getattr(text, name, None) or [] for name in ("block_types", "layers_block_type")]
    kinds = set(layer_types) | {kind for names in blocks for kind in names if isinstance(kind, str)}
    return sorted(kind for kind in kinds if kind not in _KV_LAYER_TYPES and kind not in _STATELESS_BLOCKS)


def prefill_chunks(lengths: list[int], width: int, budget: int) -> list[tuple[list[int], int]]:
    """Prompts (by index) grouped into prefill forwards of at most `budget` tokens, longest first.

    Prompts are left-padded to `width` columns; a forward over prompts of at most L tokens needs only
    the last L columns, so each group comes with its first column, width - L. Sorting by length puts
    prompts of similar length together (less padding computed) and equal lengths together (none).
    A prompt longer than the budget is a group of its own, chunked by columns by the caller.

    Returns:
        [(prompt indices, first column)] covering every index once.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    chunks: list[tuple[list[int], int]] = []
    at = 0
    while at < len(order):
        longest = max(1, lengths[order[at]])
        count = max(1, min(budget // longest, len(order) - at))
        chunks.append((order[at : at + count], width - longest))
        at += count
    return chunks


@contextlib.contextmanager
def _contiguous_head_input(model: nn.Module) -> Iterator[None]:
    """Make the output head's input contiguous while generating.

    A prefill keeps the last position's hidden states only (`logits_to_keep=1`): a [u, 1, hidden]
    slice of [u, q, hidden], not contiguous, which `F.linear` runs as a batched product with the head's
    weight expanded per prompt, reading all of it (467 MB at Qwen's 152k vocabulary) once per prompt.
    An H200 profile of prefill showed one 3.3 ms batched product per 8k-token forward, which that
    explains; the prefill time after this change moved within the spread between runs, so the saving
    is not separately measured. Contiguous, it is one product reading the weight once.
    """
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None  # type: ignore[operator]  # nn.Module hides the HF model's API
    if not isinstance(head, nn.Module):
        yield
        return
    handle = head.register_forward_pre_hook(lambda _, args: (args[0].contiguous(), *args[1:]))
    try:
        yield
    finally:
        handle.remove()


def _accepts_logits_to_keep(model: nn.Module) -> bool:
    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
