"""Checkpoints: `global_step_N/` written whole into a temporary folder, flushed, then renamed into place.

Layout of one checkpoint:

    global_step_N/
      actor/              HF folder (config, safetensors, generation config, tokenizer) + optimizer.pt
      critic/             the critic's backbone as an HF folder + value_head.safetensors + optimizer.pt
      trainer_state.pt    step, data position, KL controller, RNG states, loop counters

Optimizer and scheduler states sit inside the model's subfolder so that deleting an old actor (see
`trainer.max_actor_ckpt_to_keep`) frees its optimizer's moments too, which are twice its size.

Only folders relm wrote are ever replaced or deleted: each step is recorded in the run folder's
`relm_run.json` before its rename (`relm.trainer.run_folder`), and a folder is deleted by renaming it to
`.NAME.deleting` first, so a kill mid-delete leaves a name the next start finishes off.

The rename is the commit point. Every file and folder is fsynced before it, so a kill -9 (or a power
cut) mid-save leaves at worst a `.global_step_N.tmp` folder that is never read and is removed at the
next start; `latest_checkpointed_iteration.txt` is replaced (atomically too) only after the rename, so
it always names a complete checkpoint.

A data-parallel run (torchrun) writes `actor/` and `critic/` as sharded DCP saves instead (layout in
`relm.distributed.checkpoint`): every rank writes its shards into the same staging folder, rank 0
writes the rest and commits. Either format resumes at any world size, and `relm export` turns either
into a plain HF folder.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file

from relm.distributed.checkpoint import (
    is_sharded,
    load_full_into_sharded,
    load_full_optimizer_into_sharded,
    load_sharded,
    save_sharded,
)
from relm.distributed.safe_load import load_pt
from relm.errors import UserError
from relm.learner.lora import has_lora, is_adapter_folder, load_adapter_weights
from relm.learner.trainee import Trainee
from relm.trainer.durable import fsync_dir, fsync_tree, write_atomic_text
from relm.trainer.run_folder import forget_checkpoint, record_checkpoint, recorded_steps

if TYPE_CHECKING:
    from relm.trainer.components import RunComponents

logger = logging.getLogger("relm")

LATEST_FILE = "latest_checkpointed_iteration.txt"
STATE_FILE = "trainer_state.pt"
OPTIMIZER_FILE = "optimizer.pt"
STAGING_PATTERN = ".global_step_*.tmp"
DELETING_SUFFIX = ".deleting"
"""A folder relm is deleting is renamed `.NAME.deleting` first; one left by a kill goes at the next start."""


def checkpoint_steps(run_dir: Path) -> list[int]:
    """Steps of the complete `global_step_N` folders relm wrote in `run_dir` (recorded in its manifest, with
    trainer_state.pt), ascending; another tool's `global_step_N` is never one of them."""
    recorded = recorded_steps(run_dir)
    steps = []
    for path in run_dir.glob("global_step_*"):
        suffix = path.name.removeprefix("global_step_")
        if suffix.isdigit() and int(suffix) in recorded and (path / STATE_FILE).is_file():
            steps.append(int(suffix))
    return sorted(steps)


def _delete(path: Path) -> None:
    """Remove a folder relm wrote so that a kill midway leaves a name `remove_stale_staging` finishes off.

    The rename to `.NAME.deleting` is atomic: the folder is either whole under its name or on its way out.
    """
    doomed = path.with_name(f".{path.name}{DELETING_SUFFIX}")
    os.replace(path, doomed)
    shutil.rmtree(doomed)


def remove_stale_staging(run_dir: Path) -> list[Path]:
    """Clear what a killed save left behind; returns the folders removed.

    `.global_step_N.tmp` folders were never finished and go, and so do the `.NAME.deleting` folders of a
    prune that was killed midway (see `_delete`). A `.global_step_N.old` folder is a complete
    checkpoint moved aside to be replaced by a new save of the same step: it goes if the new one made it
    into place, and is put back otherwise.
    """
    stale = sorted(run_dir.glob(STAGING_PATTERN))
    stale += sorted(run_dir.glob(f".global_step_*{DELETING_SUFFIX}"))  # a prune killed midway
    for step in recorded_steps(run_dir):
        stale += sorted((run_dir / f"global_step_{step}").glob(f".*{DELETING_SUFFIX}"))
    for aside in sorted(run_dir.glob(".global_step_*.old")):
        original = run_dir / aside.name.removeprefix(".").removesuffix(".old")
        if original.exists():
            stale.append(aside)
        else:
            os.replace(aside, original)
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    (run_dir / (LATEST_FILE + ".tmp")).unlink(missing_ok=True)
    if stale:
        logger.info(
            "removed %d folder(s) left by an interrupted checkpoint save or prune: %s",
            len(stale), ", ".join(str(path.relative_to(run_dir)) for path in stale),
        )  # fmt: skip
    return stale


def _save_optimizer(folder: Path, optimizer: torch.optim.Optimizer, scheduler: Any) -> None:
    torch.save(
        {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, folder / OPTIMIZER_FILE
    )


def save_checkpoint(c: RunComponents, step: int, loop_state: dict[str, Any] | None = None) -> Path:
    """Save each trainee (actor, critic) with its optimizer and scheduler, then data position, KL, RNG and
    `loop_state`.

    `loop_state` holds the loop's own counters (e.g. the skip guard's), restored by `load_checkpoint`.
    Data-parallel, every rank calls it (a collective); the run folder must be shared by all nodes.
    """
    final = c.run_dir / f"global_step_{step}"
    staging = c.run_dir / f".global_step_{step}.tmp"
    if c.dist.is_main:
        logger.info("saving checkpoint %s", final)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    c.dist.barrier()
    if c.dist.is_distributed:
        for trainee in c.trainees:
            save_sharded(trainee.module, trainee.optimizer, trainee.scheduler, staging / trainee.name, c.dist)
        c.dist.barrier()  # every shard is written before rank 0 commits
        if c.dist.is_main:
            c.tokenizer.save_pretrained(staging / "actor")
    else:
        for trainee in c.trainees:
            trainee.module.save_pretrained(staging / trainee.name)  # type: ignore[operator]  # nn.Module hides the HF model's API
            _save_optimizer(staging / trainee.name, trainee.optimizer, trainee.scheduler)
        c.tokenizer.save_pretrained(staging / "actor")
    if c.dist.is_main:
        _commit(c, step, staging, final, loop_state)
    c.dist.barrier()
    return final


def _commit(
    c: RunComponents, step: int, staging: Path, final: Path, loop_state: dict[str, Any] | None
) -> None:
    """Write the trainer state, flush everything, rename the staging folder into place, name it latest."""
    state = {
        "step": step,
        "has_critic": c.critic is not None,
        "loader": c.loader.state_dict(),
        "kl_ctrl": c.kl_ctrl.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "shuffle_rng": c.generator.get_state(),
        "loop": dict(loop_state or {}),
    }
    torch.save(state, staging / STATE_FILE)
    fsync_tree(staging)
    if final.exists() and step not in recorded_steps(c.run_dir):
        raise UserError(
            f"`{final}` appeared in the run folder during the run and relm did not write it; move it away "
            "and run the same command again to resume"
        )
    record_checkpoint(c.run_dir, step)  # before the rename: no folder relm wrote is ever unlisted
    if final.exists():
        # Saving a step again (a run resumed from an earlier step): move the old one aside first, because
        # a folder cannot be renamed over a non-empty one; `remove_stale_staging` undoes a kill in between.
        logger.info("replacing %s, saved earlier by a run of this folder", final)
        aside = c.run_dir / f".global_step_{step}.old"
        os.replace(final, aside)
        os.replace(staging, final)
        shutil.rmtree(aside)
    else:
        os.replace(staging, final)
    fsync_dir(c.run_dir)
    write_atomic_text(c.run_dir / LATEST_FILE, str(step))


def find_resume_checkpoint(run_dir: Path, resume_mode: str, resume_from_path: str | None) -> Path | None:
    """The checkpoint folder to resume from, per `trainer.resume_mode`, or None for a fresh start.

    `auto` resumes from the folder `latest_checkpointed_iteration.txt` names, if there is one (as in
    verl, that file is the truth: a newer folder it does not name was not finished when it was written);
    `resume_path` requires `trainer.resume_from_path`; `disable` always starts fresh.
    """
    if resume_mode == "disable":
        return None
    if resume_mode == "resume_path":
        path = Path(resume_from_path or "")
        if not (path / STATE_FILE).is_file():
            raise UserError(
                f"trainer.resume_from_path: `{path}` is not a complete relm checkpoint (no {STATE_FILE}); "
                "point it at a global_step_N folder"
            )
        return path
    latest = run_dir / LATEST_FILE
    if not latest.is_file():
        return None
    text = latest.read_text(encoding="utf-8").strip()
    path = run_dir / f"global_step_{text}"
    if not text.isdigit() or not (path / STATE_FILE).is_file():
        raise UserError(
            f"{latest}: names step `{text}` but `{path}` is not a complete checkpoint; "
            "set trainer.resume_mode=disable to start fresh or fix the file"
        )
    return path


def _storage(tensor: torch.Tensor) -> int:
    """Address of a tensor's data; an FSDP2 DTensor's is its local shard's."""
    to_local = getattr(tensor, "to_local", None)
    return (to_local() if to_local is not None else tensor).data_ptr()


def _load_module_weights(
    module: torch.nn.Module,
    folder: Path,
    what: str,
    load: Callable[[dict[str, torch.Tensor]], None] | None = None,
) -> None:
    """Load every *.safetensors tensor in `folder` into `module` by name, refusing a mismatch.

    `load` replaces `module.load_state_dict` (a sharded module takes whole tensors another way).
    """
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        if file.name != "value_head.safetensors":
            tensors.update(load_file(str(file)))
    own = module.state_dict()
    shapes_differ = [k for k, t in tensors.items() if k in own and own[k].shape != t.shape]
    unknown = [k for k in tensors if k not in own]
    if shapes_differ or unknown or not tensors:
        culprit = (shapes_differ or unknown or ["no weights"])[0]
        raise UserError(
            f"checkpoint `{folder}` does not fit this run's {what} (first mismatch: `{culprit}`); "
            "it was saved for another model: set trainer.resume_mode=disable or point model.path at that model"
        )
    missing = set(own) - set(tensors)
    # Tied weights (lm_head = embed_tokens) are saved once; they share storage with a loaded tensor.
    loaded_ptrs = {_storage(own[k]) for k in tensors if k in own}
    tied = {name for name in missing if _storage(own[name]) in loaded_ptrs}
    if missing - tied:
        raise UserError(
            f"checkpoint `{folder}` lacks {what} weights such as `{sorted(missing - tied)[0]}`: it was saved for "
            "another model; set trainer.resume_mode=disable or point model.path at that model"
        )
    if load is None:
        module.load_state_dict(tensors, strict=False)
    else:
        load(tensors)


def _load_optimizer(
    folder: Path,
    state: dict[str, Any],
    prefix: str,
    optimizer: Any,
    scheduler: Any,
    sharded_model: torch.nn.Module | None = None,
) -> None:
    """From `folder/optimizer.pt`, or from trainer_state.pt for checkpoints written before it existed.

    `sharded_model`: the optimizer's FSDP model, whose shards take the saved whole states.
    """
    if (folder / OPTIMIZER_FILE).is_file():
        saved = load_pt(folder / OPTIMIZER_FILE)
        optim_state, scheduler_state = saved["optimizer"], saved["scheduler"]
    else:
        optim_state, scheduler_state = state[f"{prefix}_optimizer"], state[f"{prefix}_scheduler"]
    if sharded_model is None:
        optimizer.load_state_dict(optim_state)
    else:
        load_full_optimizer_into_sharded(sharded_model, optimizer, optim_state)
    scheduler.load_state_dict(scheduler_state)


def _require_folder(path: Path, what: str) -> Path:
    folder = path / what
    if not folder.is_dir():
        raise UserError(
            f"checkpoint `{path}` has no {what} (removed by trainer.max_{what}_ckpt_to_keep?); "
            "resume from a newer global_step_N folder"
        )
    return folder


def _load_trainee(c: RunComponents, trainee: Trainee, folder: Path, state: dict[str, Any]) -> None:
    """One trained model's weights, optimizer and schedule, from either format into a sharded or plain model.

    A plain folder holds a causal LM's weights, or a `ValueModel`'s backbone beside its
    `value_head.safetensors`.
    """
    model, what = trainee.module, trainee.name
    if is_sharded(folder):
        load_sharded(model, trainee.optimizer, trainee.scheduler, folder, what)
        return
    sharded = model if c.dist.is_distributed else None
    head_file = folder / "value_head.safetensors"
    has_head = hasattr(model, "value_head")
    head = load_file(str(head_file)) if has_head else {}
    body: Any = model.backbone if has_head else model  # an HF model (or a value model's backbone)
    if sharded is None and has_lora(body):
        # A LoRA run saves only its adapters (a PEFT folder): the frozen base comes from model.path.
        if not is_adapter_folder(folder):
            raise UserError(
                f"checkpoint `{folder}` holds full {what} weights but this run trains LoRA adapters; resume it "
                "with lora_rank=0, or set trainer.resume_mode=disable"
            )
        load_adapter_weights(body, folder)
        if has_head:
            model.value_head.load_state_dict(head)  # type: ignore[union-attr]  # nn.Module hides the value head
    elif sharded is None:
        if is_adapter_folder(folder):
            raise UserError(
                f"checkpoint `{folder}` holds LoRA adapters, not full {what} weights; resume it with the "
                "lora_rank it was trained with, or set trainer.resume_mode=disable"
            )
        _load_module_weights(body, folder, what)
        if has_head:
            model.value_head.load_state_dict(head)  # type: ignore[union-attr]  # nn.Module hides the HF model's API
    else:

        def load_whole(tensors: dict[str, torch.Tensor]) -> None:
            if has_head:
                tensors = {f"backbone.{k}": v for k, v in tensors.items()}
                tensors.update({f"value_head.{k}": v for k, v in head.items()})
            load_full_into_sharded(model, tensors)

        _load_module_weights(model.backbone if has_head else model, folder, what, load_whole)  # type: ignore[arg-type]  # nn.Module hides the HF model's API
    _load_optimizer(folder, state, what, trainee.optimizer, trainee.scheduler, sharded)


@dataclass
class Restored:
    """What `load_checkpoint` hands back to the loop."""

    step: int
    """The step the checkpoint was saved after; the loop continues at step + 1."""
    loop_state: dict[str, Any] = field(default_factory=dict)
    """The `loop_state` given to `save_checkpoint` (empty for older checkpoints)."""


def load_checkpoint(c: RunComponents, path: Path) -> Restored:
    """Restore everything `save_checkpoint` wrote."""
    state = load_pt(path / STATE_FILE)  # tensors, dicts and numbers only: a crafted file runs nothing
    if c.critic is not None and not state.get("has_critic", "critic_optimizer" in state):
        raise UserError(f"checkpoint `{path}` has no critic; it was saved by a critic-free run")
    for trainee in c.trainees:
        _load_trainee(c, trainee, _require_folder(path, trainee.name), state)
    if not c.spec.loop.val_only:  # validation draws no training prompts (and may have none of its own)
        c.loader.load_state_dict(state["loader"])
    c.kl_ctrl.load_state_dict(state["kl_ctrl"])
    torch.set_rng_state(state["torch_rng"])
    c.generator.set_state(state["shuffle_rng"])
    c.engine.sync_weights(c.weight_sync.tensors())
    c.weight_sync.verify()
    return Restored(step=int(state["step"]), loop_state=dict(state.get("loop", {})))


def prune_checkpoints(
    run_dir: Path, saved_step: int, *, max_actor: int | None, max_critic: int | None
) -> list[Path]:
    """Delete the oldest actors / critics beyond the limits after `saved_step` was saved; returns them.

    Only checkpoints relm recorded writing count (`checkpoint_steps`), and of those only the ones up to
    `saved_step`: newer ones left by an earlier, abandoned run of the same folder are replaced as this
    run reaches their step. A folder loses its actor or critic subfolder
    when one limit is exceeded, and goes whole when both are (or it has nothing else left).
    """
    # As in verl, None (or a number below 1) keeps everything.
    max_actor = max_actor if max_actor is not None and max_actor >= 1 else None
    max_critic = max_critic if max_critic is not None and max_critic >= 1 else None
    if max_actor is None and max_critic is None:
        return []
    steps = [s for s in checkpoint_steps(run_dir) if s <= saved_step]
    removed = []
    for rank, step in enumerate(reversed(steps)):  # rank 0 is the newest
        folder = run_dir / f"global_step_{step}"
        drop = {
            "actor": max_actor is not None and rank >= max_actor,
            "critic": max_critic is not None and rank >= max_critic,
        }
        remaining = [name for name in ("actor", "critic") if (folder / name).is_dir() and not drop[name]]
        if not remaining:
            _delete(folder)
            forget_checkpoint(run_dir, step)
            removed.append(folder)
            continue
        for name in ("actor", "critic"):
            if drop[name] and (folder / name).is_dir():
                _delete(folder / name)
                removed.append(folder / name)
    return removed
