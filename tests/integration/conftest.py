"""Fixtures for running the real training entry point in-process on a tiny model.

Runs go through `relm.trainer.main_ppo.main`, the function behind `python -m relm.trainer.main_ppo`
and `relm train`, so a test sees what a user sees: the exit code, stdout, stderr and the run folder.
"""

from __future__ import annotations

import json
import logging
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from relm.trainer.main_ppo import main

TINY_OVERRIDES = (
    # The demo's model, named: a run on the user's data must name its model.
    "actor_rollout_ref.model.path=zoo:tiny/qwen2",
    "data.train_batch_size=4",
    "actor_rollout_ref.rollout.n=2",
    "data.max_response_length=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "trainer.total_training_steps=2",
    # The demo preset validates before the first and after the last step; these runs test training.
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
)
"""Sizes that make one PPO step take a few hundredths of a second on the tiny zoo model."""

LETTERS = ("a", "e", "o", "s", "t", "x")


@dataclass
class RunResult:
    """What a user sees after one run of the entry point."""

    exit_code: int
    stdout: str
    stderr: str
    run_dir: Path

    @property
    def metrics(self) -> list[dict[str, Any]]:
        """The records of metrics.jsonl, one per step, in file order."""
        path = self.run_dir / "metrics.jsonl"
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]

    @property
    def stderr_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]


@pytest.fixture(autouse=True)
def relm_log_handler_per_test() -> Iterator[None]:
    """Let `setup_logging` attach a fresh handler each test, so log lines land in this test's stderr.

    Its handler binds the `sys.stderr` of the moment, which pytest swaps per test. And pytest hangs
    its capture handlers on every non-propagating logger (which `setup_logging` makes "relm"); seeing
    a handler there, `setup_logging` would add none and the lines would never reach stderr. Making
    the logger propagate again before the test keeps pytest's handlers off it.
    """
    log = logging.getLogger("relm")
    saved_handlers, saved_propagate = log.handlers[:], log.propagate
    log.handlers.clear()
    log.propagate = True
    yield
    log.handlers[:] = saved_handlers
    log.propagate = saved_propagate


@pytest.fixture
def train(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., RunResult]:
    """`train(*overrides, run_dir=None, tiny=True)`: run the entry point in-process and capture it.

    `tiny` puts `TINY_OVERRIDES` first, so a test's own overrides win; the run folder defaults to a
    fresh folder under the test's tmp_path. `RELM_DEBUG` is cleared: with it set, user errors raise.
    """
    monkeypatch.delenv("RELM_DEBUG", raising=False)
    counter = iter(range(1000))

    def run(*overrides: str, run_dir: Path | None = None, tiny: bool = True) -> RunResult:
        folder = run_dir or tmp_path / f"run{next(counter)}"
        args = [*(TINY_OVERRIDES if tiny else ()), f"trainer.default_local_dir={folder}", *overrides]
        capsys.readouterr()  # drop anything printed before this run
        code = main(args)
        out, err = capsys.readouterr()
        return RunResult(exit_code=code, stdout=out, stderr=err, run_dir=folder)

    return run


def make_verl_rows(
    num_rows: int, *, data_source: str = "relm/letters", content: Callable[[int], Any] | None = None
) -> list[dict[str, Any]]:
    """Rows in verl's parquet layout: one-letter user prompts, the letter as ground truth."""
    rows = []
    for index in range(num_rows):
        letter = LETTERS[index % len(LETTERS)]
        rows.append(
            {
                "data_source": data_source,
                "prompt": [{"role": "user", "content": content(index) if content else letter}],
                "ability": "letters",
                "reward_model": {"style": "rule", "ground_truth": letter},
                "extra_info": {"split": "train", "index": index},
            }
        )
    return rows


@pytest.fixture
def verl_rows() -> Callable[..., list[dict[str, Any]]]:
    """`make_verl_rows` as a fixture, so tests build rows without importing this conftest."""
    return make_verl_rows


@pytest.fixture
def write_parquet(tmp_path: Path) -> Callable[..., Path]:
    """`write_parquet(rows=None, name="train.parquet")`: rows (default 16 `make_verl_rows`) into tmp_path."""

    def write(rows: list[dict[str, Any]] | None = None, name: str = "train.parquet") -> Path:
        path = tmp_path / name
        pq.write_table(pa.Table.from_pylist(make_verl_rows(16) if rows is None else rows), path)
        return path

    return write


VARIED_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return sum(map(ord, solution_str)) % 7 / 6
"""
"""A reward that tells two different responses apart (but for one pair in 7): for runs whose test needs
non-zero advantages from the first step. The demo's rule scores a random tiny model's responses 0 at most
seeds (mean 0.01), so with it a run's first steps have zero advantages and zero gradients at seeds that
depend on what the sampler draws."""


@pytest.fixture
def varied_reward(tmp_path: Path) -> str:
    """`custom_reward_function.path=...` of `VARIED_REWARD`, written beside (not in) the run folders."""
    path = tmp_path / "varied_reward" / "reward.py"
    path.parent.mkdir()
    path.write_text(VARIED_REWARD, encoding="utf-8")
    return f"custom_reward_function.path={path}"


@pytest.fixture
def write_reward(tmp_path: Path) -> Callable[..., Path]:
    """`write_reward(source, name="reward.py")`: write a reward module (source is dedented) to tmp_path."""

    def write(source: str, name: str = "reward.py") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(source), encoding="utf-8")
        return path

    return write
