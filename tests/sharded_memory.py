"""Peak host memory of one GRPO step, in one process or in each torchrun rank.

    python tests/sharded_memory.py write FOLDER [--hidden 1536 --layers 10]     # a Qwen2 of that size
    python tests/sharded_memory.py run FOLDER OUT [--set key=value ...]         # one process
    python -m torch.distributed.run --nproc_per_node 4 tests/sharded_memory.py run FOLDER OUT

`write` saves a Qwen2 model with random weights as safetensors (with zoo:tiny/qwen2's tokenizer, whose
101-token vocabulary keeps the logits and the embedding small, so that the transformer blocks' weights
dominate). `run` builds the run with the trainer's own `build_components` (the data-parallel run's models
from shards), takes one real `ppo_step` (generation, scoring, old and reference logprobs, the actor's
update) and writes OUT/rank<R>.json: the process's peak resident memory (VmHWM), its resident memory
after the build, and the run's parameter count. Used by tests/integration/test_sharded_memory.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import torch


def status_kib(field: str) -> int:
    """A `/proc/self/status` figure (VmHWM: the peak resident set; VmRSS: now), in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def write(folder: Path, hidden: int, layers: int) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    from relm.models.loading import resolve_model_dir

    tiny = Path(resolve_model_dir("zoo:tiny/qwen2"))
    config = AutoConfig.from_pretrained(tiny)
    config.hidden_size, config.num_hidden_layers = hidden, layers
    config.intermediate_size = hidden * 11 // 4
    config.num_attention_heads, config.num_key_value_heads = hidden // 64, hidden // 256
    config.layer_types = ["full_attention"] * layers
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(folder)
    for file in tiny.iterdir():
        if file.name.startswith(("tokenizer", "chat_template")):
            shutil.copyfile(file, folder / file.name)


def overrides(folder: Path, out: Path, world_size: int, extra: list[str]) -> list[str]:
    return [
        f"actor_rollout_ref.model.path={folder}",
        "actor_rollout_ref.model.dtype=float32",
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "data.train_batch_size=4",
        "data.max_prompt_length=24",
        "data.max_response_length=4",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.ppo_epochs=1",
        "actor_rollout_ref.rollout.free_cache_engine=false",
        "trainer.device=cpu",
        f"trainer.n_gpus_per_node={world_size}",
        f"trainer.default_local_dir={out / 'run'}",
        "trainer.logger=[]",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.val_before_train=false",
        *extra,
    ]


def run(folder: Path, out: Path, extra: list[str]) -> None:
    from relm.config.loader import load_config
    from relm.config.translate import translate
    from relm.config.validate import validate_config
    from relm.distributed.context import init_distributed
    from relm.logs import setup_logging
    from relm.memory.host_allocator import set_host_allocator
    from relm.trainer.components import build_components
    from relm.trainer.ppo import ppo_step

    setup_logging()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    set_host_allocator(world_size)  # as `relm train` sets it on CPU
    dist = init_distributed(torch.device("cpu"), expected_world_size=world_size)
    finished = False
    try:
        cfg = load_config(overrides(folder, out, world_size, extra))
        validate_config(cfg)
        c = build_components(translate(cfg)[0], str(folder), dist=dist)
        built_kib = status_kib("VmHWM")
        metrics = ppo_step(c, c.loader.next_batch(), 1)
        num_params = sum(p.numel() for p in c.actor.module.parameters())  # a DTensor counts the whole
        figures = {
            "rank": dist.rank,
            "world_size": world_size,
            "peak_bytes": status_kib("VmHWM") * 1024,
            "built_peak_bytes": built_kib * 1024,
            "num_params": num_params,
            "pg_loss": metrics["actor/pg_loss"],
        }
        out.mkdir(parents=True, exist_ok=True)
        (out / f"rank{dist.rank}.json").write_text(json.dumps(figures) + "\n")
        finished = True
    finally:
        dist.close(finished=finished)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="sharded_memory.py")
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("write")
    make.add_argument("folder", type=Path)
    make.add_argument("--hidden", type=int, default=1536)
    make.add_argument("--layers", type=int, default=10)
    step = sub.add_parser("run")
    step.add_argument("folder", type=Path)
    step.add_argument("out", type=Path)
    step.add_argument("--set", action="append", default=[], help="one more section.key=value override")
    args = parser.parse_args(argv)
    if args.command == "write":
        write(args.folder, args.hidden, args.layers)
    else:
        run(args.folder, args.out, args.set)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
