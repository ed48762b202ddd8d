"""Checkpoint folder housekeeping: retention limits, leftovers of an interrupted save, atomic text."""

from __future__ import annotations

from pathlib import Path

import pytest

from relm.trainer.checkpoint import (
    LATEST_FILE,
    checkpoint_steps,
    find_resume_checkpoint,
    prune_checkpoints,
    remove_stale_staging,
)
from relm.trainer.durable import write_atomic_text
from relm.trainer.run_folder import record_checkpoint


def make_checkpoints(run_dir: Path, steps: range, parts: tuple[str, ...] = ("actor", "critic")) -> None:
    for step in steps:
        folder = run_dir / f"global_step_{step}"
        for part in parts:
            (folder / part).mkdir(parents=True)
            (folder / part / "model.safetensors").write_bytes(b"x")
        (folder / "trainer_state.pt").write_bytes(b"x")
        record_checkpoint(run_dir, step)  # relm prunes and replaces only the checkpoints it recorded


def layout(run_dir: Path) -> dict[int, list[str]]:
    return {
        int(p.name.removeprefix("global_step_")): sorted(c.name for c in p.iterdir() if c.is_dir())
        for p in run_dir.glob("global_step_*")
    }


BOTH = ["actor", "critic"]


@pytest.mark.parametrize(
    ("max_actor", "max_critic", "expected"),
    [
        (None, None, {s: BOTH for s in range(1, 6)}),
        (0, -1, {s: BOTH for s in range(1, 6)}),  # below 1 keeps everything, as in verl
        (2, None, {1: ["critic"], 2: ["critic"], 3: ["critic"], 4: BOTH, 5: BOTH}),
        (2, 3, {3: ["critic"], 4: BOTH, 5: BOTH}),
        (1, 1, {5: BOTH}),
        (None, 4, {1: ["actor"], 2: BOTH, 3: BOTH, 4: BOTH, 5: BOTH}),
    ],
)
def test_retention_limits(tmp_path: Path, max_actor, max_critic, expected):
    make_checkpoints(tmp_path, range(1, 6))
    prune_checkpoints(tmp_path, 5, max_actor=max_actor, max_critic=max_critic)
    assert layout(tmp_path) == expected


def test_critic_free_checkpoints_go_whole(tmp_path: Path):
    make_checkpoints(tmp_path, range(1, 4), parts=("actor",))
    removed = prune_checkpoints(tmp_path, 3, max_actor=1, max_critic=None)
    assert layout(tmp_path) == {3: ["actor"]}
    assert sorted(p.name for p in removed) == ["global_step_1", "global_step_2"]


def test_newer_checkpoints_of_an_abandoned_run_are_left_alone(tmp_path: Path):
    # Resumed from step 2 of a folder that already held 4 and 5: the just-saved step 3 must survive.
    make_checkpoints(tmp_path, range(1, 6))
    prune_checkpoints(tmp_path, 3, max_actor=1, max_critic=1)
    assert sorted(layout(tmp_path)) == [3, 4, 5]


def test_stale_staging_is_removed_and_never_counted(tmp_path: Path):
    make_checkpoints(tmp_path, range(2, 3))
    (tmp_path / ".global_step_4.tmp" / "actor").mkdir(parents=True)
    (tmp_path / "global_step_6").mkdir()  # no trainer_state.pt: not a checkpoint
    (tmp_path / (LATEST_FILE + ".tmp")).write_text("4")
    (tmp_path / LATEST_FILE).write_text("2")
    assert checkpoint_steps(tmp_path) == [2]
    removed = remove_stale_staging(tmp_path)
    assert [p.name for p in removed] == [".global_step_4.tmp"]
    assert not (tmp_path / (LATEST_FILE + ".tmp")).exists()
    assert find_resume_checkpoint(tmp_path, "auto", None) == tmp_path / "global_step_2"


def test_a_checkpoint_moved_aside_comes_back_unless_replaced(tmp_path: Path):
    # A kill between moving global_step_2 aside and renaming its new save into place.
    make_checkpoints(tmp_path, range(2, 3))
    (tmp_path / "global_step_2").rename(tmp_path / ".global_step_2.old")
    assert remove_stale_staging(tmp_path) == []
    assert checkpoint_steps(tmp_path) == [2]
    # A kill after the new save was in place: the old copy goes.
    make_checkpoints(tmp_path, range(3, 4))
    (tmp_path / ".global_step_3.old").mkdir()
    assert remove_stale_staging(tmp_path) == [tmp_path / ".global_step_3.old"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["global_step_2", "global_step_3"]


def test_write_atomic_text_replaces_and_leaves_no_temp(tmp_path: Path):
    path = tmp_path / LATEST_FILE
    write_atomic_text(path, "3")
    write_atomic_text(path, "12")
    assert path.read_text() == "12"
    assert [p.name for p in tmp_path.iterdir()] == [LATEST_FILE]
