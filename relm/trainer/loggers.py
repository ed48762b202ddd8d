"""Where step metrics go: the console (progress bar + key metrics), `metrics.jsonl`, TensorBoard, W&B.

TensorBoard and W&B are imported only when named in `trainer.logger`: neither is a dependency of relm,
and a missing one is the user's choice to fix (`pip install ...`), reported as a `UserError`.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import netrc
import os
import sys
import time
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from relm.errors import UserError
from relm.trainer.durable import write_atomic_text

logger = logging.getLogger("relm")

CONSOLE_KEYS = {
    "critic/score/mean": "score",
    "critic/vf_loss": "vf_loss",
    "actor/pg_loss": "pg_loss",
    "actor/entropy": "entropy",
    "response_length/mean": "len",
    "timing_s/step": "s/step",
}
"""The metrics the console line shows, with their short labels; everything goes to metrics.jsonl."""

REFERENCE_KL_KEYS = ("actor/kl_loss", "actor/reward_kl_penalty")
"""The KL to the reference policy, as the run measures it (KL loss, else the in-reward penalty's KL).

The console's `kl=` is this one: it is what users watch for drift from the starting model. A run with
neither has no reference KL, so the line has no `kl=`; `actor/ppo_kl` (old vs new policy within one
update) stays in metrics.jsonl and the plot, under its own name.
"""

LOGGER_PACKAGES = {
    "tensorboard": ("tensorboard", "pip install tensorboard"),
    "wandb": ("wandb", "pip install wandb"),
}
"""Loggers that need a package relm does not depend on: logger name -> (module, install command)."""


class MetricsLogger(Protocol):
    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def _stamp(path: Path) -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.localtime(path.stat().st_mtime))


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl, skipping a line cut short by a kill mid-write."""
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


class JsonlLogger:
    """One JSON object per step, appended and flushed, so a killed run keeps every finished step."""

    def __init__(self, run_dir: Path, *, resume_step: int | None = None) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / "metrics.jsonl"
        if self.path.exists() and resume_step is not None:
            # Steps after the checkpoint will be run again: drop their old lines so each step appears once.
            kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= resume_step]
            write_atomic_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        elif self.path.exists():
            # A fresh run in a used folder: keep the earlier record beside it rather than mixing or losing it.
            earlier = run_dir / f"metrics.{_stamp(self.path)}.jsonl"
            self.path.rename(earlier)
            logger.info(
                "a fresh run in %s: the earlier run's metrics.jsonl is kept as %s", run_dir, earlier.name
            )
        self._file = self.path.open("a", encoding="utf-8")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        record = {"step": step, **{k: (v if math.isfinite(v) else str(v)) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def console_line(step: int, metrics: dict[str, float]) -> str:
    """`step N: score=... kl=... len=...`: the key metrics with short labels, validation headlines last."""
    shown = [f"{label}={metrics[k]:.3g}" for k, label in CONSOLE_KEYS.items() if k in metrics]
    kl = next((metrics[k] for k in REFERENCE_KL_KEYS if k in metrics), None)
    if kl is not None:
        shown.insert(min(4, len(shown)), f"kl={kl:.3g}")  # after entropy, where verl users look for it
    # Validation headlines (val-core/<data_source>/reward/mean@N) when the step validated.
    shown += [f"{k}={v:.3g}" for k, v in metrics.items() if k.startswith("val-core/") and "/mean@" in k]
    return f"step {step}: " + " ".join(shown)


class ConsoleLogger:
    """A progress bar with step and ETA, and one line of key metrics per step above it.

    Only on a terminal: written to a file or a pipe, the output is one plain line per step, never
    wrapped (a log file is read by `grep`, not at 80 columns). While the bar is live, the `relm` logger's
    console lines go through Rich's redirected stderr, so a warning prints on its own line above the bar
    instead of running into it.
    """

    def __init__(self, total_steps: int, console: Console | None = None, *, start_step: int = 0) -> None:
        self.console = console or Console(stderr=False)
        self._progress: Progress | None = None
        self._handler_streams: list[tuple[logging.StreamHandler[Any], Any]] = []
        if not self.console.is_terminal:
            return
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
        self._task = self._progress.add_task("train", total=total_steps, completed=start_step)
        self._progress.start()  # replaces sys.stderr with a proxy that prints above the bar
        for handler in logging.getLogger("relm").handlers:
            if getattr(handler, "_relm_console", False) and isinstance(handler, logging.StreamHandler):
                # Swapped directly, not by setStream: that flushes the old stream, which an embedding
                # app (or a test's capture) may already have closed.
                self._handler_streams.append((handler, handler.stream))
                handler.stream = sys.stderr

    def log(self, step: int, metrics: dict[str, float]) -> None:
        line = console_line(step, metrics)
        if self._progress is None:
            print(line, file=self.console.file, flush=True)
            return
        self._progress.console.print(line, soft_wrap=True)
        self._progress.update(self._task, completed=step)

    def close(self) -> None:
        if self._progress is not None:
            for handler, stream in self._handler_streams:
                handler.stream = stream
            self._handler_streams.clear()
            self._progress.stop()


def _import_for_logger(name: str) -> Any:
    module, install = LOGGER_PACKAGES[name]
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise UserError(
            f"`trainer.logger` names `{name}` but the `{module}` package is not installed; "
            f"run `{install}` or remove `{name}` from trainer.logger"
        ) from exc


def check_logger_packages(names: list[str]) -> None:
    """Raise `UserError` now if a named logger's package is missing (call before loading models)."""
    for name in names:
        if name in LOGGER_PACKAGES:
            _import_for_logger(name)


class TensorBoardLogger:
    """Scalars under `RUN_DIR/tensorboard`, one point per metric per step (`tensorboard --logdir RUN_DIR`)."""

    def __init__(self, run_dir: Path, *, resume_step: int | None = None) -> None:
        _import_for_logger("tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        log_dir = run_dir / "tensorboard"
        if resume_step is None and log_dir.is_dir() and any(log_dir.iterdir()):
            # As with metrics.jsonl: a fresh run does not draw over an earlier run's curves.
            earlier = run_dir / f"tensorboard.{_stamp(log_dir)}"
            log_dir.rename(earlier)
            logger.info(
                "a fresh run in %s: the earlier run's tensorboard/ is kept as %s", run_dir, earlier.name
            )
        # purge_step hides the events a killed run wrote after its checkpoint; they are written again.
        purge_step = resume_step + 1 if resume_step is not None else None
        self._writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for name, value in metrics.items():
            self._writer.add_scalar(name, value, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def _has_wandb_credentials() -> bool:
    """An API key in the environment or from `wandb login` (stored in ~/.netrc)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


class WandbLogger:
    """A W&B run per launch, named `trainer.experiment_name` in project `trainer.project_name`.

    Without credentials (and no `WANDB_MODE` chosen) it logs offline into `RUN_DIR/wandb`, so a machine
    without network or account still trains; `wandb sync` uploads such a run later.
    """

    def __init__(self, run_dir: Path, *, project: str, experiment: str, config: dict[str, Any]) -> None:
        wandb = _import_for_logger("wandb")
        mode = None
        if not os.environ.get("WANDB_MODE") and not _has_wandb_credentials():
            mode = "offline"
            logger.info(
                "wandb: no API key, logging offline to %s (upload later: wandb sync)", run_dir / "wandb"
            )
        self._run = wandb.init(project=project, name=experiment, dir=str(run_dir), config=config, mode=mode)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._run.log(metrics, step=step)

    def close(self) -> None:
        self._run.finish()


def make_loggers(
    names: list[str],
    run_dir: Path,
    total_steps: int,
    *,
    resume_step: int | None = None,
    project: str = "relm",
    experiment: str = "run",
    config: dict[str, Any] | None = None,
) -> list[MetricsLogger]:
    """Build the loggers named in `trainer.logger` (validated beforehand).

    metrics.jsonl is the run's own record (resume, plots and `relm plot` read it), so it is written
    whether or not `jsonl` is named. `config` (the whole run config as a dict) goes to W&B.
    """
    check_logger_packages(names)  # before touching the run folder
    loggers: list[MetricsLogger] = [JsonlLogger(run_dir, resume_step=resume_step)]
    if "tensorboard" in names:
        loggers.append(TensorBoardLogger(run_dir, resume_step=resume_step))
    if "wandb" in names:
        loggers.append(WandbLogger(run_dir, project=project, experiment=experiment, config=config or {}))
    if "console" in names:
        loggers.append(ConsoleLogger(total_steps, start_step=resume_step or 0))
    return loggers
