"""Checkpoints: `global_step_N/` written whole into a temporary folder, then renamed into place.

The rename is the commit point: a run killed mid-save leaves a `.tmp` folder that is never read, and
`latest_checkpointed_iteration.txt` is replaced (also atomically) only after the rename, so it always
names a complete checkpoint.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file

from relm.errors import UserError

if TYPE_CHECKING:
    from relm.trainer.components import RunComponents

LATEST_FILE = "latest_checkpointed_iteration.txt"


def _write_atomic_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_checkpoint(c: RunComponents, step: int) -> Path:
    """Save actor (HF folder + tokenizer), critic, optimizers, schedulers, data position, KL and RNG state."""
    final = c.run_dir / f"global_step_{step}"
    staging = c.run_dir / f".global_step_{step}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    c.actor.save_pretrained(staging / "actor")
    c.tokenizer.save_pretrained(staging / "actor")
    state = {
        "step": step,
        "actor_optimizer": c.actor_optimizer.state_dict(),
        "actor_scheduler": c.actor_scheduler.state_dict(),
        "loader": c.loader.state_dict(),
        "kl_ctrl": c.kl_ctrl.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "shuffle_rng": c.generator.get_state(),
    }
    if c.critic is not None:
        c.critic.save_pretrained(staging / "critic")
        state["critic_optimizer"] = c.critic_optimizer.state_dict()
        state["critic_scheduler"] = c.critic_scheduler.state_dict()
    torch.save(state, staging / "trainer_state.pt")
    if final.exists():
        shutil.rmtree(final)
    os.replace(staging, final)
    _write_atomic_text(c.run_dir / LATEST_FILE, str(step))
    return final


def find_resume_checkpoint(run_dir: Path, resume_mode: str, resume_from_path: str | None) -> Path | None:
    """The checkpoint folder to resume from, per `trainer.resume_mode`, or None for a fresh start.

    `auto` resumes from the folder `latest_checkpointed_iteration.txt` names, if there is one;
    `resume_path` requires `trainer.resume_from_path`; `disable` always starts fresh.
    """
    if resume_mode == "disable":
        return None
    if resume_mode == "resume_path":
        path = Path(resume_from_path or "")
        if not (path / "trainer_state.pt").is_file():
            raise UserError(
                f"trainer.resume_from_path: `{path}` is not a complete relm checkpoint (no trainer_state.pt); "
                "point it at a global_step_N folder"
            )
        return path
    latest = run_dir / LATEST_FILE
    if not latest.is_file():
        return None
    text = latest.read_text(encoding="utf-8").strip()
    path = run_dir / f"global_step_{text}"
    if not text.isdigit() or not (path / "trainer_state.pt").is_file():
        raise UserError(
            f"{latest}: names step `{text}` but `{path}` is not a complete checkpoint; "
            "set trainer.resume_mode=disable to start fresh or fix the file"
        )
    return path


def _load_module_weights(module: torch.nn.Module, folder: Path, what: str) -> None:
    """Load every *.safetensors tensor in `folder` into `module` by name, refusing a mismatch."""
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
    loaded_ptrs = {own[k].data_ptr() for k in tensors if k in own}
    tied = {name for name in missing if own[name].data_ptr() in loaded_ptrs}
    if missing - tied:
        raise UserError(f"checkpoint `{folder}` lacks {what} weights such as `{sorted(missing - tied)[0]}`")
    module.load_state_dict(tensors, strict=False)


def load_checkpoint(c: RunComponents, path: Path) -> int:
    """Restore everything `save_checkpoint` wrote; returns the step it was saved after."""
    try:
        state = torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=False)
    except Exception as exc:  # noqa: BLE001 - a damaged file is the user's checkpoint problem
        raise UserError(
            f"`{path / 'trainer_state.pt'}` cannot be read ({type(exc).__name__}); resume from another step"
        ) from exc
    _load_module_weights(c.actor, path / "actor", "actor")
    c.actor_optimizer.load_state_dict(state["actor_optimizer"])
    c.actor_scheduler.load_state_dict(state["actor_scheduler"])
    if c.critic is not None:
        if "critic_optimizer" not in state:
            raise UserError(f"checkpoint `{path}` has no critic; it was saved by a critic-free run")
        _load_module_weights(c.critic.backbone, path / "critic", "critic")
        c.critic.value_head.load_state_dict(load_file(str(path / "critic" / "value_head.safetensors")))
        c.critic_optimizer.load_state_dict(state["critic_optimizer"])
        c.critic_scheduler.load_state_dict(state["critic_scheduler"])
    c.loader.load_state_dict(state["loader"])
    c.kl_ctrl.load_state_dict(state["kl_ctrl"])
    torch.set_rng_state(state["torch_rng"])
    c.generator.set_state(state["shuffle_rng"])
    c.engine.sync_weights(c.actor.named_parameters())
    return int(state["step"])
