"""`relm bench rollout`: new tokens/s, time to first token, peak memory and share of the bandwidth limit.

A random-weight model with a zoo entry's shape is built directly on the device (no weights written
or read; a local folder or Hub id loads its own weights instead), prompts are random ids of one length, and eos is ignored, so every run generates exactly
batch x response-len tokens and runs are comparable across engines, machines and versions.

`--eos-rate P` makes lengths vary instead, as RL rollouts do: a random P share of the vocabulary
ends a response, and random weights sample almost uniformly, so a response stops with probability
about P per token (lengths roughly geometric, mean near 1/P, cut at response-len). That is the
case continuous batching (`--max-num-seqs` below the batch) is for; `--waves` runs the same batch
as separate lock-step calls of max-num-seqs prompts, what an engine without it would do in the
same memory.

`--quantization none fp8` measures the native engine with the model's own weights and with FP8 copies of
its linear layers (`relm.rollout.native.fp8`), one after the other on the same model; each native row
also carries the gap between the engine's logprobs of its sampled tokens and the model's own forward
(the trainer's computation) over the first 16 rows. Random weights sample almost uniformly, so that gap
is smaller than a trained model's would be.

Bandwidth: decoding is memory-bound, so the yardstick is the bytes one decode step must read (the
weights plus the live KV cache) over the step's time, against a device copy measured at start.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, NoReturn

from relm.config.validate import ROLLOUT_QUANTIZATIONS
from relm.errors import UserError, run_guarded

COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")
"""`--compile-mode` choices: the native engine's torch.compile modes (`relm.rollout.native.engine.COMPILE_MODES`
beside None), written out so that `--help` imports no torch; a unit test keeps the two equal."""
ENGINES = ("native", "hf")
TABLE_HEADER = (
    "| date | machine | torch / transformers | model | batch | prompt+new | engine | new tok/s | decode tok/s "
    "| TTFT s | peak GB | % of bandwidth |\n"
    "| --- | --- | --- | --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |"
)
"""Header of docs/benchmarks.md's results table; `markdown_row` writes its rows."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UserError(f"relm bench rollout: {message} (see `relm bench rollout --help`)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="relm bench rollout", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model",
        required=True,
        help="zoo:NAME (random weights with that shape), a local model folder or a Hub id",
    )
    parser.add_argument("--batch", type=int, required=True, help="prompts per generate call (n = 1)")
    parser.add_argument("--prompt-len", type=int, required=True)
    parser.add_argument("--response-len", type=int, required=True)
    parser.add_argument("--engine", choices=(*ENGINES, "both"), default="native")
    parser.add_argument("--dtype", default="auto", help="auto (bf16 on cuda, fp32 on cpu), bfloat16, float32")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs first (native: full size)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    parser.add_argument("--no-cuda-graphs", action="store_true", help="native engine decodes eagerly")
    parser.add_argument(
        "--max-num-seqs",
        type=int,
        help="native: rows decoded at once; fewer than --batch is continuous batching",
    )
    parser.add_argument(
        "--eos-rate",
        type=float,
        default=0.0,
        help="share of the vocabulary that ends a response (0: eos ignored, fixed lengths)",
    )
    parser.add_argument(
        "--waves",
        action="store_true",
        help="with --max-num-seqs: one lock-step call per max-num-seqs prompts",
    )
    parser.add_argument(
        "--compile-mode",
        choices=COMPILE_MODES,
        help="native: torch.compile mode of the compiled pieces",
    )
    parser.add_argument(
        "--no-fused-projections",
        action="store_true",
        help="native: keep q/k/v and gate/up as separate products (fused by default)",
    )
    parser.add_argument(
        "--quantization",
        nargs="+",
        choices=("none", *ROLLOUT_QUANTIZATIONS),
        default=["none"],
        help="native: the weights it generates with, each measured in turn (fp8: FP8 copies of the linear layers)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the results (a list of rows) to this file")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of `relm bench rollout ...`; exit code 0, or 2 on a usage error."""
    args = sys.argv[1:] if argv is None else argv
    return run_guarded(lambda: _run(build_parser().parse_args(args)))


def _run(args: argparse.Namespace) -> int:
    from relm.bench.rollout_measure import measure_rows  # torch and transformers: after `--help`

    rows = measure_rows(args, ENGINES if args.engine == "both" else (args.engine,))
    _print_table(rows)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


def _print_table(rows: list[dict[str, Any]]) -> None:
    first = rows[0]
    print(
        f"{first['model']} ({first['params_b']:.2f}B, {first['dtype']}) on {first['device']}, batch "
        f"{first['batch']}, {first['prompt_len']} prompt + {first['response_len']} new tokens; copy "
        f"bandwidth {first['copy_bandwidth_gbs']:.0f} GB/s; torch {first['torch']}, transformers "
        f"{first['transformers']}"
    )
    if first["eos_rate"]:
        print(
            f"eos active (rate {first['eos_rate']:g}): responses of {first['mean_response_len']:.0f} tokens on "
            f"average, {first['max_response_len']} at most"
        )
    header = (
        f"{'engine':<18} {'new tok/s':>11} {'decode tok/s':>13} {'TTFT s':>8} {'step ms':>8} {'peak GB':>8} "
        f"{'% bw':>6}"
    )
    print(header)
    for row in rows:
        peak = f"{row['peak_gb']:.1f}" if row["peak_gb"] is not None else "-"
        print(
            f"{engine_label(row):<18} {row['new_tokens_per_s']:>11,.0f} {row['decode_tokens_per_s']:>13,.0f} "
            f"{row['ttft_s']:>8.3f} "
            f"{row['decode_step_s'] * 1e3:>8.2f} {peak:>8} {_percent(row['bandwidth_fraction']):>6}"
        )
    speeds = {engine_label(row): row["new_tokens_per_s"] for row in rows}
    if "native" in speeds and "hf" in speeds:
        print(f"native / hf: {speeds['native'] / speeds['hf']:.1f}x")
    for quantization in ROLLOUT_QUANTIZATIONS:
        if "native" in speeds and f"native, {quantization}" in speeds:
            print(
                f"native {quantization} / native: {speeds[f'native, {quantization}'] / speeds['native']:.2f}x"
            )
    for row in rows:
        if "logprob_gap_max" in row:
            print(
                f"{engine_label(row)}: logprob gap to the model's forward (first 16 rows) max "
                f"{row['logprob_gap_max']:.4f}, mean {row['logprob_gap_mean']:.5f}"
                + (f"; fp8 products: {row['fp8_products']}" if row.get("fp8_products") else "")
            )
    for row in rows:
        if row.get("fallback_reason"):
            print(f"note: the native engine fell back to HF: {row['fallback_reason']}")
        if row.get("graphs_disabled_reason"):
            print(f"note: the native engine decoded without CUDA graphs: {row['graphs_disabled_reason']}")
    print("docs/benchmarks.md rows:")
    print(TABLE_HEADER)
    for row in rows:
        print(markdown_row(row))


def markdown_row(row: dict[str, Any]) -> str:
    """One row of docs/benchmarks.md's table (same column order as its header)."""
    peak = f"{row['peak_gb']:.1f}" if row["peak_gb"] is not None else "-"
    cells = [
        row["date"],
        row["device"],
        f"{row['torch']} / {row['transformers']}",
        f"{row['model'].removeprefix('zoo:')} ({row['params_b']:.2f}B {row['dtype']})",
        str(row["batch"]),
        f"{row['prompt_len']}+{row['response_len']}"
        + (f" (eos {row['eos_rate']:g}: mean {row['mean_response_len']:.0f})" if row.get("eos_rate") else ""),
        engine_label(row),
        f"{row['new_tokens_per_s']:,.0f}",
        f"{row['decode_tokens_per_s']:,.0f}",
        f"{row['ttft_s']:.3f}",
        peak,
        _percent(row["bandwidth_fraction"]),
    ]
    return "| " + " | ".join(cells) + " |"


def engine_label(row: dict[str, Any]) -> str:
    """The engine, with how the native one batched when not all rows at once: `native, 64 slots`
    (continuous batching) or `native, waves of 64` (separate lock-step calls)."""
    engine = f"{row['engine']}, {row['quantization']}" if row.get("quantization") else row["engine"]
    if row.get("waves"):
        return f"{engine}, waves of {row['max_num_seqs']}"
    if row.get("slots") is not None and row["slots"] < row["batch"]:
        return f"{engine}, {row['slots']} slots"
    return engine


def _percent(fraction: float) -> str:
    return "-" if math.isnan(fraction) else f"{100 * fraction:.1f}"


if __name__ == "__main__":
    sys.exit(main())
