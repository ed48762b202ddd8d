"""Parity of one PPO (GAE) step and one GRPO step between one process and a torchrun data-parallel run.

    python tests/dist_parity.py run OUT [options]                          # one process, no torchrun
    python -m torch.distributed.run --nproc_per_node 2 tests/dist_parity.py run OUT [options]
    python tests/dist_parity.py load OUT FROM [options]                    # load FROM's checkpoints
    python tests/dist_parity.py compare OUT_A OUT_B                        # max differences, as JSON

Every process builds the same run and generates the same global batch with its own whole engine (same
seeds, responses cut to lengths that differ row by row, so that token counts differ between ranks), then
runs the trainer's own `annotate`, `estimate_advantages` and `update_models` on it: one process over the
whole batch through the unchanged single-process path, or each rank over its rows with FSDP2. Rank 0
writes, per algorithm, OUT/<algo>.pt: the step's metrics, the batch's logprobs / values / advantages,
each parameter's gradient at every optimizer step (captured in a step pre-hook, gathered whole) and
the weights and AdamW moments after the step; and OUT/<algo>-run/global_step_1, the step's checkpoint.
`load` (or `run --load-from`) loads another run's checkpoints into fresh models and records what was
loaded (OUT/<algo>-loaded.pt): with the other world size, that checks checkpoints cross world sizes.

Used by tests/integration/test_distributed.py (CPU, gloo, tiny model, fp32) and bench/gpu_distributed.sh
(two GPUs, NCCL, Qwen2.5-1.5B shape).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

ALGOS = {
    "ppo": ["algorithm.adv_estimator=gae"],
    "grpo": ["algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.use_kl_loss=true"],
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    sizes = argparse.ArgumentParser(add_help=False)  # the model and sizes, shared by `run` and `load`
    sizes.add_argument("--model", default="zoo:tiny/qwen2")
    sizes.add_argument("--device", default="cpu")
    sizes.add_argument("--dtype", default="float32", help="actor_rollout_ref.model.dtype (auto: bf16 on GPU)")
    sizes.add_argument("--algos", default="ppo,grpo")
    sizes.add_argument("--prompts", type=int, default=4)
    sizes.add_argument("--rollout-n", type=int, default=4)  # not --n: torchrun reads that as its own
    sizes.add_argument("--response-len", type=int, default=8)
    sizes.add_argument("--micro", type=int, default=2)
    sizes.add_argument("--lr", type=float, default=1e-3)
    sizes.add_argument(
        "--params", default="all", help="`all`, or comma-separated parts of the parameter names to record"
    )
    sizes.add_argument("--set", action="append", default=[], help="one more section.key=value override")
    parser = argparse.ArgumentParser(prog="dist_parity.py")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", parents=[sizes])
    run.add_argument("out", type=Path)
    run.add_argument("--load-from", type=Path, default=None, help="another run's OUT: load its checkpoints")
    run.add_argument("--no-save", action="store_true", help="skip the checkpoint (large models: disk, time)")
    load = sub.add_parser("load", parents=[sizes])
    load.add_argument("out", type=Path)
    load.add_argument("load_from", type=Path)
    compare = sub.add_parser("compare")
    compare.add_argument("a", type=Path)
    compare.add_argument("b", type=Path)
    return parser.parse_args(argv)


def overrides(args: argparse.Namespace, algo: str, world_size: int) -> list[str]:
    return [
        f"actor_rollout_ref.model.path={args.model}",
        f"actor_rollout_ref.model.dtype={args.dtype}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=true",
        "critic.model.enable_gradient_checkpointing=true",
        f"data.train_batch_size={args.prompts}",
        "data.max_prompt_length=24",
        f"data.max_response_length={args.response_len}",
        f"actor_rollout_ref.rollout.n={args.rollout_n}",
        # Two optimizer steps per model: the union of the ranks' k-th local mini-batches must be the
        # k-th global one, and the critic's second step is the first where its backbone gets a gradient.
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts // 2}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.micro}",
        f"actor_rollout_ref.actor.optim.lr={args.lr}",
        f"critic.optim.lr={args.lr}",
        "actor_rollout_ref.actor.entropy_coeff=0.01",
        "actor_rollout_ref.rollout.free_cache_engine=false",
        f"trainer.device={args.device}",
        f"trainer.n_gpus_per_node={world_size}",
        f"trainer.default_local_dir={args.out / f'{algo}-run'}",
        "trainer.logger=[]",
        "trainer.test_freq=-1",
        *ALGOS[algo],
        *args.set,
    ]


class CutLengths:
    """The rank's whole engine, with response i cut to 1 + (5 i mod R) tokens: a random tiny model
    rarely samples eos, and equal lengths would hide a per-rank token normalisation."""

    def __init__(self, engine: Any, pad_token_id: int) -> None:
        self.engine, self.pad = engine, pad_token_id

    def generate(self, prompts: list[list[int]], params: Any) -> Any:
        out = self.engine.generate(prompts, params)
        rows, width = out.response_ids.shape
        lengths = 1 + (torch.arange(rows) * 5) % width  # [N]
        keep = (torch.arange(width)[None, :] < lengths[:, None]).to(out.response_mask.device)  # [N, R]
        mask = out.response_mask * keep
        return replace(
            out,
            response_ids=torch.where(mask.bool(), out.response_ids, self.pad),
            response_mask=mask,
            logprobs=torch.where(mask.bool(), out.logprobs, 0.0),
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


def whole(tensor: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    from relm.distributed.fsdp import full_tensor

    return None if tensor is None else full_tensor(tensor.detach(), device).float().cpu()


def wanted(names: str, name: str) -> bool:
    return names == "all" or any(part in name for part in names.split(","))


def record_gradients(model: torch.nn.Module, optimizer: Any, c: Any, names: str, log: list) -> None:
    """Before each optimizer step: every parameter's whole gradient (a collective on every rank)."""

    def hook(opt: Any, args: Any, kwargs: Any) -> None:
        step: dict[str, torch.Tensor] = {}
        for name, p in model.named_parameters():
            if p.requires_grad and wanted(names, name) and p.grad is not None:
                step[name] = whole(p.grad, c.dist.device)
        log.append(step)

    optimizer.register_step_pre_hook(hook)


def full_state(model: torch.nn.Module, optimizer: Any, c: Any, names: str) -> dict[str, Any]:
    """Weights and AdamW moments by parameter name, whole (a collective on every rank)."""
    from relm.distributed.fsdp import full_tensor

    state: dict[str, Any] = {"weights": {}, "exp_avg": {}, "exp_avg_sq": {}, "step": None}
    for name, p in model.named_parameters():
        if not wanted(names, name):
            continue
        state["weights"][name] = whole(p, c.dist.device)
        moments = optimizer.state.get(p, {})
        for key in ("exp_avg", "exp_avg_sq"):
            if key in moments:
                state[key][name] = full_tensor(moments[key], c.dist.device).float().cpu()
        if "step" in moments:
            state["step"] = float(moments["step"])
    return state


def build(args: argparse.Namespace, algo: str, dist: Any) -> Any:
    from relm.config.loader import load_config
    from relm.config.translate import translate
    from relm.config.validate import validate_config
    from relm.models.loading import resolve_model_dir
    from relm.trainer.components import build_components

    cfg = load_config(overrides(args, algo, dist.world_size))
    validate_config(cfg)
    return build_components(translate(cfg)[0], resolve_model_dir(cfg.actor_rollout_ref.model.path), dist=dist)


def load_algo(args: argparse.Namespace, algo: str, dist: Any, source: Path) -> None:
    """Fresh models, `source`'s checkpoint of `algo` loaded into them; what they hold goes to OUT."""
    from relm.trainer.checkpoint import load_checkpoint

    fresh = build(args, algo, dist)
    load_checkpoint(fresh, source / f"{algo}-run" / "global_step_1")
    loaded = {
        "actor": full_state(fresh.actor.module, fresh.actor.optimizer, fresh, args.params),
        "critic": full_state(fresh.critic.module, fresh.critic.optimizer, fresh, args.params)
        if fresh.critic is not None
        else None,
    }
    if dist.is_main:
        torch.save(loaded, args.out / f"{algo}-loaded.pt")


def run_algo(args: argparse.Namespace, algo: str, dist: Any) -> None:
    from relm.learner.batch import ActorForward
    from relm.trainer.checkpoint import save_checkpoint
    from relm.trainer.collect import collect_experience
    from relm.trainer.ppo import annotate, estimate_advantages, update_models

    c = build(args, algo, dist)
    engine = c.engine
    # Every process generates the whole batch itself, with the same seeds: one global batch for all.
    c.engine = CutLengths(getattr(engine, "engine", engine), c.tokenizer.pad_token_id)
    metrics: dict[str, float] = {}
    scored = collect_experience(c.experience_sources, c.loader.next_batch(), 1, metrics)
    c.engine = engine
    grads: dict[str, list] = {"actor": [], "critic": []}
    record_gradients(c.actor.module, c.actor.optimizer, c, args.params, grads["actor"])
    if c.critic is not None:
        record_gradients(c.critic.module, c.critic.optimizer, c, args.params, grads["critic"])
    with c.precision.autocast():
        annotated, annotate_metrics = annotate(c, scored)
        batch, advantage_metrics = estimate_advantages(c.spec.algorithm, c.kl_ctrl, annotated)
        _, update_metrics = update_models(c, batch, 1)
    metrics |= annotate_metrics | advantage_metrics | update_metrics
    old = annotated.old_logprobs
    result = {
        "world_size": dist.world_size,
        "metrics": {k: v for k, v in metrics.items() if not k.startswith("timing_s")},
        "batch": {
            "response_ids": batch.rollout.response_ids,
            "old_logprobs": old.logprobs if isinstance(old, ActorForward) else None,
            "ref_logprobs": annotated.ref_logprobs,
            "values": annotated.values,
            "advantages": batch.advantages,
        },
        "response_tokens": int(batch.rollout.response_mask.sum()),
        "grads": grads,
        "actor": full_state(c.actor.module, c.actor.optimizer, c, args.params),
        "critic": full_state(c.critic.module, c.critic.optimizer, c, args.params)
        if c.critic is not None
        else None,
    }
    if dist.is_main:
        torch.save(result, args.out / f"{algo}.pt")
    if not args.no_save:
        save_checkpoint(c, 1)
    if args.load_from is not None:
        load_algo(args, algo, dist, args.load_from)


def max_abs(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    return max(((a[k] - b[k]).abs().max().item() for k in a), default=0.0)


def rel_l2(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """||a - b|| / ||a|| over all tensors together: the share of the signal that differs."""
    num = sum(float((a[k] - b[k]).double().square().sum()) for k in a)
    den = sum(float(a[k].double().square().sum()) for k in a)
    return (num / den) ** 0.5 if den > 0 else num**0.5


def compare_states(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
    out = {}
    for key in ("weights", "exp_avg", "exp_avg_sq"):
        out[f"{key}_max_abs"] = max_abs(a[key], b[key])
        out[f"{key}_rel_l2"] = rel_l2(a[key], b[key])
    out["step_equal"] = float(a["step"] == b["step"])
    return out


def compare(a_dir: Path, b_dir: Path) -> dict[str, dict[str, float]]:
    """Per algorithm: the largest differences between two runs' results (and loaded checkpoints)."""
    report: dict[str, dict[str, float]] = {}
    for algo in ALGOS:
        if not (a_dir / f"{algo}.pt").is_file() or not (b_dir / f"{algo}.pt").is_file():
            continue
        a, b = (torch.load(d / f"{algo}.pt", weights_only=False) for d in (a_dir, b_dir))
        row: dict[str, float] = {"response_tokens_equal": float(a["response_tokens"] == b["response_tokens"])}
        for key in sorted(set(a["metrics"]) & set(b["metrics"])):
            if key.startswith(("actor/", "critic/")) and not key.endswith(("/max", "/min")):
                row[f"metric {key}"] = abs(a["metrics"][key] - b["metrics"][key])
        for key, tensor in a["batch"].items():
            if tensor is not None and key != "response_ids":
                row[f"batch {key}"] = (tensor - b["batch"][key]).abs().max().item()
        if "response_ids" in a["batch"]:  # a different generated batch would make every other figure moot
            row["batch response_ids"] = float(
                not a["batch"]["response_ids"].equal(b["batch"]["response_ids"])
            )
        for model in ("actor", "critic"):
            if a[model] is None:
                continue
            steps = zip(a["grads"][model], b["grads"][model], strict=True)
            for index, (ga, gb) in enumerate(steps):
                row[f"{model} grad step {index} max_abs"] = max_abs(ga, gb)
                row[f"{model} grad step {index} rel_l2"] = rel_l2(ga, gb)
            for key, value in compare_states(a[model], b[model]).items():
                row[f"{model} {key}"] = value
            for direction, loaded_dir, source in (("b loads a", b_dir, a), ("a loads b", a_dir, b)):
                path = loaded_dir / f"{algo}-loaded.pt"
                if path.is_file():
                    loaded = torch.load(path, weights_only=False)
                    for key, value in compare_states(source[model], loaded[model]).items():
                        row[f"{model} checkpoint {direction}: {key}"] = value
        report[algo] = row
    return report


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.command == "compare":
        print(json.dumps(compare(args.a, args.b), indent=1))
        return 0
    from relm.distributed.context import init_distributed
    from relm.logs import setup_logging
    from relm.trainer.components import pick_device

    setup_logging()
    if torch.cuda.is_available():  # fp32 parity means fp32 matrix products, not TF32
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    args.out.mkdir(parents=True, exist_ok=True)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    dist = init_distributed(pick_device(args.device), expected_world_size=world_size)
    finished = False
    try:
        for algo in args.algos.split(","):
            if args.command == "run":
                run_algo(args, algo, dist)
            else:
                load_algo(args, algo, dist, args.load_from)
        finished = True
    finally:
        dist.close(finished=finished)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
