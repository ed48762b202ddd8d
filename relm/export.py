"""`relm export CHECKPOINT OUT_DIR [--critic] [--merge]`: a checkpoint's models as plain Hugging Face folders.

The command line only; the export itself is `relm.trainer.export.export_checkpoint`, imported after the
arguments are read so that `relm export --help` prints without torch and transformers.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from relm.errors import run_guarded


def export_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="relm export",
        description="Write a checkpoint's actor (and critic) as Hugging Face folders (safetensors, config, "
        "generation config, tokenizer).",
    )
    parser.add_argument(
        "checkpoint", type=Path, help="a global_step_N folder, or a run folder (its latest step)"
    )
    parser.add_argument(
        "out_dir", type=Path, help="new or empty folder; the actor's HF folder (without --critic)"
    )
    parser.add_argument(
        "--critic", action="store_true", help="also export the critic: OUT_DIR/actor, OUT_DIR/critic"
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="a LoRA run: write the model with its adapter merged in (a plain HF folder) instead of the "
        "PEFT adapter folder",
    )
    parser.add_argument(
        "--base",
        help="a LoRA run: the base model (default: the adapter's base_model_name_or_path); --merge loads it, "
        "without --merge it is written into the exported adapter_config.json",
    )
    args = parser.parse_args(argv)
    from relm.trainer.export import export_checkpoint  # torch and transformers: after `--help`

    exported = export_checkpoint(
        args.checkpoint, args.out_dir, critic=args.critic, merge=args.merge, base=args.base
    )
    for folder in exported:
        print(folder)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Exit 0 with the written folders printed; 2 with one `error:` line for a missing/incomplete input."""
    return run_guarded(lambda: export_command(sys.argv[1:] if argv is None else argv))
