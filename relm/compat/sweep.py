"""`python -m relm.compat.sweep`: `relm compat` on a tiny model of every type in transformers'
causal-LM mapping, on each engine, into one table (docs/models.md, "Every causal-LM type").

The types come from the installed transformers (`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`), so a type a new
release adds is checked without a hand list; each is built from its own config class
(`relm.models.tiny_types`). Types run in a few worker processes, one type at a time each: a type that
crashes its worker (a segfault, the kernel's OOM killer) is reported as such and a new worker takes the
next type, so one model never takes the others' reports with it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENGINES = ("native", "hf")
"""`--rollout native|hf`. The `default` verdict (compat as a user runs it: the HF reference engine in the
rollout stage, the default engine, native, in the update stage) is put together from the two runs'
stages rather than run a third time (`default_verdict`)."""
MAX_TINY_PARAMS = 50_000_000
"""A tiny config still above this could not be shrunk by `tiny_config`: not built (the sweep's limit)."""


@dataclass
class TypeResult:
    """One model type: how it was built and compat's verdict per engine."""

    model_type: str
    built: str = "yes"
    """`yes`, or why the sweep could not build a tiny model of it (transformers' own error)."""
    verdicts: dict[str, str] = field(default_factory=dict)
    """Engine -> pass / conditional / fail / unsupported / crashed."""
    notes: dict[str, str] = field(default_factory=dict)
    """Engine -> the report's one line (failure, refusal or conditions)."""
    seconds: float = 0.0


def _note(report: dict[str, Any]) -> str:
    failed = next((stage for stage in report["stages"] if stage["status"] == "fail"), None)
    if failed is not None:
        return f"{failed['name']}: {failed['error_class']}: {failed['error']}"
    if report["status"] == "unsupported":
        return str(report["reason"])
    return "; ".join(report["conditions"])


def default_verdict(hf: dict[str, Any], native: dict[str, Any]) -> tuple[str, str]:
    """Default compat's verdict and note from `--rollout hf`'s tokenizer, load and rollout stages and
    `--rollout native`'s update stage (the stages default compat runs on those engines)."""
    if hf["status"] == "unsupported":
        return "unsupported", str(hf["reason"])
    stages = [stage for stage in hf["stages"] if stage["name"] != "update"]
    stages += [stage for stage in native["stages"] if stage["name"] == "update"]
    failed = next((stage for stage in stages if stage["status"] == "fail"), None)
    if failed is not None:
        return "fail", f"{failed['name']}: {failed['error_class']}: {failed['error']}"
    conditions = list(dict.fromkeys(hf["conditions"] + native["conditions"]))
    return ("conditional" if conditions else "pass"), "; ".join(conditions)


def check_type(model_type: str, engines: tuple[str, ...], stage_timeout_s: float) -> TypeResult:
    """Build `model_type`'s tiny folder and run compat on it once per engine (in this process)."""
    import torch
    from transformers import AutoModelForCausalLM

    from relm.compat.checks import CompatOptions, check_model_guarded
    from relm.models.char_tokenizer import build_char_tokenizer
    from relm.models.registry import classify
    from relm.models.tiny_types import default_config, tiny_config

    result = TypeResult(model_type)
    reports: dict[str, dict[str, Any]] = {}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"relm-sweep-{model_type}-") as folder:
        try:
            refused = classify(default_config(model_type)).status == "unsupported"
            config = default_config(model_type) if refused else tiny_config(model_type)
            if not refused:
                with torch.device("meta"):
                    num_params = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
                if num_params > MAX_TINY_PARAMS:
                    raise ValueError(f"its smallest config still has {num_params / 1e6:.0f}M parameters")
            config.save_pretrained(folder)
            build_char_tokenizer().save_pretrained(folder)
        except Exception as exc:  # noqa: BLE001 - transformers' own failure is the row's content
            lines = str(exc).strip().splitlines()
            result.built = f"{type(exc).__name__}: {lines[0][:200] if lines else ''}"
            result.seconds = time.perf_counter() - start
            return result
        for engine in engines:
            options = CompatOptions(
                device="cpu", stage_timeout_s=stage_timeout_s, rollout=None if engine == "default" else engine
            )
            report = check_model_guarded(folder, options).to_dict()
            result.verdicts[engine] = report["status"]
            result.notes[engine] = _note(report).replace(folder, "MODEL")
            reports[engine] = report
            if report["status"] == "unsupported":
                break  # the same refusal on every engine
    refusal = next((r for r in reports.values() if r["status"] == "unsupported"), None)
    if refusal is not None:
        result.verdicts = dict.fromkeys(("default", *engines), "unsupported")
        result.notes = dict.fromkeys(("default", *engines), _note(refusal).replace(folder, "MODEL"))
    elif "native" in reports and "hf" in reports:
        result.verdicts["default"], result.notes["default"] = default_verdict(
            reports["hf"], reports["native"]
        )
    result.seconds = time.perf_counter() - start
    return result


def _worker(engines: tuple[str, ...], stage_timeout_s: float) -> None:
    """Read one type a line from stdin, answer one JSON line on stdout each."""
    import logging
    import warnings

    import transformers

    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    logging.getLogger("relm").setLevel(logging.ERROR)
    out = sys.stdout
    sys.stdout = sys.stderr  # anything a model prints stays off the answer channel
    for line in sys.stdin:
        try:
            result = check_type(line.strip(), engines, stage_timeout_s)
        except Exception as exc:  # noqa: BLE001 - one type's failure is its own row, the worker goes on
            note = f"the sweep itself failed: {type(exc).__name__}: {str(exc).strip()[:200]}"
            result = TypeResult(line.strip(), verdicts=dict.fromkeys(engines, "crashed"))
            result.notes = dict.fromkeys(engines, note)
        out.write(json.dumps(result.__dict__) + "\n")
        out.flush()


def run_sweep(
    types: list[str], engines: tuple[str, ...], num_workers: int, stage_timeout_s: float
) -> Iterator[TypeResult]:
    """Every type through worker processes; results in the order they finish."""
    pending = list(reversed(types))
    lock = threading.Lock()
    results: list[TypeResult] = []
    done = threading.Condition(lock)

    def serve() -> None:
        worker: subprocess.Popen[str] | None = None
        while True:
            with lock:
                if not pending:
                    break
                model_type = pending.pop()
            if worker is None or worker.poll() is not None:
                worker = _start_worker(engines, stage_timeout_s)
            assert worker.stdin is not None and worker.stdout is not None
            worker.stdin.write(model_type + "\n")
            worker.stdin.flush()
            answer = worker.stdout.readline()
            if answer:
                result = TypeResult(**json.loads(answer))
            else:
                code = worker.wait()
                result = TypeResult(
                    model_type, verdicts=dict.fromkeys(engines, "crashed"),
                    notes=dict.fromkeys(engines, f"the worker process died (exit code {code})"),
                )  # fmt: skip
            with done:
                results.append(result)
                done.notify()
        if worker is not None and worker.stdin is not None:
            worker.stdin.close()
            worker.wait()

    threads = [threading.Thread(target=serve, daemon=True) for _ in range(num_workers)]
    for thread in threads:
        thread.start()
    for count in range(len(types)):
        with done:
            while len(results) <= count:
                done.wait()
            yield results[count]
    for thread in threads:
        thread.join()


def _start_worker(engines: tuple[str, ...], stage_timeout_s: float) -> subprocess.Popen[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "relm.compat.sweep", "--worker", "--engines", ",".join(engines)]
    command += ["--timeout", str(stage_timeout_s)]
    return subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )


def counts(results: list[TypeResult], engine: str = "default") -> dict[str, int]:
    """How many types got each verdict on `engine` (`not built` for those the sweep could not build)."""
    tally: dict[str, int] = {}
    for result in results:
        key = result.verdicts.get(engine, "not built") if result.built == "yes" else "not built"
        tally[key] = tally.get(key, 0) + 1
    return tally


def markdown_table(results: list[TypeResult], engines: tuple[str, ...]) -> str:
    """One row a type: its verdict per engine and the one line that says why, where one does."""
    columns = ("default", *engines) if set(ENGINES) <= set(engines) else engines
    header = ["type", *(f"{engine} engine" if engine != "default" else "default" for engine in columns)]
    header.append("why")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for result in sorted(results, key=lambda r: r.model_type):
        if result.built != "yes":
            cells = ["not built"] * len(columns)
            why = f"transformers cannot build it at tiny size: {result.built}"
        else:
            cells = [result.verdicts.get(engine, result.verdicts.get(engines[0], "-")) for engine in columns]
            why = next((f"{e}: {result.notes[e]}" for e in columns if result.notes.get(e)), "")
        row = [result.model_type, *cells, why.replace("|", "\\|")]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


DOCS_BEGIN = "<!-- every-type table: written by `make compat-types-docs` -->"
DOCS_END = "<!-- end of the every-type table -->"


def write_docs_table(path: Path, results: list[TypeResult], engines: tuple[str, ...]) -> None:
    """Put the table, with the counts above it, between `DOCS_BEGIN` and `DOCS_END` in `path`."""
    import transformers

    text = path.read_text()
    before, _, rest = text.partition(DOCS_BEGIN)
    _, _, after = rest.partition(DOCS_END)
    tally = ", ".join(f"{count} {verdict}" for verdict, count in sorted(counts(results).items()))
    block = (
        f"{DOCS_BEGIN}\n\ntransformers {transformers.__version__}: {len(results)} types; default compat: {tally}.\n\n"
        f"{markdown_table(results, engines)}\n{DOCS_END}"
    )
    path.write_text(before + block + after)


def docs_table_rows(path: Path) -> dict[str, list[str]]:
    """type -> its verdict cells, from the table in `path` (for the test that keeps it current)."""
    _, _, rest = path.read_text().partition(DOCS_BEGIN)
    rows: dict[str, list[str]] = {}
    for line in rest.partition(DOCS_END)[0].splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        if line.startswith("| ") and cells[0] not in ("type",) and not cells[0].startswith("---"):
            rows[cells[0]] = cells[1:-1]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m relm.compat.sweep", description=__doc__)
    parser.add_argument("types", nargs="*", help="model types (default: every causal-LM type)")
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per stage")
    parser.add_argument("--json", help="write every type's result here")
    parser.add_argument("--markdown", help="write the table here")
    parser.add_argument("--docs", help="replace the table between the sweep's markers in this file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    engines = tuple(args.engines.split(","))
    if args.worker:
        _worker(engines, args.timeout)
        return 0
    from relm.models.tiny_types import causal_lm_types

    types = args.types or causal_lm_types()
    start = time.perf_counter()
    results = []
    for result in run_sweep(types, engines, args.workers, args.timeout):
        results.append(result)
        verdicts = " ".join(f"{e}={v}" for e, v in result.verdicts.items()) or f"not built ({result.built})"
        print(f"{result.model_type}: {verdicts} ({result.seconds:.1f} s)", flush=True)
    elapsed = time.perf_counter() - start
    print(f"{len(results)} types in {elapsed:.0f} s; default: {counts(results)}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps([r.__dict__ for r in results], indent=1) + "\n")
    if args.markdown:
        Path(args.markdown).write_text(markdown_table(results, engines))
    if args.docs:
        write_docs_table(Path(args.docs), results, engines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
