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
