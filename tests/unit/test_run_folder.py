"""A run folder belongs to one run at a time, and relm touches only the files it wrote there.

The runs here stop before any model loads (a refusal), or are a process that only holds the lock, so the
file stays fast; tests/integration/test_resume.py resumes relm's own checkpoints through the whole loop.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from relm.config.loader import load_config
from relm.config.translate import translate
from relm.errors import UserError
from relm.trainer.checkpoint import LATEST_FILE, checkpoint_steps, prune_checkpoints, remove_stale_staging
from relm.trainer.main_ppo import main
from relm.trainer.run_folder import LOCK_FILE, claim_run_folder, record_checkpoint, run_folder_lock
from relm.trainer.samples import GenerationSample, ValidationSamples, claim_dump_folders, write_step_dump

TINY = ["trainer.total_training_steps=1", "trainer.logger=[]", "trainer.val_before_train=false"]


def error_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if not line.startswith("relm INFO:")]


def verl_run_folder(run_dir: Path) -> dict[str, bytes]:
    """verl's layout: global_step_N/actor/... with no trainer_state.pt, and its latest-step file."""
    for step in (1, 2):
        (run_dir / f"global_step_{step}" / "actor").mkdir(parents=True)
        (run_dir / f"global_step_{step}" / "actor" / "model_world_size_1_rank_0.pt").write_bytes(b"verl")
        (run_dir / f"global_step_{step}" / "data.pt").write_bytes(b"verl")
    (run_dir / LATEST_FILE).write_text("2")
    return snapshot(run_dir)


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_verl_run_folder_is_never_cleared(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    before = verl_run_folder(tmp_path)
    # What the old refusal advised (`resume_mode=disable`) deleted verl's global_step_1 at the first save.
    code = main(
        [*TINY, "trainer.save_freq=1", "trainer.resume_mode=disable", f"trainer.default_local_dir={tmp_path}"]
    )
    assert code == 2
    err = error_lines(capsys)
    assert len(err) == 1 and "global_step_1" in err[0] and "relm did not write" in err[0]
    assert {k: v for k, v in snapshot(tmp_path).items() if k != LOCK_FILE} == before


def test_a_verl_checkpoint_is_never_pruned(tmp_path: Path):
    verl_run_folder(tmp_path)
    (tmp_path / "global_step_1" / "trainer_state.pt").write_bytes(b"x")  # even one that looks like relm's
    before = snapshot(tmp_path)
    assert prune_checkpoints(tmp_path, 3, max_actor=1, max_critic=1) == []
    assert checkpoint_steps(tmp_path) == []
    assert snapshot(tmp_path) == before


def test_a_user_folder_keeps_its_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    (tmp_path / "config.yaml").write_text("my: settings\n")
    (tmp_path / "curves.png").write_bytes(b"my plot")
    before = snapshot(tmp_path)
    assert main([*TINY, f"trainer.default_local_dir={tmp_path}"]) == 2
    err = error_lines(capsys)
    assert len(err) == 1 and err[0].startswith("error:") and "trainer.default_local_dir" in err[0]
    assert {k: v for k, v in snapshot(tmp_path).items() if k != LOCK_FILE} == before


def test_a_run_folder_written_before_the_manifest_is_taken_over(tmp_path: Path):
    (tmp_path / "global_step_2" / "actor").mkdir(parents=True)
    (tmp_path / "global_step_2" / "trainer_state.pt").write_bytes(b"x")
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    (tmp_path / "config.yaml").write_text("trainer:\n  default_local_dir: x\n")
    claim_run_folder(tmp_path)
    assert checkpoint_steps(tmp_path) == [2]


HOLD = """
import sys, time
from pathlib import Path
from relm.trainer.run_folder import run_folder_lock
with run_folder_lock(Path(sys.argv[1]), "relm train --the-first-run"):
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_second_run_on_a_folder_in_use_stops_naming_the_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    first = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout is not None and first.stdout.readline().strip() == "held"
        assert main([*TINY, f"trainer.default_local_dir={tmp_path}"]) == 2
        err = error_lines(capsys)
        assert len(err) == 1 and f"PID {first.pid}" in err[0] and "relm train --the-first-run" in err[0]
    finally:
        first.kill()
        first.wait()
    # Killed (-9) while holding it: the kernel dropped the lock and the PID left behind is taken over.
    with run_folder_lock(tmp_path, "second"):
        assert (tmp_path / LOCK_FILE).read_text().split("\n")[:2] == [str(os.getpid()), "second"]


def test_a_half_pruned_checkpoint_is_finished_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    for step in (1, 2, 3):
        (tmp_path / f"global_step_{step}" / "actor").mkdir(parents=True)
        (tmp_path / f"global_step_{step}" / "actor" / "model.safetensors").write_bytes(b"x" * 100)
        (tmp_path / f"global_step_{step}" / "trainer_state.pt").write_bytes(b"x")
        record_checkpoint(tmp_path, step)
    real_rmtree = shutil.rmtree

    def killed_midway(path: Path, *args: object, **kwargs: object) -> None:
        (Path(path) / "trainer_state.pt").unlink(missing_ok=True)  # some files went, then the kill
        raise KeyboardInterrupt

    monkeypatch.setattr(shutil, "rmtree", killed_midway)
    with pytest.raises(KeyboardInterrupt):
        prune_checkpoints(tmp_path, 3, max_actor=1, max_critic=None)
    monkeypatch.setattr(shutil, "rmtree", real_rmtree)
    # The newest older step goes first; it is never left half-deleted under its own name.
    assert not (tmp_path / "global_step_2").exists()
    remove_stale_staging(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["global_step_1", "global_step_3"]
    assert checkpoint_steps(tmp_path) == [1, 3]


def test_dumps_keep_user_files_and_each_other(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    user = tmp_path / "mine"
    user.mkdir()
    (user / "1.jsonl").write_text("my notes\n")
    cfg = load_config([f"trainer.rollout_data_dir={user}"])
    with pytest.raises(UserError, match="trainer.rollout_data_dir"):
        claim_dump_folders(translate(cfg)[0].loop, tmp_path / "run")
    assert (user / "1.jsonl").read_text() == "my notes\n"

    shared = tmp_path / "samples"
    cfg = load_config([f"trainer.rollout_data_dir={shared}", f"trainer.validation_data_dir={shared}"])
    claim_dump_folders(translate(cfg)[0].loop, tmp_path / "run")
    claim_dump_folders(translate(cfg)[0].loop, tmp_path / "run")  # the same run again (a resume) may go on
    sample = GenerationSample("q", "a", "gt", 1.0)
    ValidationSamples(translate(cfg)[0].loop, tmp_path / "run").write(1, [sample])
    write_step_dump(shared, 1, [sample])  # what the loop's rollout dump writes for step 1
    assert sorted(p.name for p in shared.glob("*.jsonl")) == ["1.jsonl", "validation_1.jsonl"]
    with pytest.raises(UserError, match="holds the samples of the run in"):
        claim_dump_folders(translate(cfg)[0].loop, tmp_path / "another-run")


def test_each_run_with_data_gets_a_folder_named_for_it():
    demo = load_config([])
    assert demo.trainer.default_local_dir == "outputs/demo"  # where the README says
    gsm8k = load_config(
        ["data.train_files=outputs/gsm8k/train.parquet", "actor_rollout_ref.model.path=outputs/tiny-qwen2.5"]
    )
    assert gsm8k.trainer.experiment_name == "gsm8k-tiny-qwen2.5"
    assert gsm8k.trainer.default_local_dir == "checkpoints/relm/gsm8k-tiny-qwen2.5"
    named = load_config(["data.train_files=outputs/gsm8k/train.parquet", "trainer.experiment_name=mine"])
    assert named.trainer.default_local_dir == "checkpoints/relm/mine"


def test_a_fresh_run_says_it_keeps_the_earlier_metrics(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    from relm.trainer.loggers import JsonlLogger

    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    with caplog.at_level("INFO", logger="relm"):
        JsonlLogger(tmp_path).close()
    kept = list(tmp_path.glob("metrics.*.jsonl"))
    assert len(kept) == 1 and any(kept[0].name in record.getMessage() for record in caplog.records)


def test_the_lock_file_names_the_holder_while_held(tmp_path: Path):
    with run_folder_lock(tmp_path, "relm train x"):
        assert (tmp_path / LOCK_FILE).read_text().splitlines() == [str(os.getpid()), "relm train x"]
    assert (tmp_path / LOCK_FILE).read_text() == ""  # released cleanly: no PID left behind
