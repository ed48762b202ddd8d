"""The run folder's `config.yaml`, and the check that a resumed run still means the same training.

Auto-resume (`trainer.resume_mode=auto`) continues whatever checkpoint the run folder holds. A user who
changed the estimator or the learning rate and reran the same command would otherwise get a run that is
neither the old one nor the new one, with nothing saying so. So each start writes the resolved config
beside the checkpoints, and a later start that resumes from them compares its own config with it first:
settings that change what is trained (model, data, estimator, optimizer, batch sizes, sampling, reward)
must match; settings that only change how it runs (micro-batches, offload, logging, validation, the
number of steps) may differ. Naming a checkpoint explicitly (`trainer.resume_mode=resume_path`) is the
user saying "continue anyway": the differences are then logged, not refused.
"""

from __future__ import annotations

import fnmatch
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from relm.config.loader import RUN_CONFIG_FILE
from relm.config.schema import RelmConfig
from relm.errors import UserError

logger = logging.getLogger("relm")

CONFIG_FILE = RUN_CONFIG_FILE

HOW_IT_RUNS = (
    "trainer.*",
    "*micro_batch_size*",
    "*max_token_len*",
    "*use_dynamic_bsz",
    "*offload*",
    "*fsdp_config.*",
    "*gradient_checkpointing",
    "*use_remove_padding",
    "*use_torch_compile",
    "*gpu_memory_utilization",
    "*free_cache_engine",
    "*enforce_eager",
    "*timeout_s",
    "*.val_kwargs.*",
    "data.val_*",
    "data.dataloader_num_workers",
    "actor_rollout_ref.rollout.name",
    "actor_rollout_ref.rollout.mode",
    "actor_rollout_ref.rollout.*_size*",
    "actor_rollout_ref.rollout.max_num_*",
    "actor_rollout_ref.rollout.engine_kwargs.*",
    "*.optim.total_training_steps",
)
"""Leaf keys (shell patterns) whose change does not change what is trained: how it is batched on the
device, where memory lives, what is logged and validated, and how long the run goes on (extending a run
with a larger `trainer.total_training_steps` is the usual reason to resume with a changed command)."""


def write_run_config(cfg: RelmConfig, run_dir: Path) -> Path:
    """Write the resolved config to `run_dir/config.yaml` (every key, defaults filled in)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / CONFIG_FILE
    partial = path.with_name(CONFIG_FILE + ".partial")
    text = yaml.safe_dump(_plain(asdict(cfg)), sort_keys=False)
    if path.is_file() and path.read_text(encoding="utf-8") != text:
        logger.info("%s: replaced by this start's settings (the earlier start's differ)", path)
    partial.write_text(text, encoding="utf-8")
    partial.replace(path)
    return path


def changed_settings(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """`key: old -> new` for each leaf that changes what is trained (see `HOW_IT_RUNS`)."""
    changes = []
    for key in sorted(saved.keys() | current.keys()):
        if any(fnmatch.fnmatchcase(key, pattern) for pattern in HOW_IT_RUNS):
            continue
        old, new = saved.get(key, "<unset>"), current.get(key, "<unset>")
        if old != new:
            changes.append(f"{key}: {old!r} -> {new!r}")
    return changes


def check_resumed_settings(cfg: RelmConfig, run_dir: Path, checkpoint: Path) -> None:
    """Refuse to resume `checkpoint` under settings that change what is trained, unless it was named.

    Raises:
        UserError: `trainer.resume_mode=auto` found a checkpoint whose run had other settings.
    """
    saved_path = run_dir / CONFIG_FILE
    if not saved_path.is_file():
        return  # a run folder from before config.yaml was written: nothing to compare with
    try:
        saved = _flatten(yaml.safe_load(saved_path.read_text(encoding="utf-8")) or {})
    except yaml.YAMLError as exc:
        raise UserError(
            f"{saved_path}: not readable YAML ({' '.join(str(exc).split())[:200]}); restore it, delete it "
            "to resume without the check, or set trainer.resume_mode=disable to start over"
        ) from exc
    changes = changed_settings(saved, _flatten(_plain(asdict(cfg))))
    if not changes:
        return
    listed = "; ".join(changes[:8]) + (f"; and {len(changes) - 8} more" if len(changes) > 8 else "")
    if cfg.trainer.resume_mode == "resume_path":
        logger.warning("resuming %s with changed settings: %s", checkpoint, listed)
        return
    raise UserError(
        f"trainer.default_local_dir: {run_dir} holds a run started with other settings ({listed}); "
        "use a new trainer.default_local_dir for the new settings, or continue that run under them with "
        f"trainer.resume_mode=resume_path trainer.resume_from_path={checkpoint}"
    )


def _flatten(tree: dict[str, Any]) -> dict[str, Any]:
    flat: dict[str, Any] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(f"{prefix}.{key}" if prefix else str(key), value)
        else:
            flat[prefix] = node

    walk("", tree)
    return flat


def _plain(node: Any) -> Any:
    """YAML-safe copy: tuples as lists, paths and other objects as strings."""
    if isinstance(node, dict):
        return {str(key): _plain(value) for key, value in node.items()}
    if isinstance(node, list | tuple):
        return [_plain(value) for value in node]
    if node is None or isinstance(node, bool | int | float | str):
        return node
    return str(node)
