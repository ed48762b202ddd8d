"""Loggers: metrics.jsonl across kills and resumes, console line, TensorBoard, missing packages."""

from __future__ import annotations

import importlib.util
import io
import json
import logging
import math
import re
import sys
from pathlib import Path

import pytest
from rich.console import Console

from relm.errors import UserError
from relm.logs import setup_logging
from relm.trainer import loggers
from relm.trainer.loggers import ConsoleLogger, JsonlLogger, make_loggers, read_metrics


def write_steps(run_dir: Path, steps: range, *, resume_step: int | None = None) -> None:
    sink = JsonlLogger(run_dir, resume_step=resume_step)
    for step in steps:
        sink.log(step, {"critic/score/mean": step / 10})
    sink.close()


def test_resume_drops_steps_after_the_checkpoint_and_a_half_written_line(tmp_path: Path):
    write_steps(tmp_path, range(1, 6))
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 6, "critic/sc')  # the kill came mid-write
    write_steps(tmp_path, range(3, 5), resume_step=2)
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["critic/score/mean"]) for r in records] == [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.4)]


def test_fresh_run_keeps_the_old_record_aside(tmp_path: Path):
    write_steps(tmp_path, range(1, 4))
    write_steps(tmp_path, range(1, 2))
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1]
    (old,) = tmp_path.glob("metrics.*.jsonl")
    assert [r["step"] for r in read_metrics(old)] == [1, 2, 3]


def test_non_finite_values_are_written_as_strings(tmp_path: Path):
    sink = JsonlLogger(tmp_path)
    sink.log(1, {"actor/pg_loss": math.nan, "actor/grad_norm": math.inf})
    sink.close()
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == {
        "step": 1,
        "actor/pg_loss": "nan",
        "actor/grad_norm": "inf",
    }


def test_console_line_shows_the_key_metrics_with_short_labels():
    out = io.StringIO()
    sink = ConsoleLogger(10, Console(file=out, width=200))
    sink.log(
        3, {"critic/score/mean": 0.25, "actor/kl_loss": 0.001, "val-core/a/reward/mean@1": 0.5, "x": 1.0}
    )
    sink.close()
    assert "step 3: score=0.25 kl=0.001 val-core/a/reward/mean@1=0.5" in out.getvalue()


@pytest.mark.parametrize(
    ("metrics", "shown"),
    [
        ({"actor/ppo_kl": 0.5, "actor/kl_loss": 0.02}, "kl=0.02"),
        ({"actor/ppo_kl": 0.5, "actor/reward_kl_penalty": 0.03}, "kl=0.03"),
        ({"actor/ppo_kl": 0.5}, None),
    ],
    ids=["kl-loss", "kl-in-reward", "no-reference"],
)
def test_console_kl_is_the_kl_to_the_reference_and_absent_without_one(metrics, shown):
    line = loggers.console_line(1, {"actor/entropy": 1.0, **metrics})
    assert ("kl=" in line) == (shown is not None)
    if shown:
        assert line == f"step 1: entropy=1 {shown}"


def test_redirected_output_gets_plain_unwrapped_lines():
    out = io.StringIO()  # not a terminal
    sink = ConsoleLogger(10, Console(file=out, width=80))
    metrics = {f"val-core/source_{i}/reward/mean@1": 0.5 for i in range(6)}
    sink.log(1, {"critic/score/mean": 0.25, **metrics})
    sink.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and len(lines[0]) > 80
    assert lines[0].startswith("step 1: score=0.25 val-core/source_0")


def test_a_warning_on_a_terminal_prints_on_its_own_line_above_the_bar():
    setup_logging()
    out = io.StringIO()
    sink = ConsoleLogger(10, Console(file=out, width=100, force_terminal=True))
    sink.log(1, {"critic/score/mean": 0.25})
    logging.getLogger("relm").warning("something to say")
    sink.log(2, {"critic/score/mean": 0.5})
    sink.close()
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())  # drop cursor/colour codes
    assert re.search(r"(^|[\r\n])relm WARNING: something to say\r?\n", text)
    assert "step 2: score=0.5" in text


@pytest.mark.parametrize(("name", "module"), [("wandb", "wandb"), ("tensorboard", "tensorboard")])
def test_missing_package_is_a_user_error_before_the_run_folder_is_touched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, module: str
):
    monkeypatch.setitem(sys.modules, module, None)  # makes `import <module>` fail, installed or not
    with pytest.raises(UserError, match=rf"`trainer.logger` names `{name}` .*run `pip install {module}`"):
        make_loggers(["console", name], tmp_path / "run", 5)
    assert not (tmp_path / "run").exists()


def test_wandb_credentials_come_from_the_environment_or_netrc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert not loggers._has_wandb_credentials()
    netrc_file = tmp_path / ".netrc"
    netrc_file.write_text("machine api.wandb.ai\n  login user\n  password abc123\n")
    netrc_file.chmod(0o600)
    assert loggers._has_wandb_credentials()
    netrc_file.unlink()
    monkeypatch.setenv("WANDB_API_KEY", "abc123")
    assert loggers._has_wandb_credentials()


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="tensorboard not installed")
def test_tensorboard_scalars_and_resume_purge(tmp_path: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def run(steps: range, resume_step: int | None, offset: float) -> None:
        jsonl, sink = make_loggers(["tensorboard"], tmp_path, 10, resume_step=resume_step)
        jsonl.close()
        for step in steps:
            sink.log(step, {"critic/score/mean": step + offset})
        sink.close()

    run(range(1, 5), None, 0.0)
    run(range(3, 5), 2, 0.5)  # killed after step 4, resumed from the checkpoint of step 2
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    points = [(e.step, e.value) for e in events.Scalars("critic/score/mean")]
    assert points == [(1, 1.0), (2, 2.0), (3, 3.5), (4, 4.5)]
