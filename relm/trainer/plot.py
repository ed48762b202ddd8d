"""`RUN_DIR/curves.png`: reward, KL, entropy, response length, losses and throughput over the steps.

Written at the end of every run and by `relm plot RUN_DIR`, from metrics.jsonl alone, so it works on a
run that is still going, was killed, or was trained on another machine. Matplotlib is used through
`Figure` objects only (no pyplot): no global state, no GUI backend, nothing to close.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relm.errors import UserError, run_guarded
from relm.trainer.loggers import read_metrics

CURVES_FILE = "curves.png"


@dataclass(frozen=True)
class Panel:
    """One subplot: a title and the metrics drawn on it (those the run has)."""

    title: str
    metrics: tuple[str, ...]
    prefixes: tuple[str, ...] = ()
    """Metric-name prefixes drawn too, as points (validation runs only on some steps)."""


PANELS = (
    Panel("reward", ("critic/score/mean",), prefixes=("val-core/",)),
    Panel("KL", ("actor/kl_loss", "actor/reward_kl_penalty", "actor/ppo_kl")),
    Panel("entropy", ("actor/entropy",)),
    Panel("response length (tokens)", ("response_length/mean", "response_length/max")),
    Panel("losses", ("actor/pg_loss", "critic/vf_loss")),
    Panel("throughput (tokens/s/GPU)", ("perf/throughput",)),
)


LABELS = {
    "actor/kl_loss": "actor/kl_loss: KL to the reference (loss term)",
    "actor/reward_kl_penalty": "actor/reward_kl_penalty: KL to the reference (in the reward)",
    "actor/ppo_kl": "actor/ppo_kl: old vs new policy (one update)",
}
"""Legend text for metrics whose name alone is read the wrong way: the KL panel holds two kinds of KL."""


def _as_float(value: Any) -> float:
    """metrics.jsonl stores NaN and inf as the strings "nan" / "inf" (JSON has no such numbers)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _series(records: list[dict[str, Any]], name: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], _as_float(r[name])) for r in records if name in r and "step" in r]
    return [s for s, _ in points], [v for _, v in points]


def _draw(ax: Any, panel: Panel, records: list[dict[str, Any]]) -> None:
    from matplotlib.ticker import MaxNLocator

    drawn = 0
    for name in panel.metrics:
        steps, values = _series(records, name)
        if steps:
            ax.plot(steps, values, label=LABELS.get(name, name), linewidth=1.2)
            drawn += 1
    # Validation headlines: val-core/<data_source>/<metric>/mean@N, present on validation steps only.
    extra = sorted(
        {k for r in records for k in r if panel.prefixes and k.startswith(panel.prefixes) and "/mean@" in k}
    )
    for name in extra:
        steps, values = _series(records, name)
        ax.plot(steps, values, "o--", label=name, markersize=4, linewidth=0.8)
        drawn += 1
    ax.set_title(panel.title)
    ax.set_xlabel("step")
    # Steps are whole numbers (a 3-step run otherwise gets ticks at 1.5, 2.5), and a flat curve keeps
    # its values on the axis instead of "+1e-3" offset notation.
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.ticklabel_format(axis="y", useOffset=False, style="plain")
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "not in this run", ha="center", va="center", transform=ax.transAxes, alpha=0.6)


def draw_figure(records: list[dict[str, Any]], title: str) -> Any:
    """The six panels of `records` on one matplotlib `Figure` (returned, not saved)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 8), layout="constrained")
    fig.suptitle(title)
    for ax, panel in zip(fig.subplots(2, 3).flat, PANELS, strict=True):
        _draw(ax, panel, records)
    return fig


def plot_curves(run_dir: Path, out: Path | None = None) -> Path:
    """Draw the run's curves from `run_dir/metrics.jsonl` into `out` (default `run_dir/curves.png`).

    The PNG is written to a temporary name and renamed, so a kill mid-write never leaves half an image.

    Raises:
        UserError: `run_dir` has no metrics.jsonl or it holds no steps.
    """
    metrics_file = run_dir / "metrics.jsonl"
    if not metrics_file.is_file():
        raise UserError(
            f"`{metrics_file}` does not exist; point `relm plot` at a run folder (trainer.default_local_dir)"
        )
    records = read_metrics(metrics_file)
    if not records:
        raise UserError(f"`{metrics_file}` holds no steps yet; plot again once the run has logged one")
    out = out or run_dir / CURVES_FILE
    fig = draw_figure(records, f"{run_dir.name}: {max(r.get('step', 0) for r in records)} steps")
    tmp = out.with_name(out.name + ".tmp")
    fig.savefig(tmp, format="png", dpi=90)
    os.replace(tmp, out)
    return out


def plot_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="relm plot", description="Draw reward, KL, entropy, length, loss and throughput curves of a run."
    )
    parser.add_argument("run_dir", type=Path, help="the run folder (trainer.default_local_dir)")
    parser.add_argument("--out", type=Path, default=None, help="PNG path (default RUN_DIR/curves.png)")
    args = parser.parse_args(argv)
    print(plot_curves(args.run_dir, args.out))
    return 0


def main(argv: list[str]) -> int:
    """`relm plot RUN_DIR [--out FILE.png]`: exit 0 with the PNG's path printed, 2 on a user mistake."""
    return run_guarded(lambda: plot_command(argv))
