"""What `relm compat` found, per model and stage, and how it is shown: a table, JSON and Markdown.

The records are plain dataclasses so the JSON written for CI and the Markdown pasted into
docs/models.md come from the same values the console table shows.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from relm.compat.tokenizer_facts import MARKDOWN_HEADER, TokenizerFacts, facts_lines, markdown_row
from relm.models.registry import ArchitectureInfo

StageName = Literal["tokenizer", "load", "rollout", "update"]
STAGES: tuple[StageName, ...] = ("tokenizer", "load", "rollout", "update")
StageStatus = Literal["pass", "fail", "skipped"]
ModelStatus = Literal["pass", "conditional", "fail", "unsupported"]


@dataclass
class StageResult:
    """One stage of one model."""

    name: StageName
    status: StageStatus
    seconds: float = 0.0
    peak_memory_mb: float | None = None
    """CUDA: max allocated during the stage. CPU: peak resident-set growth over the stage's start."""
    memory_kind: str = ""
    error_class: str | None = None
    error: str | None = None
    """One line: the cause, with the check or exception that found it."""
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class ModelReport:
    """Everything found for one model."""

    model: str
    status: ModelStatus
    classification: str
    """supported / probe / unsupported, as `relm.models.registry.classify` said before running."""
    reason: str
    model_dir: str | None = None
    architecture: ArchitectureInfo | None = None
    decisions: list[str] = field(default_factory=list)
    """What relm chose for this model without being told (pad token, attention kernel, dtype)."""
    conditions: list[str] = field(default_factory=list)
    """Settings relm changed after a first attempt failed; a passing model with any is `conditional`."""
    warnings: list[str] = field(default_factory=list)
    stages: list[StageResult] = field(default_factory=list)
    tokenizer: TokenizerFacts | None = None
    """The tokenizer facts relm relied on (pad, eos and end of turn, template, length vs rows)."""

    @property
    def failed_stage(self) -> StageName | None:
        return next((stage.name for stage in self.stages if stage.status == "fail"), None)

    def stage(self, name: StageName) -> StageResult | None:
        return next((stage for stage in self.stages if stage.name == name), None)

    @property
    def seconds(self) -> float:
        return sum(stage.seconds for stage in self.stages)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["failed_stage"] = self.failed_stage
        data["seconds"] = round(self.seconds, 3)
        return _finite(data)


def _finite(value: Any) -> Any:
    """JSON has no NaN/inf: non-finite numbers become their string names."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite(item) for item in value]
    return value


EXIT_MODEL_FAILED = 3
"""`relm compat`'s exit code when a model failed a check: a verdict a CI job can gate on, kept apart from
2 (the user's mistake: a wrong path, a bad option) and 1 (a bug in relm), as docs/models.md says."""


def exit_code(reports: list[ModelReport]) -> int:
    """0 when no model failed (unsupported ones are an answer, not a failure), else `EXIT_MODEL_FAILED`."""
    return EXIT_MODEL_FAILED if any(report.status == "fail" for report in reports) else 0


def write_json(reports: list[ModelReport], path: Path, environment: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"environment": environment, "models": [report.to_dict() for report in reports]}
    path.write_text(json.dumps(payload, indent=2) + "\n")


def _stage_cell(stage: StageResult | None) -> str:
    if stage is None or stage.status == "skipped":
        return "-"
    if stage.status == "fail":
        return f"FAIL ({stage.error_class})"
    return f"pass {stage.seconds:.1f}s"


def _peak_mb(report: ModelReport) -> str:
    peaks = [stage.peak_memory_mb for stage in report.stages if stage.peak_memory_mb is not None]
    return f"{max(peaks):.0f}" if peaks else "-"


def _tokens_per_s(report: ModelReport) -> str:
    rollout = report.stage("rollout")
    value = rollout.metrics.get("tokens_per_s") if rollout else None
    return f"{value:.0f}" if value is not None else "-"


def _note(report: ModelReport) -> str:
    """The one thing to read about a row: the failure, else relm's decisions and conditions."""
    failed = report.stage(report.failed_stage) if report.failed_stage else None
    if failed is not None:
        return failed.error or ""
    if report.status == "unsupported":
        return report.reason
    return "; ".join(report.conditions + report.decisions)


def table_rows(reports: list[ModelReport]) -> list[list[str]]:
    """[model, architecture, status, tokenizer, load, rollout, update, tok/s, peak MB, notes] per model."""
    rows = []
    for report in reports:
        arch = report.architecture.summary() if report.architecture else report.classification
        cells = [_stage_cell(report.stage(name)) for name in STAGES]
        rows.append(
            [
                report.model,
                arch,
                report.status,
                *cells,
                _tokens_per_s(report),
                _peak_mb(report),
                _note(report),
            ]
        )
    return rows


HEADER = ["model", "architecture", "status", *STAGES, "tok/s", "peak MB", "notes"]


def print_table(reports: list[ModelReport], title: str) -> None:
    """The console table (rich); wide cells wrap rather than being cut."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for name in HEADER:
        table.add_column(name, overflow="fold")
    styles = {"pass": "green", "conditional": "yellow", "fail": "bold red", "unsupported": "dim"}
    for report, row in zip(reports, table_rows(reports), strict=True):
        row[2] = f"[{styles[report.status]}]{row[2]}[/]"
        table.add_row(*row)
    console = Console(width=200)
    console.print(table)
    for report in reports:
        if report.tokenizer is not None:
            console.print(f"[bold]{report.model}[/]", highlight=False)
            for line in facts_lines(report.tokenizer):
                console.print(f"  {line}", highlight=False, markup=False)


def to_markdown(reports: list[ModelReport], title: str) -> str:
    """The same table as Markdown (for docs/models.md and CI artifacts), then the tokenizer facts."""
    lines = [f"### {title}", "", *_markdown_table(HEADER, table_rows(reports))]
    facts = [markdown_row(report.model, report.tokenizer) for report in reports if report.tokenizer]
    if facts:
        lines += ["", "Tokenizer facts:", "", *_markdown_table(MARKDOWN_HEADER, facts)]
    return "\n".join(lines) + "\n"


def _markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        lines.append("| " + " | ".join(cell.replace("|", "\\|").replace("\n", " ") for cell in row) + " |")
    return lines
