"""Where step metrics go: the console (progress bar + key metrics) and `metrics.jsonl`."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

CONSOLE_KEYS = {
    "critic/score/mean": "score",
    "critic/vf_loss": "vf_loss",
    "actor/pg_loss": "pg_loss",
    "actor/entropy": "entropy",
    "actor/ppo_kl": "kl",
    "response_length/mean": "len",
    "timing_s/step": "s/step",
}
"""The metrics the console line shows, with their short labels; everything goes to metrics.jsonl."""


class MetricsLogger(Protocol):
    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def close(self) -> None: ...


class JsonlLogger:
    """One JSON object per step, appended and flushed, so a killed run keeps every finished step."""

    def __init__(self, run_dir: Path, *, resume_step: int | None = None) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / "metrics.jsonl"
        if self.path.exists() and resume_step is not None:
            # Steps after the checkpoint will be run again: drop their old lines so each step appears once.
            kept = [
                line
                for line in self.path.read_text(encoding="utf-8").splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= resume_step
            ]
            self.path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        elif self.path.exists():
            # A fresh run in a used folder: keep the earlier record beside it rather than mixing or losing it.
            stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(self.path.stat().st_mtime))
            self.path.rename(run_dir / f"metrics.{stamp}.jsonl")
        self._file = self.path.open("a", encoding="utf-8")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        record = {"step": step, **{k: (v if math.isfinite(v) else str(v)) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class ConsoleLogger:
    """A progress bar with step and ETA, and one line of key metrics per step above it."""

    def __init__(self, total_steps: int, console: Console | None = None) -> None:
        self.console = console or Console(stderr=False)
        self._progress = Progress(
            TextColumn("[bold]step"),
            MofNCompleteColumn(),
            BarColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self._task = self._progress.add_task("train", total=total_steps)
        self._progress.start()

    def log(self, step: int, metrics: dict[str, float]) -> None:
        shown = " ".join(f"{label}={metrics[k]:.3g}" for k, label in CONSOLE_KEYS.items() if k in metrics)
        # Validation headlines (val-core/<data_source>/reward/mean@N) when the step validated.
        shown += "".join(
            f" {k}={v:.3g}" for k, v in metrics.items() if k.startswith("val-core/") and "/mean@" in k
        )
        self._progress.console.print(f"step {step}: {shown}")
        self._progress.update(self._task, completed=step)

    def close(self) -> None:
        self._progress.stop()


def make_loggers(
    names: list[str], run_dir: Path, total_steps: int, *, resume_step: int | None = None
) -> list[MetricsLogger]:
    """Build the loggers named in `trainer.logger` (validated beforehand).

    metrics.jsonl is the run's own record, so it is written whether or not `jsonl` is named.
    """
    loggers: list[MetricsLogger] = [JsonlLogger(run_dir, resume_step=resume_step)]
    if "console" in names:
        loggers.append(ConsoleLogger(total_steps))
    return loggers
