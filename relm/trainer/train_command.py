"""What `relm train` does once its arguments are read: check everything cheap, then build the run and train.

Kept apart from `relm.trainer.main_ppo` (the entry point) so that `relm train --help` prints without
importing torch and transformers.
"""

from __future__ import annotations

import logging
import os
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from transformers import PretrainedConfig

from relm.config.context_fit import fitted_lengths, fitted_micro_batches, require_named_model
from relm.config.loader import load_config_with_warnings, user_set_keys
from relm.config.schema import RelmConfig
from relm.config.specs import RunSpec
from relm.config.translate import translate
from relm.config.validate import CONFIG_OK_MESSAGE, validate_config
from relm.distributed.context import in_torchrun, init_distributed
from relm.distributed.launcher import launch, needs_torchrun, world_size_of
from relm.distributed.tensor_parallel import check_tensor_parallel
from relm.errors import UserError
from relm.memory.host_allocator import set_host_allocator
from relm.models.loading import load_config as load_model_config
from relm.models.registry import import_external_lib
from relm.rewards.custom import ComputeScore, resolve_compute_score
from relm.trainer.checkpoint import find_resume_checkpoint
from relm.trainer.components import build_components, pick_device
from relm.trainer.disk_full import disk_full_message, is_disk_full
from relm.trainer.loggers import check_logger_packages
from relm.trainer.ppo import train
from relm.trainer.run_config import CONFIG_FILE, check_resumed_settings, write_run_config
from relm.trainer.run_folder import claim_run_folder, run_folder_lock
from relm.trainer.samples import claim_dump_folders

logger = logging.getLogger("relm")


def train_command(argv: list[str], cfg: RelmConfig) -> int:
    """Validate everything cheap first, say so, then build the run and train.

    `cfg` is `argv` loaded (by the entry point, before torch was imported). A run of several processes
    that is not yet inside torchrun starts it here (on each node: `relm.distributed.launcher`), after the
    checks, so a mistake is reported once rather than by every rank.
    """
    user_keys = user_set_keys(argv)
    require_named_model(cfg, user_keys)
    model = cfg.actor_rollout_ref.model
    # Cheap checks of the model (its config only: architecture, positions) and of the reward file
    # (imported once here, used by the run) come before the success line, so it means what it says.
    import_external_lib(
        model.external_lib, "actor_rollout_ref.model.external_lib"
    )  # may register an architecture the next line needs
    model_dir, model_config, _ = load_model_config(
        model.path, override_config=model.override_config, trust_remote_code=model.trust_remote_code
    )
    max_positions = getattr(model_config.get_text_config(), "max_position_embeddings", None)
    fitted = fitted_lengths(cfg, user_keys, max_positions)
    if fitted:
        argv, cfg = with_overrides(argv, fitted)
        logger.info(
            "%s follow the model's context of %d positions (left at their defaults, they would not fit)",
            ", ".join(argv[-len(fitted) :]),
            max_positions,
        )
    micro_batches = fitted_micro_batches(cfg, user_keys)
    if micro_batches:
        argv, cfg = with_overrides(argv, micro_batches)
        logger.info(
            "%s: the micro-batch left at its default splits each GPU's share of a mini-batch",
            ", ".join(argv[-len(micro_batches) :]),
        )
    validate_config(cfg, max_position_embeddings=max_positions)
    spec, unused = translate(cfg)  # once: every component is built from its part of `spec`
    for line in unused:
        logger.warning("%s", line)
    # verl imports it before building the critic (its model config does)
    import_external_lib(spec.critic.source.external_lib, "critic.model.external_lib")
    reward = cfg.custom_reward_function
    compute_score = resolve_compute_score(
        reward.path, reward.name, batched=cfg.reward_model.reward_manager == "batch"
    )
    check_logger_packages(cfg.trainer.logger)
    run_dir = Path(cfg.trainer.default_local_dir)
    # One process holds the run folder: this one when it starts a one-node torchrun (whose workers
    # inherit the hold), else global rank 0: of a torchrun started by hand, or of several nodes, where
    # a `relm train` runs on every node and rank 0 may land on any of them.
    holds_folder = os.environ.get("RANK") == "0" if in_torchrun() else cfg.trainer.nnodes == 1
    with run_folder_lock(run_dir) if holds_folder else nullcontext():
        if holds_folder:
            claim_run_folder(run_dir)
            claim_dump_folders(spec.loop, run_dir)
        return _train_in_folder(cfg, spec, argv, run_dir, model_config, model_dir, compute_score)


def _train_in_folder(
    cfg: RelmConfig,
    spec: RunSpec,
    argv: list[str],
    run_dir: Path,
    model_config: PretrainedConfig,
    model_dir: str,
    compute_score: ComputeScore,
) -> int:
    """The rest of `train_command`, run while this run holds its folder."""
    trainer_cfg = cfg.trainer
    checkpoint = find_resume_checkpoint(run_dir, trainer_cfg.resume_mode, trainer_cfg.resume_from_path)
    if checkpoint is not None:
        check_resumed_settings(cfg, run_dir, checkpoint)  # before anything loads
    device = pick_device(cfg.trainer.device)  # `cuda` on a machine without one fails here, not after loading
    if device.type == "cpu":
        set_host_allocator(world_size_of(spec))
    if cfg.actor_rollout_ref.rollout.name == "vllm":
        from relm.rollout.vllm_engine import cpu_head_size_problem

        problem = cpu_head_size_problem(model_config, torch.device(device))
        if problem:
            raise UserError(problem)
    # Checked here, once, before torchrun starts the ranks that would each stop on it.
    check_tensor_parallel(model_config, spec.engine.tensor_parallel_size, str(spec.actor.source.path))
    if needs_torchrun(spec, device) and not in_torchrun():
        return launch(spec, argv, device)
    dist = init_distributed(
        device, expected_world_size=world_size_of(spec), per_node=spec.loop.n_gpus_per_node
    )
    finished = False
    try:
        if dist.is_main:
            print(CONFIG_OK_MESSAGE, flush=True)
            record_run_config(cfg)

        components = build_components(
            spec, model_dir, tracked_config=asdict(cfg), compute_score=compute_score, dist=dist
        )
        try:
            train(components)
        finally:
            components.reward.close()  # the reward workers end with the run, however it ends
        finished = True
    except Exception as exc:
        if not isinstance(exc, UserError) and is_disk_full(exc, run_dir):
            raise UserError(disk_full_message(run_dir, clean=dist.is_main)) from exc
        raise
    finally:
        dist.close(finished=finished)
    return 0


def with_overrides(argv: list[str], overrides: dict[str, Any]) -> tuple[list[str], RelmConfig]:
    """`argv` with `overrides` appended as `key=value`, and the config it loads: loaded again rather than
    patched, so every value derived from the overridden keys follows; the warnings the first load printed
    are not repeated."""
    argv = [*argv, *(f"{key}={value}" for key, value in overrides.items())]
    return argv, load_config_with_warnings(argv)[0]


def record_run_config(cfg: RelmConfig) -> None:
    """`config.yaml` in the run folder: what this start trains, for the user and for the next resume.

    A validation-only start (`trainer.val_only`) of a folder that has one leaves it as it is: it trains
    nothing, and the file must keep saying how the run that is evaluated was trained."""
    run_dir = Path(cfg.trainer.default_local_dir)
    if cfg.trainer.val_only and (run_dir / CONFIG_FILE).is_file():
        return
    path = write_run_config(cfg, run_dir)
    logger.info("resolved config in %s", path)
