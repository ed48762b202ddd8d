"""A full disk while the run writes a checkpoint or its metrics: exit 2, one line naming the folder.

The failure is injected at the write itself, with the error each writer really raises on a full disk
(measured on a 3 MB tmpfs: safetensors' "I/O error: No space left on device (os error 28)", Python's
OSError errno 28 for metrics.jsonl).
"""

from __future__ import annotations

import errno

import pytest
import transformers.modeling_utils
from safetensors import SafetensorError

from relm.trainer.loggers import JsonlLogger

pytestmark = pytest.mark.integration

FULL_LINE = "is full: writing there failed; free space or point trainer.default_local_dir at a disk with room"


def test_a_full_disk_during_a_checkpoint_keeps_the_earlier_ones(train, tmp_path, monkeypatch):
    real_save = transformers.modeling_utils.safe_save_file

    def save_file(tensors, filename, *args, **kwargs):
        if ".global_step_2.tmp" in str(filename):
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        return real_save(tensors, filename, *args, **kwargs)

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", save_file)
    run_dir = tmp_path / "run"
    result = train("trainer.save_freq=1", run_dir=run_dir)

    assert result.exit_code == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: the disk holding `{run_dir}` (trainer.default_local_dir) {FULL_LINE}; the checkpoints saved "
        "before stay (latest: global_step_1)"
    ], result.stderr
    assert (run_dir / "latest_checkpointed_iteration.txt").read_text() == "1"
    assert sorted(p.name for p in run_dir.iterdir() if "global_step" in p.name) == ["global_step_1"]


def test_a_full_disk_while_writing_metrics(train, tmp_path, monkeypatch):
    real_log = JsonlLogger.log

    def log(self, step, metrics):
        if step == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_log(self, step, metrics)

    monkeypatch.setattr(JsonlLogger, "log", log)
    run_dir = tmp_path / "run"
    result = train("trainer.logger=[console,jsonl]", run_dir=run_dir)

    assert result.exit_code == 2, result.stderr
    assert result.stderr.splitlines()[-1] == (
        f"error: the disk holding `{run_dir}` (trainer.default_local_dir) {FULL_LINE}; no checkpoint was saved yet"
    )
