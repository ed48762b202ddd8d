"""A crafted checkpoint file never runs code: resume and `relm export` refuse it with one line naming it.

Each crafted file is a pickle whose `__reduce__` asks to create a marker file on load; relm's own files
hold only tensors, dicts, lists, numbers and strings, so they still load.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any, cast

import pytest
import torch
from transformers import Qwen2Config

from relm.cli import main as relm_main
from relm.distributed.checkpoint import DCP_FOLDER, SCHEDULER_FILE, load_sharded
from relm.errors import UserError
from relm.trainer.checkpoint import OPTIMIZER_FILE, STATE_FILE, _load_optimizer, load_checkpoint


class Planted:
    """Unpickled, it creates `marker`: what an attacker's payload would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (str(self.marker), "w"))  # creating the file is the proof that code ran


def crafted(path: Path, marker: Path, *, as_torch: bool = True) -> Path:
    """Write a pickle at `path` that creates `marker` when loaded unguarded."""
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"step": 1, "scheduler": {}, "optimizer": {}, "optimizer_saved": True, "x": Planted(marker)}
    if as_torch:
        torch.save(payload, path)
    else:
        path.write_bytes(pickle.dumps(Planted(marker)))
    return path


def refused_naming(exc: pytest.ExceptionInfo[UserError], path: Path) -> bool:
    return str(path) in str(exc.value) and "refused" in str(exc.value)


def test_a_crafted_trainer_state_does_not_run(tmp_path: Path):
    marker = tmp_path / "marker"
    folder = tmp_path / "global_step_1"
    state = crafted(folder / STATE_FILE, marker)
    with pytest.raises(UserError) as exc:
        load_checkpoint(cast(Any, None), folder)  # the state is read before anything of the run is used
    assert not marker.exists()
    assert refused_naming(exc, state)


def test_a_crafted_optimizer_file_does_not_run(tmp_path: Path):
    marker = tmp_path / "marker"
    path = crafted(tmp_path / "actor" / OPTIMIZER_FILE, marker)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    with pytest.raises(UserError) as exc:
        _load_optimizer(tmp_path / "actor", {}, "actor", optimizer, scheduler)
    assert not marker.exists()
    assert refused_naming(exc, path)


def test_a_crafted_scheduler_file_of_a_sharded_save_does_not_run(tmp_path: Path):
    marker = tmp_path / "marker"
    path = crafted(tmp_path / "actor" / SCHEDULER_FILE, marker)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    with pytest.raises(UserError) as exc:
        load_sharded(model, optimizer, scheduler, tmp_path / "actor", "actor")
    assert not marker.exists()
    assert refused_naming(exc, path)


def tiny_config(folder: Path) -> None:
    Qwen2Config(
        vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1,
    ).save_pretrained(folder)  # fmt: skip


def test_export_of_a_sharded_checkpoint_with_crafted_metadata_does_not_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    marker = tmp_path / "marker"
    checkpoint = tmp_path / "global_step_1"
    tiny_config(checkpoint / "actor")
    (checkpoint / STATE_FILE).write_bytes(b"")
    metadata = crafted(checkpoint / "actor" / DCP_FOLDER / ".metadata", marker, as_torch=False)
    assert relm_main(["export", str(checkpoint), str(tmp_path / "out")]) == 2
    assert not marker.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and str(metadata) in err[0]


class WithExtraState(torch.nn.Linear):
    def __init__(self) -> None:
        super().__init__(2, 2)

    def get_extra_state(self) -> Any:
        return {"note": "plain"}

    def set_extra_state(self, state: Any) -> None:
        pass


def test_a_crafted_value_inside_dcp_shards_does_not_run(tmp_path: Path):
    import torch.distributed.checkpoint as dcp

    marker = tmp_path / "marker"
    state = {**torch.nn.Linear(2, 2).state_dict(), "_extra_state": Planted(marker)}
    dcp.save({"model": state}, checkpoint_id=str(tmp_path / DCP_FOLDER))
    assert not marker.exists()
    target = WithExtraState()  # declares a non-tensor value, which DCP reads from the shard file
    with pytest.raises(UserError) as exc:
        load_sharded(target, None, None, tmp_path, "export")
    assert not marker.exists()
    assert "refused" in str(exc.value)


def test_relm_own_state_files_still_load(tmp_path: Path):
    """What `_commit` and `_save_optimizer` write (RNG states, loader position, AdamW and LambdaLR states)."""
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5)
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    scheduler.step()
    folder = tmp_path / "actor"
    folder.mkdir()
    torch.save(
        {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, folder / OPTIMIZER_FILE
    )
    fresh = torch.optim.AdamW(model.parameters())
    fresh_scheduler = torch.optim.lr_scheduler.LambdaLR(fresh, lambda step: 0.5)
    _load_optimizer(folder, {}, "actor", fresh, fresh_scheduler)
    assert fresh_scheduler.last_epoch == 1
    assert torch.equal(
        fresh.state_dict()["state"][0]["exp_avg"], optimizer.state_dict()["state"][0]["exp_avg"]
    )
