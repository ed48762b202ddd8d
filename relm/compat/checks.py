"""The compatibility check of one model: tokenizer, load, rollout, one full actor-critic update.

Each stage uses the component `relm train` uses (the tokenizer loader and preflight, the model loader,
the HF rollout engine, the trainer's forward and `ppo_step`), so a pass here means the training run
would get through the same code, not a look-alike of it. The tokenizer stage builds no weights, so
`tokenizer_only` answers "what will relm pad with, stop on and feed this model" for any size in seconds.
"""

from __future__ import annotations

import gc
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import GenerationConfig, PreTrainedTokenizerBase

from relm.compat.measure import MemoryMeter, StageTimeout, collect_warnings, time_limit
from relm.compat.report import ModelReport, StageName, StageResult
from relm.compat.tokenizer_facts import tokenizer_facts
from relm.compat.verdicts import (
    CheckFailed,
    attends_to_later_tokens,
    changed_fraction,
    check_engine_agreement,
    check_generation,
    check_update_metrics,
    sample_weights,
)
from relm.data.prompt_batch import PromptBatch
from relm.errors import UserError
from relm.memory.choices import cap_gpu_bytes
from relm.memory.host import HostWatchdog, watching
from relm.models.loading import load_causal_lm, pick_dtype, read_config, resolve_model_dir
from relm.models.padding_probe import left_padding_gap
from relm.models.registry import classify, inspect_model_architecture, registered_model_class
from relm.models.tokenizer import encode_prompt, load_tokenizer
from relm.rollout.base import FINISH_STOP, SamplingParams, logprob_tolerance
from relm.rollout.hf_engine import HFRolloutEngine

PROMPTS = ("k", "Count to three.", "Write one short sentence about the sea, then stop.")
"""Different lengths, so left padding and per-row positions are part of every rollout check."""


@dataclass
class CompatOptions:
    """How each model is checked."""

    device: str = "auto"
    """cpu, cuda or auto (cuda when visible)."""
    steps: int = 1
    """PPO steps in the update stage."""
    stage_timeout_s: float = 600.0
    """A stage running longer fails with `Timeout`."""
    samples_per_prompt: int = 2
    max_new_tokens: int = 16
    seed: int = 0
    tokenizer_path: str | None = None
    dtype: str = "auto"
    """Training dtype (`actor_rollout_ref.model.dtype`): auto is bf16 on GPU, fp32 on CPU."""
    rollout: str | None = None
    """Engine of both stages (`native`, `hf`, `vllm`); None: the HF engine in the rollout stage and
    the default engine in the update stage."""
    tokenizer_only: bool = False
    """Run the tokenizer stage alone (no weights built); the other stages are reported skipped."""
    max_gpu_memory_gb: float | None = None
    """GPU budget (`trainer.max_gpu_memory_gb`): the update stage's plan and torch's allocator keep to it."""
    max_host_memory_gb: float | None = None
    """Host budget (`trainer.max_host_memory_gb`): the update stage's plan keeps to it and every stage runs
    under the host-memory watchdog."""
    lora_rank: int = 0
    """The update stage trains LoRA adapters of this rank on actor and critic (0: every weight); a model
    that passes this way is `conditional` on it."""


@dataclass
class _Loaded:
    tokenizer: PreTrainedTokenizerBase
    model: nn.Module
    dtype: torch.dtype


def check_model_guarded(model: str, options: CompatOptions) -> ModelReport:
    """`check_model`, with anything it raises outside a stage reported as this model's failure, so one
    model never ends the command and the others' reports with it (the user's mistakes still raise)."""
    try:
        return check_model(model, options)
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - a model's failure is the report's content
        report = ModelReport(model=model, status="fail", classification="unknown", reason=_one_line(exc))
        report.stages.append(
            StageResult("load", "fail", error_class=type(exc).__name__, error=_one_line(exc))
        )
        return report


def check_model(model: str, options: CompatOptions) -> ModelReport:
    """Run the four stages on `model` (folder, Hub id in the local cache, or `zoo:NAME`).

    Raises:
        UserError: `model` does not name a model folder (the caller's mistake, not the model's).
    """
    from relm.trainer.components import pick_device

    folder = resolve_model_dir(model)
    device = pick_device(options.device)
    budget = options.max_gpu_memory_gb
    cap_gpu_bytes(None if budget is None else int(budget * 1e9), device)
    report = ModelReport(model=model, status="pass", classification="", reason="", model_dir=folder)
    if options.lora_rank:
        report.conditions.append(f"LoRA rank {options.lora_rank} in the update stage (--lora-rank)")
    try:
        config = read_config(folder, model, trust_remote_code=False)
    except UserError as exc:
        report.classification, report.reason = "unknown", str(exc)
        report.stages.append(StageResult("load", "fail", error_class="UserError", error=str(exc)))
        return _finish(report)
    verdict = classify(config)
    report.classification, report.reason = verdict.status, verdict.reason
    if verdict.status == "unsupported":
        report.status = "unsupported"
        return report
    try:
        report.architecture = inspect_model_architecture(config)
    except Exception as exc:  # noqa: BLE001 - the description is a courtesy; the stages still run
        report.decisions.append(f"architecture not described ({type(exc).__name__}: {_one_line(exc)})")
    if verdict.status == "probe":
        report.decisions.append(f"probed: {verdict.architecture} is not on relm's verified list")
    elif verdict.reason.startswith("transformers builds"):
        report.decisions.append(f"config names {verdict.architecture}; {verdict.reason}")
    registered = registered_model_class(verdict.architecture)
    if registered is not None and registered.__name__ != verdict.architecture:
        report.decisions.append(f"built as {registered.__name__} (registered for {verdict.architecture})")

    loaded: dict[str, _Loaded] = {}
    tokenizers: dict[str, PreTrainedTokenizerBase] = {}
    stages: list[tuple[StageName, Callable[[dict[str, float]], None]]] = [
        ("tokenizer", lambda metrics: _tokenizer(folder, config, options, report, tokenizers, metrics)),
        ("load", lambda metrics: _load(folder, options, device, report, tokenizers["it"], loaded, metrics)),
        ("rollout", lambda metrics: _rollout(loaded["it"], folder, options, device, metrics)),
        ("update", lambda metrics: _update_or_lora(folder, options, device, config, metrics, report)),
    ]
    for name, run in stages:
        if report.failed_stage is not None or (options.tokenizer_only and name != "tokenizer"):
            report.stages.append(StageResult(name, "skipped"))
            continue
        report.stages.append(_run_stage(name, run, options, device, report))
        if name == "load" and "it" in loaded:
            try:
                refusal = attends_to_later_tokens(loaded["it"].model, len(loaded["it"].tokenizer), device)
            except Exception:  # noqa: BLE001 - a forward that fails here fails the rollout stage, with its line
                refusal = None
            if refusal is not None:
                report.status, report.classification, report.reason = "unsupported", "unsupported", refusal
                return report
        if name == "rollout":
            loaded.clear()  # the update stage builds its own models, as `relm train` does
            _release(device)
    _release(device)
    return _finish(report)


def _one_line(exc: BaseException) -> str:
    """The exception's first line (its class name when it has no text, as a bare AssertionError)."""
    lines = str(exc).strip().splitlines()
    return (lines[0] if lines else type(exc).__name__)[:300]


def _finish(report: ModelReport) -> ModelReport:
    if report.failed_stage is not None:
        report.status = "fail"
    elif report.conditions:
        report.status = "conditional"
    return report


def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _run_stage(
    name: StageName,
    run: Callable[[dict[str, float]], None],
    options: CompatOptions,
    device: torch.device,
    report: ModelReport,
) -> StageResult:
    """Time, meter and guard one stage; any exception becomes the stage's one-line error.

    The stage writes its metrics as it goes, so a failing stage still reports what it measured.
    """
    result = StageResult(name, "pass")
    start = time.perf_counter()
    with collect_warnings() as warnings, MemoryMeter(device) as meter:
        try:
            host_budget = options.max_host_memory_gb
            watchdog = HostWatchdog(
                lambda: f"compat's {name} stage",
                budget_bytes=None if host_budget is None else int(host_budget * 1e9),
            )
            with time_limit(options.stage_timeout_s), watching(watchdog):
                run(result.metrics)
        except StageTimeout as exc:
            result.status, result.error_class, result.error = "fail", "Timeout", str(exc)
        except Exception as exc:  # noqa: BLE001 - a model's failure is the report's content
            result.status, result.error_class = "fail", type(exc).__name__
            result.error = _one_line(exc)
    result.seconds = time.perf_counter() - start
    result.peak_memory_mb, result.memory_kind = meter.peak_mb, meter.kind
    report.warnings.extend(w for w in warnings.messages if w not in report.warnings)
    return result


def _tokenizer(
    folder: str,
    config: Any,
    options: CompatOptions,
    report: ModelReport,
    out: dict[str, PreTrainedTokenizerBase],
    metrics: dict[str, float],
) -> None:
    """The tokenizer through the preflight, and the facts relm relies on (`report.tokenizer`).

    Fails when a token has no embedding row or the chat template cannot render one user message:
    either would break the first training step.
    """
    with collect_warnings() as warnings:
        tokenizer = load_tokenizer(options.tokenizer_path or folder)
    pad_chosen = any("no pad token" in message for message in warnings.messages)
    if pad_chosen:
        report.decisions.append(
            f"pad token {tokenizer.pad_token!r} (id {tokenizer.pad_token_id}): the tokenizer names none"
        )
    if not tokenizer.chat_template:
        report.decisions.append("no chat template: prompts are plain text")
    generation_config = (
        GenerationConfig.from_pretrained(folder)
        if (Path(folder) / "generation_config.json").is_file()
        else None
    )
    rows = getattr(config.get_text_config(), "vocab_size", None)
    facts = tokenizer_facts(
        tokenizer, embedding_rows=rows, generation_config=generation_config, pad_chosen_by_relm=pad_chosen
    )
    report.tokenizer = facts
    metrics["tokenizer_length"] = float(facts.length)
    if rows is not None:
        metrics["embedding_rows"] = float(rows)
    if rows is not None and facts.length > rows:
        raise CheckFailed(f"tokenizer has {facts.length} tokens but the embedding only {rows} rows")
    if facts.template_error:
        raise CheckFailed(f"the chat template cannot render one user message ({facts.template_error})")
    out["it"] = tokenizer


def _load(
    folder: str,
    options: CompatOptions,
    device: torch.device,
    report: ModelReport,
    tokenizer: PreTrainedTokenizerBase,
    out: dict[str, _Loaded],
    metrics: dict[str, float],
) -> None:
    """The model as the trainer loads it (with the tokenizer stage's tokenizer); records relm's choices."""
    dtype = pick_dtype(options.dtype, device)
    # Frozen: the load and rollout checks never train it, and the native engine then generates with
    # fused q/k/v and gate/up products, as with the trainer's GPU engine copy.
    model = load_causal_lm(folder, dtype=dtype, device=device, seed=options.seed).requires_grad_(False)
    metrics["num_parameters"] = float(sum(p.numel() for p in model.parameters()))
    attn = getattr(model.config, "_attn_implementation", "?")
    capped = report.architecture is not None and report.architecture.attn_logit_softcapping
    if attn == "eager" and capped:
        report.decisions.append("eager attention: sdpa would skip the attention soft-capping")
    elif attn == "eager" and _attention_free(model):
        report.decisions.append("eager attention: an attention-free model (transformers offers it no sdpa)")
    elif attn == "eager":
        report.conditions.append("eager attention: transformers refused sdpa for this architecture")
    num_rows = model.get_input_embeddings().weight.shape[0]  # type: ignore[index]  # nn.Module hides the HF model's API
    if report.tokenizer is not None:
        report.tokenizer.embedding_rows = int(num_rows)  # the built model's, over the config's
    if len(tokenizer) > num_rows:
        raise CheckFailed(f"tokenizer has {len(tokenizer)} tokens but the embedding only {num_rows} rows")
    out["it"] = _Loaded(tokenizer, model, dtype)


def _attention_free(model: nn.Module) -> bool:
    """No softmax attention for sdpa to run: no module named attention (Mamba, xLSTM), or a config with no
    attention head count (RWKV, whose time-mixing module is named `RwkvSelfAttention`)."""
    if not any("Attention" in type(m).__name__ for m in model.modules()):
        return True
    text = model.config.get_text_config()  # type: ignore[union-attr,operator]  # nn.Module hides the HF model's API
    return getattr(text, "num_attention_heads", None) is None


def _rollout(
    loaded: _Loaded, folder: str, options: CompatOptions, device: torch.device, metrics: dict[str, float]
) -> None:
    """Generate with the chosen engine; check the outputs and that the trainer's forward agrees."""
    from relm.trainer.components import eos_token_ids_of  # the trainer's own choice of stop ids

    tokenizer, model = loaded.tokenizer, loaded.model
    prompts = [encode_prompt(tokenizer, [{"role": "user", "content": text}]) for text in PROMPTS]
    eos_ids = eos_token_ids_of(tokenizer, model)
    engine = _rollout_engine(loaded, folder, options, device, eos_ids, max(map(len, prompts)))
    try:
        _check_rollout(engine, loaded, prompts, eos_ids, options, device, metrics)
    finally:
        getattr(engine, "close", lambda: None)()  # vLLM's engine holds its own weights and KV cache


def _check_rollout(
    engine: Any,
    loaded: _Loaded,
    prompts: list[list[int]],
    eos_ids: list[int],
    options: CompatOptions,
    device: torch.device,
    metrics: dict[str, float],
) -> None:
    from relm.trainer.experience import batched_logprobs, build_rollout

    tokenizer, model = loaded.tokenizer, loaded.model
    params = SamplingParams(
        n=options.samples_per_prompt,
        max_new_tokens=options.max_new_tokens,
        temperature=1.0,
        seed=options.seed,
    )
    start = time.perf_counter()
    gen = engine.generate(prompts, params)
    latency = time.perf_counter() - start
    num_tokens = int(gen.response_mask.sum())
    metrics |= {
        "tokens_per_s": num_tokens / latency,
        "rollout_latency_s": latency,
        "generated_tokens": float(num_tokens),
        "stop_fraction": gen.finish_reasons.count(FINISH_STOP) / len(gen.finish_reasons),
    }
    vocab_rows = model.get_input_embeddings().weight.shape[0]  # type: ignore[operator]  # nn.Module hides the HF model's API
    check_generation(gen, vocab_rows, tokenizer.pad_token_id, eos_ids, options.max_new_tokens)

    n = options.samples_per_prompt
    batch = build_rollout(
        PromptBatch(
            prompts,
            ["compat"] * len(prompts),
            [None] * len(prompts),
            [{}] * len(prompts),
            list(range(len(prompts))),
        ),
        gen,
        n=n,
        pad_token_id=tokenizer.pad_token_id,
    )
    trainer = batched_logprobs(model, batch, rows_per_forward=len(batch), temperature=1.0, device=device)
    mask = gen.response_mask.bool()
    diff = (trainer - gen.logprobs).abs()[mask]
    worst, mean = diff.max().item(), diff.mean().item()
    metrics |= {"logprob_max_abs_diff": worst, "logprob_mean_abs_diff": mean}
    max_tolerance, mean_tolerance = logprob_tolerance(loaded.dtype)
    if not (worst <= max_tolerance and mean <= mean_tolerance):
        why = "the engine and the training forward do not compute the same model"
        padding_gap = left_padding_gap(model)
        if padding_gap is not None:
            why = (
                f"the model does not read the attention mask (3 left pad tokens move its logits by "
                f"{padding_gap:.3g}), and even with its pads moved after the real tokens the two disagree"
            )
        raise CheckFailed(
            f"rollout and trainer logprobs differ by {worst:.3g} max, {mean:.3g} mean (allowed "
            f"{max_tolerance:g}, {mean_tolerance:g}): {why}"
        )


def _rollout_engine(
    loaded: _Loaded,
    folder: str,
    options: CompatOptions,
    device: torch.device,
    eos_ids: list[int],
    longest_prompt: int,
) -> Any:
    """The engine `options.rollout` names (the HF engine when unset), over the loaded model."""
    tokenizer, model = loaded.tokenizer, loaded.model
    common = dict(pad_token_id=tokenizer.pad_token_id, eos_token_ids=eos_ids, device=device)
    if options.rollout == "vllm":
        from relm.rollout.vllm_engine import VLLMRolloutEngine, VLLMSettings

        settings = VLLMSettings(
            dtype=loaded.dtype, max_model_len=longest_prompt + options.max_new_tokens, seed=options.seed
        )
        return VLLMRolloutEngine(model, folder, settings=settings, **common)
    if options.rollout == "native":
        from relm.rollout.native.engine import NativeRolloutEngine

        return NativeRolloutEngine(model, seed=options.seed, **common)
    return HFRolloutEngine(model, seed=options.seed, **common)


def _update_or_lora(
    folder: str,
    options: CompatOptions,
    device: torch.device,
    config: Any,
    metrics: dict[str, float],
    report: ModelReport,
) -> None:
    """The update stage; where the memory plan says full fine-tuning does not fit the card (or budget) but
    LoRA would, the stage runs again with LoRA of the offered rank, as a user following the line would,
    and the model is conditional on it. The plan decides before any weight is built, so the first try
    costs seconds."""
    from relm.memory.choices import RunDoesNotFit

    try:
        _update(folder, options, device, config, metrics)
    except RunDoesNotFit as exc:
        if options.lora_rank or exc.lora_rank is None:
            raise
        _release(device)
        report.conditions.append(
            f"LoRA rank {exc.lora_rank} on actor and critic: full fine-tuning does not fit "
            f"({str(exc).partition(': ')[2].partition('; LoRA')[0]})"
        )
        _update(folder, replace(options, lora_rank=exc.lora_rank), device, config, metrics)


def _update(
    folder: str, options: CompatOptions, device: torch.device, config: Any, metrics: dict[str, float]
) -> None:
    """`steps` full PPO steps with critic, reference and KL loss, through the trainer's `ppo_step`."""
    from relm.config.loader import load_config
    from relm.config.translate import translate
    from relm.config.validate import validate_config
    from relm.data.demo_task import write_demo_parquet
    from relm.learner.compact_adamw import CompactAdamW
    from relm.models.zoo import default_cache_dir
    from relm.trainer.components import build_components
    from relm.trainer.ppo import ppo_step

    train_file, _ = write_demo_parquet(default_cache_dir() / "demo")
    with tempfile.TemporaryDirectory(prefix="relm-compat-") as run_dir:
        cfg = load_config(_update_overrides(folder, train_file, run_dir, options, device))
        text = config.get_text_config()
        validate_config(cfg, max_position_embeddings=getattr(text, "max_position_embeddings", None))
        components = build_components(translate(cfg)[0], folder)
        engine_name = cfg.actor_rollout_ref.rollout.name
        before = sample_weights(components.actor.module)
        for step in range(1, options.steps + 1):
            step_metrics = ppo_step(components, components.loader.next_batch(), step)
            metrics |= {key: float(step_metrics[key]) for key in _KEPT_UPDATE_METRICS if key in step_metrics}
            check_update_metrics(step_metrics, step)
            check_engine_agreement(step_metrics, step, pick_dtype(options.dtype, device), engine_name)
        changed = changed_fraction(before, sample_weights(components.actor.module))
        metrics["actor_weights_changed"] = changed
        if options.rollout == "vllm":  # its own copy of the weights: the synced copy must be the actor's
            worst, _ = components.engine.check_agreement()  # type: ignore[attr-defined]  # the vLLM engine's, reached through WatchedEngine
            metrics["weight_sync_logprob_diff_max"] = worst
            components.engine.close()  # type: ignore[attr-defined]  # the vLLM engine's, reached through WatchedEngine
        dtype = next(components.actor.module.parameters()).dtype
        # bf16 weights that CompactAdamW rounds stochastically move in expectation: at lr 1e-6 about 1% of
        # them take a whole bf16 step, so only a step that moved none was lost.
        stochastic = dtype == torch.bfloat16 and isinstance(components.actor.optimizer, CompactAdamW)
        if changed < 0.5 and not (stochastic and changed > 0):
            raise CheckFailed(
                f"the update changed {changed:.0%} of the actor's weights (median over tensors) at lr "
                f"{cfg.actor_rollout_ref.actor.optim.lr:g} on {str(dtype).removeprefix('torch.')} weights: "
                "steps below the weights' rounding step are lost (keep fp32 master weights)"
            )


_KEPT_UPDATE_METRICS = (
    "actor/pg_loss",
    "actor/kl_loss",
    "critic/vf_loss",
    "actor/grad_norm",
    "critic/grad_norm",
    "timing_s/step",
    "rollout/logprob_diff_max",
    "rollout/logprob_diff_mean",
    "perf/max_memory_allocated_gb",
    "perf/plan_gpu_gb",
    "perf/plan_host_gb",
    "perf/max_host_memory_gb",
)


def _update_overrides(
    folder: str, train_file: Any, run_dir: str, options: CompatOptions, device: torch.device
) -> list[str]:
    """A tiny actor-critic run: 2 prompts x 2 samples, two micro-batches, reference + KL loss."""
    overrides = [
        f"actor_rollout_ref.model.path='{folder}'",
        f"actor_rollout_ref.model.dtype={options.dtype}",
        f"data.train_files=['{train_file}']",
        # Unshuffled: the first two rows ask for different letters, so the stand-in reward differs
        # between them even when every response decodes to nothing.
        "data.shuffle=false",
        "data.max_prompt_length=64",
        f"data.max_response_length={options.max_new_tokens}",
        "data.train_batch_size=2",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        # Two micro-batches per mini-batch, so gradient accumulation is part of the check.
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "critic.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "algorithm.adv_estimator=gae",
        f"trainer.total_training_steps={options.steps}",
        f"trainer.device={device.type}",
        f"trainer.default_local_dir='{run_dir}'",
        "trainer.logger=[]",
        "trainer.save_freq=-1",
        f"seed={options.seed}",
        f"custom_reward_function.path='{Path(__file__).with_name('reward.py')}'",
        "custom_reward_function.name=compute_score",
        # relm's own constant-time stand-in: no reward workers to start for every model checked.
        "reward_model.num_workers=0",
    ]
    if options.rollout is not None:
        overrides.append(f"actor_rollout_ref.rollout.name={options.rollout}")
    for key in ("max_gpu_memory_gb", "max_host_memory_gb"):
        if getattr(options, key) is not None:
            overrides.append(f"trainer.{key}={getattr(options, key)}")
    if options.tokenizer_path:
        overrides.append(f"actor_rollout_ref.model.tokenizer_path='{options.tokenizer_path}'")
    if options.lora_rank:
        overrides += [
            f"{section}.lora_rank={options.lora_rank}"
            for section in ("actor_rollout_ref.model", "critic.model")
        ]
    return overrides
