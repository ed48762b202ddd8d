"""`relm compat MODEL [MODEL ...]` / `relm compat --zoo tiny|full`: does each model load, generate
and train? Exit 0 when no model failed (an unsupported one is an answer), 3 when one failed a check, 2 on
the user's mistake (a wrong path, a bad option); 1 only for a bug in relm."""

from __future__ import annotations

import argparse
import contextlib
import logging
import platform
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

from relm.errors import UserError, run_guarded

DESCRIPTION = """Check that each model's tokenizer gives relm what it needs (pad, eos and end-of-turn tokens, a
chat template that renders, a row for every token; the facts are reported), that the model loads,
generates valid tokens whose logprobs the trainer reproduces, and survives full PPO actor-critic
update(s) with finite losses.
MODEL is a local folder, a Hub id in the local cache, or zoo:NAME. Unsupported models (encoder-only,
encoder-decoder, vision-language) are reported with the reason and do not fail the run.
Exit codes: 0 no model failed, 3 a model failed a check (the report says which and why), 2 a mistake in
the command (a path that does not exist, a bad option), 1 a bug in relm."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UserError(f"relm compat: {message} (see `relm compat --help`)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="relm compat", description=DESCRIPTION)
    parser.add_argument("models", nargs="*", metavar="MODEL")
    parser.add_argument("--zoo", choices=("tiny", "full"), help="check every zoo:tiny/* (or full-size) model")
    parser.add_argument("--zoo-tiny", action="store_true", help="same as --zoo tiny")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", "float32", "bfloat16"),
        help="training dtype (auto: bf16 on GPU)",
    )
    parser.add_argument(
        "--rollout",
        choices=("native", "hf", "vllm"),
        help="engine of the rollout and update stages (default: the HF engine, then relm's default)",
    )
    parser.add_argument(
        "--max-gpu-memory-gb",
        type=float,
        help="GPU memory to use, GB: stands in for a smaller card (docs/memory.md)",
    )
    parser.add_argument("--max-host-memory-gb", type=float, help="host memory to use, GB (docs/memory.md)")
    parser.add_argument("--steps", type=int, default=1, help="PPO steps in the update stage (default 1)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per stage (default 600)")
    parser.add_argument("--tokenizer-path", help="tokenizer folder for every MODEL (default: the model's)")
    parser.add_argument(
        "--tokenizer-only",
        action="store_true",
        help="run the tokenizer stage alone: its facts in seconds, no weights built (any size, any device)",
    )
    parser.add_argument(
        "--lora-rank",
        type=int,
        default=0,
        help="train LoRA adapters of this rank in the update stage (a condition of the verdict; docs/lora.md)",
    )
    parser.add_argument(
        "--out",
        default="outputs/compat",
        help="folder for compat.json and compat.md (beside the runs in outputs/)",
    )
    parser.add_argument("--json", help="also write the JSON report to this file")
    parser.add_argument(
        "--register",
        action="append",
        default=[],
        metavar="ARCH=CLASS",
        help="register_model_class(ARCH, CLASS) first, e.g. StarlingLmForCausalLM=MistralForCausalLM",
    )
    parser.add_argument("--external-lib", help="module to import first (where it registers architectures)")
    parser.add_argument("-v", "--verbose", action="store_true", help="show relm's log lines while checking")
    return parser


def zoo_models(kind: str) -> list[str]:
    """`zoo:` paths of every tiny (or every full-size) zoo entry."""
    from relm.models.zoo import ZOO

    return [f"zoo:{name}" for name in ZOO if name.startswith("tiny/") == (kind == "tiny")]


def _models(args: argparse.Namespace, device: str) -> list[str]:
    zoo = "tiny" if args.zoo_tiny else args.zoo
    models = list(args.models) + (zoo_models(zoo) if zoo else [])
    if not models:
        raise UserError("relm compat: name at least one MODEL, or pass --zoo tiny")
    if zoo == "full" and device != "cuda" and not args.tokenizer_only:
        raise UserError(
            "relm compat --zoo full: full-size zoo models need a GPU; pass --device cuda (or --tokenizer-only)"
        )
    return models


def _register(args: argparse.Namespace) -> None:
    from relm.models.registry import import_external_lib, register_model_class

    import_external_lib(args.external_lib)
    for item in args.register:
        arch, sep, target = item.partition("=")
        if not sep or not arch or not target:
            raise UserError(
                f"--register `{item}`: use ARCH=CLASS, e.g. StarlingLmForCausalLM=MistralForCausalLM"
            )
        register_model_class(arch, target)


def environment(device: str, rollout: str | None = None) -> dict[str, str]:
    import torch
    import transformers

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": device,
    }
    if rollout == "vllm":
        from relm.rollout.vllm_engine import import_vllm

        info["vllm"] = import_vllm().__version__
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
    else:
        info["cpu_threads"] = str(torch.get_num_threads())
    return info


def compat_command(argv: list[str]) -> int:
    # Parsed before anything imports torch or transformers (logging's set-up included), so `--help` is instant.
    args = build_parser().parse_args(argv)
    from relm.logs import setup_logging

    setup_logging()
    from relm.compat.checks import CompatOptions, check_model_guarded
    from relm.compat.report import exit_code, print_table, to_markdown, write_json
    from relm.models.loading import resolve_model_dir
    from relm.trainer.components import pick_device

    if args.steps < 1:
        raise UserError(f"--steps {args.steps}: at least 1")
    device = pick_device(args.device, key="--device").type
    models = _models(args, device)
    _register(args)
    for model in models:
        if not model.startswith("zoo:"):
            resolve_model_dir(model)  # a wrong path is the user's mistake: exit 2 before any work
    if device == "cpu":
        _say_cpu_memory(models)
    options = CompatOptions(
        device=device,
        steps=args.steps,
        stage_timeout_s=args.timeout,
        tokenizer_path=args.tokenizer_path,
        dtype=args.dtype,
        rollout=args.rollout,
        tokenizer_only=args.tokenizer_only,
        max_gpu_memory_gb=args.max_gpu_memory_gb,
        max_host_memory_gb=args.max_host_memory_gb,
        lora_rank=args.lora_rank,
    )
    reports, start = [], time.perf_counter()
    with _quiet_console(args.verbose):
        for model in models:
            print(f"checking {model} ...", file=sys.stderr, flush=True)
            reports.append(check_model_guarded(model, options))
    elapsed = time.perf_counter() - start

    env = environment(device, args.rollout)
    title = (
        f"relm compat on {device} ({len(reports)} model{'s' if len(reports) != 1 else ''}, {elapsed:.0f} s)"
    )
    print_table(reports, title)
    out = Path(args.out)
    write_json(reports, out / "compat.json", env)
    (out / "compat.md").write_text(to_markdown(reports, title))
    if args.json:
        write_json(reports, Path(args.json), env)
    print(f"reports: {out / 'compat.json'}, {out / 'compat.md'}", file=sys.stderr)
    return exit_code(reports)


def _say_cpu_memory(models: list[str]) -> None:
    """Before a CPU check of a model large enough for memory to matter: its estimate, warned if over."""
    from relm.compat.host_memory import cpu_memory_note
    from relm.memory.host import available_host_bytes
    from relm.memory.model_shape import ModelShape
    from relm.models.loading import load_config

    for model in models:
        try:
            _, config, _ = load_config(model)
            num_params = ModelShape.from_config(config).num_params
        except Exception:  # noqa: BLE001 - a model relm cannot run or size: its check reports why, with the others
            continue
        note = cpu_memory_note(model, num_params, available_host_bytes())
        if note is not None:
            line, warn = note
            (logging.getLogger("relm").warning if warn else logging.getLogger("relm").info)(line)


@contextlib.contextmanager
def _quiet_console(verbose: bool) -> Iterator[None]:
    """Warnings land in the report; on the console they would repeat it line by line."""
    handlers = [] if verbose else list(logging.getLogger("relm").handlers)
    levels = [handler.level for handler in handlers]
    for handler in handlers:
        handler.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for handler, level in zip(handlers, levels, strict=True):
            handler.setLevel(level)


def main(argv: list[str] | None = None) -> int:
    return run_guarded(lambda: compat_command(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
