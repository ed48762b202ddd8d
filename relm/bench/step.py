"""`relm bench step`: full GRPO / PPO steps on random weights with fixed lengths, timed phase by phase.

Every step runs the real trainer (`relm.trainer.ppo.ppo_step`) on prompts of exactly `--prompt-len`
tokens with eos ignored, so each response is `--response-len` tokens and runs are comparable across
engines, machines and versions. The first step is a warm-up and is not counted. `--peer trl` then
times TRL's GRPOTrainer on the same GRPO steps (`relm.bench.peer_trl`) and prints the ratio.

Under torchrun (`python -m torch.distributed.run --nproc_per_node N -m relm.cli bench step ...`) it
runs data-parallel over the N processes with the same global batch (`--prompts` x `--rollout-n`), so
the step times of 1 and N GPUs compare directly; rank 0 prints and writes the results.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from relm.errors import UserError, run_guarded
from relm.logs import setup_logging

if TYPE_CHECKING:  # at run time imported where used: `--help` needs no torch
    from relm.distributed.context import DistContext

ALGOS = {
    "grpo": ["algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.use_kl_loss=true"],
    "ppo": ["algorithm.adv_estimator=gae"],
}
REPORTED = (
    "timing_s/gen",
    "timing_s/old_log_prob",
    "timing_s/ref",
    "timing_s/values",
    "timing_s/update_critic",
    "timing_s/update_actor",
    "timing_s/sync",
    "timing_s/step",
    "perf/total_num_tokens",
    "perf/throughput",
    "perf/mfu/actor",
    "perf/max_memory_allocated_gb",
    "perf/cpu_max_rss_gb",
    "perf/plan_gpu_gb",
    "perf/plan_host_gb",
    "perf/max_host_memory_gb",
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="relm bench step", description=__doc__)
    parser.add_argument("--model", default="zoo:tiny/qwen2", help="model path, Hub id or zoo:NAME")
    parser.add_argument("--algo", default="grpo,ppo", help="comma-separated: grpo, ppo")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step (data.train_batch_size)")
    parser.add_argument(
        "--n",
        "--rollout-n",
        dest="n",
        type=int,
        default=4,
        help="responses per prompt (rollout.n); under torchrun write --rollout-n, which its parser leaves alone",
    )
    parser.add_argument(
        "--prompt-len",
        type=int,
        default=32,
        help="tokens per prompt, chat template included (so at least the template's length plus one)",
    )
    parser.add_argument("--response-len", type=int, default=32)
    parser.add_argument("--steps", type=int, default=2, help="measured steps (after one warm-up step)")
    parser.add_argument("--micro", type=int, default=8, help="ppo_micro_batch_size_per_gpu")
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--peer", choices=["trl"], default=None, help="also time TRL's GRPOTrainer on the same GRPO steps"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the results here too")
    parser.add_argument("overrides", nargs="*", help="extra section.key=value overrides")
    return parser.parse_args(argv)


def write_prompts(path: Path, tokenizer, num_prompts: int, prompt_len: int, seed: int = 0) -> None:
    """Parquet of `num_prompts` chat prompts that encode to exactly `prompt_len` tokens (or as near as the
    tokenizer allows from below), with a reward that always scores (the bench measures speed).

    Raises:
        UserError: `prompt_len` is no longer than the chat template with an empty message.
    """
    from relm.models.tokenizer import encode_prompt

    template_only = len(encode_prompt(tokenizer, [{"role": "user", "content": ""}]))
    if template_only >= prompt_len:
        raise UserError(
            f"relm bench step: --prompt-len {prompt_len} leaves no room for a prompt: this model's chat "
            f"template alone is {template_only} tokens; use --prompt-len {template_only + 1} or more"
        )
    rng = random.Random(seed)
    rows = []
    for index in range(num_prompts):
        words: list[str] = []
        while True:
            candidate = [*words, rng.choice("abcdefghijklmnopqrstuvwxyz")]
            if len(encode_prompt(tokenizer, [{"role": "user", "content": "".join(candidate)}])) > prompt_len:
                break
            words = candidate
        rows.append(
            {
                "prompt": [{"role": "user", "content": "".join(words)}],
                "data_source": "relm/letters",
                "reward_model": {"style": "rule", "ground_truth": "a"},
                "extra_info": {"index": index},
            }
        )
    pq.write_table(pa.Table.from_pylist(rows), path)


def bench_config(args: argparse.Namespace, algo: str, train_file: Path, run_dir: Path):
    """relm's validated config for `algo` at the bench's sizes (the TRL peer mirrors the same one)."""
    from relm.config.loader import load_config
    from relm.config.validate import validate_config

    overrides = [
        f"actor_rollout_ref.model.path={args.model}",
        f"data.train_files={train_file}",
        f"data.max_prompt_length={args.prompt_len}",
        f"data.max_response_length={args.response_len}",
        f"data.train_batch_size={args.prompts}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.micro}",
        f"actor_rollout_ref.rollout.n={args.n}",
        "actor_rollout_ref.rollout.ignore_eos=true",
        f"trainer.device={args.device}",
        f"trainer.default_local_dir={run_dir}",
        "trainer.logger=[]",
        f"trainer.n_gpus_per_node={getattr(args, 'world_size', 1)}",
        *ALGOS[algo],
        *args.overrides,
    ]
    cfg = load_config(overrides)
    validate_config(cfg)
    return cfg


def run_algo(
    args: argparse.Namespace, algo: str, train_file: Path, run_dir: Path, dist: DistContext | None = None
) -> dict[str, float]:
    """Warm-up step, then `args.steps` measured steps; returns each reported metric's mean."""
    from relm.config.translate import translate
    from relm.models.loading import resolve_model_dir
    from relm.trainer.components import build_components
    from relm.trainer.ppo import ppo_step

    cfg = bench_config(args, algo, train_file, run_dir)
    c = build_components(translate(cfg)[0], resolve_model_dir(cfg.actor_rollout_ref.model.path), dist=dist)
    from relm.memory.choices import host_budget_bytes
    from relm.memory.host import HostWatchdog, watching
    from relm.trainer.metrics import memory_report

    measured: list[dict[str, float]] = []
    running = {"step": 0}
    watchdog = HostWatchdog(
        lambda: f"{c.residency.current} of step {running['step']}",
        budget_bytes=host_budget_bytes(c.spec.memory),
    )
    for step in range(1, args.steps + 2):
        running["step"] = step
        with watching(watchdog):
            metrics = ppo_step(c, c.loader.next_batch(), step)
        if step == 1 and c.dist.is_main and (report := memory_report(metrics)):
            print(f"  {report}", flush=True)
        if c.dist.is_main:
            print(
                f"  {algo} step {step}{' (warm-up)' if step == 1 else ''}: {metrics['timing_s/step']:.2f} s",
                flush=True,
            )
        if step > 1:
            measured.append(metrics)
    result = {key: statistics.mean(m[key] for m in measured) for key in REPORTED if key in measured[0]}
    # what the memory plan chose, so a peer runs with the same setting
    result["memory/gradient_checkpointing"] = float(c.memory.models["actor"].checkpointing)
    if c.dist.is_distributed:  # ranks one copy of the actor is sharded over (1: replicated)
        from relm.distributed.gathering import shard_group_size

        result["data_parallel/actor_shard_size"] = float(shard_group_size(c.actor.module) or 0)
    return result


def bench_step(argv: list[str]) -> int:
    args = parse_args(argv)
    setup_logging()  # after the arguments: it imports transformers, which `--help` does not need
    algos = [a.strip() for a in args.algo.split(",") if a.strip()]
    unknown = [a for a in algos if a not in ALGOS]
    if unknown:
        raise UserError(f"--algo {unknown[0]}: choose from {', '.join(ALGOS)}")
    peer: dict[str, object] = {}
    if args.peer:
        from relm.bench.peer_trl import require_trl

        if "grpo" not in algos:
            raise UserError("--peer trl compares GRPO steps: include grpo in --algo")
        peer = {"name": "trl", "version": require_trl()}  # before relm's steps: fail in a second, not minutes
    from relm.distributed.context import in_torchrun, init_distributed
    from relm.models.loading import resolve_model_dir
    from relm.models.tokenizer import load_tokenizer
    from relm.trainer.components import pick_device

    args.world_size = int(os.environ["WORLD_SIZE"]) if in_torchrun() else 1
    if args.peer and args.world_size > 1:
        raise UserError("--peer trl times one process: run it without torchrun")
    tokenizer = load_tokenizer(resolve_model_dir(args.model))
    dist = init_distributed(pick_device(args.device, "--device"), expected_world_size=args.world_size)
    results: dict[str, dict[str, float]] = {}
    finished = False
    try:
        with tempfile.TemporaryDirectory(prefix="relm-bench-") as tmp:  # one per rank, same prompts
            train_file = Path(tmp) / "prompts.parquet"
            write_prompts(train_file, tokenizer, args.prompts, args.prompt_len)
            for algo in algos:
                results[algo] = run_algo(args, algo, train_file, Path(tmp) / algo, dist)
            if args.peer:
                checkpointing = bool(results["grpo"]["memory/gradient_checkpointing"])
                results["trl"] = run_peer(args, train_file, Path(tmp) / "trl", checkpointing)
        finished = True
    finally:
        dist.close(finished=finished)
    if not dist.is_main:
        return 0
    print_table(args, results)
    if args.peer:
        relm, trl = results["grpo"], results["trl"]
        ratio = peer["throughput_ratio"] = relm["perf/throughput"] / trl["perf/throughput"]
        print(
            f"relm grpo / TRL {peer['version']} GRPOTrainer: perf/throughput x{ratio:.2f}; "
            f"TRL responses {trl['response_length/min']:.0f}-{trl['response_length/max']:.0f} tokens "
            f"(asked {args.response_len})"
        )
    if args.json:
        record = {"args": {k: str(v) for k, v in vars(args).items()}, "results": results}
        args.json.write_text(json.dumps(record | ({"peer": peer} if peer else {}), indent=2))
    return 0


def run_peer(
    args: argparse.Namespace, train_file: Path, workdir: Path, gradient_checkpointing: bool
) -> dict[str, float]:
    """TRL's GRPOTrainer on relm's GRPO config, prompts and device, after relm's models are freed;
    gradient checkpointing as relm's run used it (its memory plan decides when the config leaves it unset)."""
    from relm.bench.peer_trl import free_memory, run_trl_grpo
    from relm.models.loading import resolve_model_dir
    from relm.trainer.components import pick_device

    cfg = bench_config(args, "grpo", train_file, workdir)
    cfg.actor_rollout_ref.model.enable_gradient_checkpointing = gradient_checkpointing
    device = pick_device(cfg.trainer.device, "--device")
    free_memory(device)
    prompts = pq.read_table(train_file).column("prompt").to_pylist()
    return run_trl_grpo(cfg, resolve_model_dir(args.model), prompts, args.steps, device, workdir)


def print_table(args: argparse.Namespace, results: dict[str, dict[str, float]]) -> None:
    print(
        f"\nrelm bench step: {args.model}, {args.prompts} prompts x n={args.n}, "
        f"{args.prompt_len}+{args.response_len} tokens, mean of {args.steps} step(s) after warm-up, "
        f"{getattr(args, 'world_size', 1)} process(es)"
    )
    keys = [k for k in REPORTED if any(k in r for r in results.values())]
    print(f"{'metric':32s}" + "".join(f"{algo:>14s}" for algo in results))
    for key in keys:
        cells = "".join(f"{results[a][key]:14.4g}" if key in results[a] else f"{'-':>14s}" for a in results)
        print(f"{key:32s}{cells}")


def main(argv: list[str] | None = None) -> int:
    return run_guarded(lambda: bench_step(sys.argv[1:] if argv is None else argv))
