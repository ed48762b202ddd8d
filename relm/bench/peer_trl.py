"""TRL's `GRPOTrainer` as the peer of `relm bench step --algo grpo --peer trl`.

The peer trains the same model folder on the same prompts (same token lengths), `n`, response
length and micro-batch as relm's GRPO steps, with TRL's own rollout (HF `generate`, no vLLM), and
times each optimizer step the way relm times a step: prompt + response tokens of the step over its
wall time, per GPU. TRL is not a dependency of relm; `require_trl` turns its absence into one line.

How relm's (verl's) settings become `GRPOConfig` fields, so both do the same work per step:

| relm / verl key | GRPOConfig | why |
| --- | --- | --- |
| `data.train_batch_size` x `rollout.n` | `generation_batch_size` (derived) | one generate call per step |
| `rollout.n` | `num_generations` | group size |
| `actor.ppo_micro_batch_size_per_gpu` | `per_device_train_batch_size` | responses per forward/backward |
| (train_batch_size x n) / micro | `gradient_accumulation_steps` | one optimizer update per step |
| `actor.ppo_epochs` (must be 1) | `num_iterations=1` | no reuse of a generation |
| `data.max_response_length` | `max_completion_length` | |
| `rollout.ignore_eos` | `generation_kwargs.min_new_tokens` | eos is masked until the last token |
| `actor.kl_loss_coef` (with `use_kl_loss`) | `beta` (0 without) | beta > 0 loads a reference model |
| `actor.clip_ratio_low` / `_high` | `epsilon` / `epsilon_high` | |
| `actor.loss_agg_mode` | `loss_type` | token-mean: dapo, seq-mean-token-mean: grpo, ...-sum-norm: dr_grpo |
| `algorithm.norm_adv_by_std_in_grpo` | `scale_rewards` group / none | |
| `actor.optim.*`, `actor.grad_clip` | AdamW fields, `max_grad_norm`, constant schedule | |
| `model.enable_gradient_checkpointing` | `gradient_checkpointing` | |
| `model.dtype` (auto) | fp32 weights + `bf16=True` on CUDA | TRL's own default and relm's recipe |
| `rollout.temperature` / `top_p` / `top_k` | same names (top_k -1 -> 0) | |
| the bench's `relm/letters` reward | `reward_funcs=[letters_reward]` | the same scorer |

Not matched (they do not change the work of a step, or TRL has no counterpart): TRL's reference
model keeps the policy's dtype (fp32 under autocast; relm's is a bf16 copy), TRL always uses the k3
KL estimator, and relm's dual-clip bound has no TRL counterpart. relm also runs one old-logprob
forward TRL skips when generation and update are aligned.
"""

from __future__ import annotations

import gc
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME

from relm.config.schema import RelmConfig
from relm.errors import UserError
from relm.models.loading import load_causal_lm
from relm.models.precision import pick_precision
from relm.rewards.registry import default_compute_score

WARMUP_RESPONSE_LEN = 8
"""Response length of the warm-up trainer: a full-length TRL warm-up step would double the run."""
LOSS_TYPES = {"token-mean": "dapo", "seq-mean-token-mean": "grpo", "seq-mean-token-sum-norm": "dr_grpo"}


def require_trl() -> str:
    """TRL's version, or a UserError naming the install command (TRL and datasets are not relm deps)."""
    try:
        import datasets  # noqa: F401
        import trl
    except ImportError as exc:
        raise UserError(
            f"--peer trl: TRL is not importable ({exc}); install it with `pip install trl`"
        ) from exc
    return trl.__version__


def grpo_config_kwargs(
    cfg: RelmConfig, device: torch.device, output_dir: str, max_steps: int, response_len: int | None = None
) -> dict[str, Any]:
    """`GRPOConfig` keyword arguments that mirror relm's GRPO settings (table in the module docstring).

    Args:
        cfg: relm's validated config of the GRPO bench run.
        device: where relm trains; cpu sets `use_cpu`, cuda turns on bf16 autocast as relm does.
        output_dir: TRL's output folder (nothing is saved there).
        max_steps: optimizer steps to run.
        response_len: overrides `data.max_response_length` (the short warm-up).

    Raises:
        UserError: a setting TRL cannot mirror with one generation and one update per step.
    """
    arr = cfg.actor_rollout_ref
    actor, rollout = arr.actor, arr.rollout
    rows_per_step = cfg.data.train_batch_size * rollout.n
    # relm's own choice when the micro-batch is unset (`compute_sizes`); the bench always sets it.
    micro = actor.ppo_micro_batch_size_per_gpu or min(rows_per_step, 16)
    if cfg.algorithm.adv_estimator != "grpo":
        raise UserError(
            f"--peer trl compares GRPO only, not algorithm.adv_estimator={cfg.algorithm.adv_estimator}"
        )
    if actor.ppo_mini_batch_size != cfg.data.train_batch_size or actor.ppo_epochs != 1:
        raise UserError(
            "--peer trl needs one optimizer update per step: set actor_rollout_ref.actor.ppo_mini_batch_size "
            "to data.train_batch_size and ppo_epochs=1"
        )
    if actor.loss_agg_mode not in LOSS_TYPES:
        raise UserError(
            f"--peer trl: loss_agg_mode={actor.loss_agg_mode} has no TRL loss_type ({', '.join(LOSS_TYPES)})"
        )
    precision = pick_precision(arr.model.dtype, device)
    response_len = response_len or cfg.data.max_response_length
    return {
        "output_dir": output_dir,
        "max_steps": max_steps,
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": rows_per_step // micro,
        "num_generations": rollout.n,
        "num_iterations": 1,
        "max_completion_length": response_len,
        "generation_kwargs": {"min_new_tokens": response_len} if rollout.ignore_eos else None,
        "temperature": rollout.temperature,
        "top_p": rollout.top_p,
        "top_k": max(rollout.top_k, 0),
        "beta": actor.kl_loss_coef if actor.use_kl_loss else 0.0,
        "epsilon": actor.clip_ratio_low if actor.clip_ratio_low is not None else actor.clip_ratio,
        "epsilon_high": actor.clip_ratio_high if actor.clip_ratio_high is not None else actor.clip_ratio,
        "loss_type": LOSS_TYPES[actor.loss_agg_mode],
        "scale_rewards": "group" if cfg.algorithm.norm_adv_by_std_in_grpo else "none",
        "entropy_coef": actor.entropy_coeff,
        "learning_rate": actor.optim.lr,
        "weight_decay": actor.optim.weight_decay,
        "adam_beta1": actor.optim.betas[0],
        "adam_beta2": actor.optim.betas[1],
        "max_grad_norm": actor.grad_clip,
        "lr_scheduler_type": "constant",
        "gradient_checkpointing": bool(arr.model.enable_gradient_checkpointing),
        "model_init_kwargs": {
            "dtype": str(precision.master).removeprefix("torch."),
            "attn_implementation": "sdpa",
        },
        "bf16": precision.compute == torch.bfloat16 and device.type == "cuda",
        "use_cpu": device.type == "cpu",
        "seed": cfg.seed,
        "report_to": "none",
        "logging_steps": 1,
        "save_strategy": "no",
        "disable_tqdm": True,
        "include_num_input_tokens_seen": "no",  # TRL's GRPO counts prompt + completion tokens itself
    }


def step_throughput(num_tokens: int, seconds: float, num_gpus: int = 1) -> float:
    """verl's `perf/throughput`: tokens of the step (prompt + response of every row) per second per GPU."""
    return num_tokens / seconds / max(1, num_gpus)


class StepTimer(TrainerCallback):
    """Wall time and tokens of each optimizer step: generation, reference forward, update, optimizer."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.steps: list[tuple[float, int]] = []
        self._start = 0.0
        self._tokens_before = 0

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def on_step_begin(self, args, state, control, **kwargs):
        self._start, self._tokens_before = self._now(), state.num_input_tokens_seen

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append((self._now() - self._start, int(state.num_input_tokens_seen - self._tokens_before)))
        print(f"  trl step {len(self.steps)}: {self.steps[-1][0]:.2f} s", flush=True)


def weights_folder(model_dir: str, cfg: RelmConfig, device: torch.device, scratch: Path) -> str:
    """`model_dir` when it holds weights, else a copy with relm's seeded random weights written in.

    TRL loads policy and reference by path, but published-shape zoo folders are config only (relm
    builds their weights on the device). The peer draws the same weights relm's actor starts from
    (same seed, master dtype, device) and writes them in the compute dtype: half the bytes on CUDA.
    """
    names = (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_NAME, WEIGHTS_INDEX_NAME)
    if any((Path(model_dir) / name).is_file() for name in names):
        return model_dir
    shutil.copytree(model_dir, scratch, ignore=shutil.ignore_patterns(".relm-zoo-complete"))
    precision = pick_precision(cfg.actor_rollout_ref.model.dtype, device)
    model = load_causal_lm(model_dir, dtype=precision.master, device=device, seed=cfg.seed)
    # transformers' decorator on `to` hides its signature: mypy reads the dtype as `self`.
    model.to(precision.compute).save_pretrained(scratch)  # type: ignore[arg-type]
    del model
    free_memory(device)
    return str(scratch)


def free_memory(device: torch.device) -> None:
    """Drop unreachable models so the next trainer starts from an empty GPU."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def letters_reward(completions: list, **_: Any) -> list[float]:
    """relm's bench reward (`relm/letters`, ground truth `a`) on TRL's conversational completions."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [float(default_compute_score("relm/letters", text, "a")) for text in texts]  # type: ignore[arg-type]  # letters scores are floats


def run_trl_grpo(
    cfg: RelmConfig,
    model_dir: str,
    prompts: list[list[dict[str, str]]],
    steps: int,
    device: torch.device,
    workdir: Path,
) -> dict[str, float]:
    """A short warm-up trainer, then `steps` timed GRPOTrainer steps; metrics under relm's names.

    The warm-up runs one step at the same batch and prompt length with `WARMUP_RESPONSE_LEN` response
    tokens (CUDA context, kernels, allocator), in its own trainer, so the measured trainer's first step
    still allocates its optimizer state and longer activations: a little slower, never faster.
    """
    require_trl()
    from datasets import Dataset
    from transformers.utils import logging as hf_logging
    from trl import GRPOConfig, GRPOTrainer

    hf_logging.disable_progress_bar()  # four "Loading weights" bars between the bench's own lines

    if device.type == "cuda" and device.index not in (None, 0):
        raise UserError(
            "--peer trl runs on the first visible GPU; pick it with CUDA_VISIBLE_DEVICES, not --device"
        )
    if device.type == "cuda":
        left = torch.cuda.memory_allocated(device) / 2**30
        print(f"  trl: starting with {left:.2f} GB still allocated on the GPU", flush=True)
    weights = weights_folder(model_dir, cfg, device, workdir / "weights")
    dataset = Dataset.from_dict({"prompt": prompts})

    def trainer(max_steps: int, response_len: int, callbacks: list) -> GRPOTrainer:
        kwargs = grpo_config_kwargs(cfg, device, str(workdir / "trl"), max_steps, response_len)
        grpo = GRPOTrainer(
            weights,
            reward_funcs=letters_reward,
            args=GRPOConfig(**kwargs),
            train_dataset=dataset,
            callbacks=callbacks,
        )
        grpo.remove_callback(PrinterCallback)  # its dict per step would bury the bench's own lines
        return grpo

    warmup_len = min(WARMUP_RESPONSE_LEN, cfg.data.max_response_length)
    warmup, start = trainer(1, warmup_len, []), time.perf_counter()
    warmup.train()
    print(f"  trl warm-up ({warmup_len} response tokens): {time.perf_counter() - start:.2f} s", flush=True)
    del warmup
    free_memory(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    timer = StepTimer(device)
    measured = trainer(steps, cfg.data.max_response_length, [timer])
    measured.train()
    lengths = [log for log in measured.state.log_history if "completions/min_length" in log]
    results = {
        "timing_s/step": statistics.mean(s for s, _ in timer.steps),
        "perf/throughput": statistics.mean(step_throughput(t, s) for s, t in timer.steps),
        "perf/total_num_tokens": statistics.mean(t for _, t in timer.steps),
        "response_length/min": min(log["completions/min_length"] for log in lengths),
        "response_length/max": max(log["completions/max_length"] for log in lengths),
    }
    if device.type == "cuda":
        results["perf/max_memory_allocated_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
    del measured
    free_memory(device)
    return results
