"""Issue 23 part 2: the same GRPO steps with the old-logprob forward and without it (on-policy).

An on-policy run (one epoch, one mini-batch a step: `ppo_mini_batch_size == train_batch_size`, as
`relm bench step` sets it) takes its old logprobs from the update's first forward
(`relm.trainer.old_logprobs`). This script runs the bench's GRPO steps (KL loss on, as issue 23's
3B measurement) twice in one process from the same seed: first with the forward relm ran before
(`old_logprob_source` held to "actor"), then as relm now runs them, and prints both phase tables,
the step-time saving and the update's metrics side by side. With the forward, bf16 on a GPU gives a
ratio pi / pi_old slightly off 1 at the first pass (nonzero `actor/ppo_kl`, `actor/pg_clipfrac`);
without it, exactly 1.

Usage (repository root; PYTHONPATH with relm; the GPU machine, about 60 s with these sizes):
    python bench/old_logprob_skip.py --model zoo:Qwen/Qwen2.5-1.5B-Instruct --prompts 32 --n 8 \\
        --prompt-len 256 --response-len 256 --steps 2 --json $OUT/old_logprob_skip.json
Any `relm bench step` option and `section.key=value` override is taken (`--algo` is always grpo).
On CPU: python bench/old_logprob_skip.py --prompts 8 --n 4 --prompt-len 64 --response-len 64
"""

from __future__ import annotations

import gc
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

import relm.trainer.ppo as ppo
from relm.bench.step import REPORTED, bench_config, parse_args, write_prompts
from relm.config.translate import translate
from relm.logs import setup_logging
from relm.models.loading import resolve_model_dir
from relm.models.tokenizer import load_tokenizer
from relm.trainer.components import build_components, pick_device
from relm.trainer.old_logprobs import old_logprob_source

UPDATE_METRICS = ("actor/pg_loss", "actor/ppo_kl", "actor/pg_clipfrac", "actor/kl_loss", "actor/entropy")


def run(args, train_file: Path, run_dir: Path) -> dict[str, float]:
    """One warm-up step and `args.steps` measured ones; the mean of each reported metric."""
    cfg = bench_config(args, "grpo", train_file, run_dir)
    c = build_components(translate(cfg)[0], resolve_model_dir(cfg.actor_rollout_ref.model.path))
    source = ppo.old_logprob_source(c.spec)
    measured = []
    for step in range(1, args.steps + 2):
        metrics = ppo.ppo_step(c, c.loader.next_batch(), step)
        print(f"  old logprobs from {source}: step {step}: {metrics['timing_s/step']:.2f} s", flush=True)
        if step > 1:
            measured.append(metrics)
    del c
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    keys = [key for key in (*REPORTED, *UPDATE_METRICS) if key in measured[0]]
    return {key: statistics.mean(m[key] for m in measured) for key in keys}


def main(argv: list[str]) -> int:
    setup_logging()
    args = parse_args([*argv, "--algo", "grpo"])
    pick_device(args.device, "--device")
    tokenizer = load_tokenizer(resolve_model_dir(args.model))
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="relm-bench-") as tmp:
        train_file = Path(tmp) / "prompts.parquet"
        write_prompts(train_file, tokenizer, args.prompts, args.prompt_len)
        if old_logprob_source(bench_config(args, "grpo", train_file, Path(tmp) / "check")) != "update":
            print(
                "error: these settings are not on-policy (ppo_epochs 1, no KL in the reward): nothing to skip"
            )
            return 2
        held = ppo.old_logprob_source
        ppo.old_logprob_source = lambda cfg: "actor"  # the path relm ran before issue 23
        try:
            results["with forward"] = run(args, train_file, Path(tmp) / "forward")
        finally:
            ppo.old_logprob_source = held
        results["on-policy"] = run(args, train_file, Path(tmp) / "skipped")
    print(f"\n{args.model}, {args.prompts} prompts x n={args.n}, {args.prompt_len}+{args.response_len}, grpo")
    print(f"{'metric':32s}" + "".join(f"{name:>16s}" for name in results))
    for key in dict.fromkeys(k for r in results.values() for k in r):
        print(
            f"{key:32s}" + "".join(f"{r[key]:16.4g}" if key in r else f"{'-':>16s}" for r in results.values())
        )
    before, after = results["with forward"]["timing_s/step"], results["on-policy"]["timing_s/step"]
    print(f"step time: {before:.3f} s -> {after:.3f} s ({(before - after) / before:+.1%} saved)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results})
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
