"""A checkpoint's models as plain Hugging Face folders: the work behind `relm export` (relm/export.py).

A checkpoint's `actor/` already is an HF folder, with relm's optimizer state beside the weights. The
export copies what a user of the model needs (safetensors, config, generation config, tokenizer) and
leaves the training state behind, so `AutoModelForCausalLM.from_pretrained(OUT_DIR)` loads the policy
exactly as trained (same tensors, same dtype, hence the same logits).

With `--critic`, OUT_DIR gets two folders: `actor/` and `critic/` (the critic's transformer backbone,
loadable with `AutoModel`, plus `value_head.safetensors`: a Linear(hidden, 1) applied to its last hidden
state; relm's `load_value_model` reads both).

A LoRA run's checkpoint holds only the adapters (a PEFT folder: adapter_config.json naming the base,
adapter_model.safetensors). The export copies it as it is, which `AutoModelForCausalLM.from_pretrained`
(with peft installed) or `PeftModel.from_pretrained(base, OUT_DIR)` load onto the base; `--merge` writes the
base with the adapters merged in instead, a plain HF folder that needs neither peft nor the base.

A checkpoint of a data-parallel run holds sharded DCP saves instead of safetensors (see
`relm.distributed.checkpoint`); the export gathers them into the same plain HF folders, in one process,
one tensor at a time (never the whole fp32 model at once: `export_sharded`).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from relm.distributed.checkpoint import SCHEDULER_FILE, export_sharded, is_sharded
from relm.errors import UserError
from relm.learner.lora import ADAPTER_CONFIG, LoraSettings, add_lora, is_adapter_folder, without_adapters
from relm.models.loading import load_causal_lm
from relm.models.value_model import VALUE_HEAD_FILE, load_value_model
from relm.trainer.checkpoint import LATEST_FILE, OPTIMIZER_FILE, STATE_FILE, find_resume_checkpoint
from relm.trainer.durable import fsync_dir, fsync_tree

MODEL_FILES = ("config.json", "generation_config.json")
"""Files of the model itself; with the weights they are what a tokenizer-less copy would hold."""


def resolve_checkpoint(path: Path) -> Path:
    """A `global_step_N` folder as given, or the latest checkpoint of a run folder."""
    if path.name.endswith(".tmp"):
        raise UserError(f"`{path}` is a save that never finished; export a global_step_N folder instead")
    if (path / STATE_FILE).is_file():
        return path
    latest = find_resume_checkpoint(path, "auto", None)  # raises if the latest file names a broken step
    if latest is not None:
        return latest
    if path.name.startswith("global_step_") and path.is_dir():
        raise UserError(f"`{path}` is an incomplete checkpoint (no {STATE_FILE}); export another step")
    raise UserError(
        f"`{path}` is not a relm checkpoint; give a global_step_N folder or a run folder (with {LATEST_FILE})"
    )


def _weights(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.safetensors.index.json"))


def _require_model(checkpoint: Path, name: str) -> Path:
    folder = checkpoint / name
    if name == "critic" and not folder.exists() and not any(checkpoint.parent.glob("global_step_*/critic")):
        raise UserError(
            f"checkpoint `{checkpoint}` has no critic: the run trained without one (GRPO, RLOO and the other "
            "critic-free estimators); export without --critic"
        )
    if is_adapter_folder(folder) and _weights(folder):
        return folder  # a LoRA run's checkpoint: the adapter alone, the base is its model.path
    if not (folder / "config.json").is_file() or not (_weights(folder) or is_sharded(folder)):
        raise UserError(
            f"checkpoint `{checkpoint}` has no complete {name} (config.json and *.safetensors); "
            f"it may have been removed by trainer.max_{name}_ckpt_to_keep: export a newer step"
        )
    return folder


def _copy_files(source: Path, dest: Path, keep: Callable[[Path], bool]) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for file in sorted(source.iterdir()):
        if file.is_file() and file.name not in (OPTIMIZER_FILE, SCHEDULER_FILE) and keep(file):
            # copyfile, not copy2: checkpoint files are written private (0600, via a temporary file);
            # an exported model is for others to read, so it gets the user's usual mode (umask).
            shutil.copyfile(file, dest / file.name)


def _is_tokenizer_file(file: Path) -> bool:
    """Whatever in an actor folder is not weights, model config or training state is the tokenizer's."""
    return file.name not in (*MODEL_FILES, ADAPTER_CONFIG) and not file.name.endswith(
        (".safetensors", ".safetensors.index.json")
    )


def _write_generation_config(folder: Path) -> None:
    """Checkpoints of models without a generation config get the one transformers derives from config."""
    if (folder / "generation_config.json").is_file():
        return
    from transformers import AutoConfig, GenerationConfig

    GenerationConfig.from_model_config(AutoConfig.from_pretrained(folder)).save_pretrained(folder)


def _merged_lora(folder: Path, dest: Path, base: str | None, *, value_model: bool) -> None:
    """Write a LoRA checkpoint folder's model with its adapter merged in, as a plain HF folder.

    The base is the adapter's `base_model_name_or_path` (the run's model.path as it was resolved), or
    `base` when given; the merged weights are the adapted layers' `W + scaling * B @ A`.
    """
    config = json.loads((folder / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    base = base or config.get("base_model_name_or_path")
    if not base:
        raise UserError(f"`{folder}/{ADAPTER_CONFIG}` names no base model; pass --base MODEL_PATH")
    model: Any
    if value_model:
        model = _load_base(load_value_model, base, folder)
        add_lora(
            model.backbone,
            LoraSettings(rank=int(config["r"]), alpha=float(config["lora_alpha"]), adapter_path=str(folder)),
        )
        model.value_head.load_state_dict(load_file(str(folder / VALUE_HEAD_FILE)))
        model.backbone = without_adapters(model.backbone)
    else:
        model = _load_base(load_causal_lm, base, folder)
        add_lora(
            model,
            LoraSettings(rank=int(config["r"]), alpha=float(config["lora_alpha"]), adapter_path=str(folder)),
        )
        model = without_adapters(model)
    model.save_pretrained(dest)


def _load_base(loader: Callable[..., Any], base: str, folder: Path) -> Any:
    """The base model in fp32 on the CPU; a base that cannot be loaded is one line naming `--base`.

    A checkpoint written before relm recorded absolute paths may name its base relative to the folder
    training ran in, which from elsewhere is not found (or looks like a Hub id).
    """
    try:
        return loader(base, dtype=torch.float32, device="cpu")
    except UserError as exc:
        raise UserError(
            f"the base model `{base}` of the LoRA adapter `{folder}` cannot be loaded ({exc}); pass "
            "--base MODEL_PATH, the model.path the run trained"
        ) from exc


def _set_base(dest: Path, base: str) -> None:
    """Name `base` in the exported adapter_config.json, so PEFT and transformers load it onto that model."""
    config_file = dest / ADAPTER_CONFIG
    config = json.loads(config_file.read_text(encoding="utf-8"))
    local = Path(base).expanduser()
    config["base_model_name_or_path"] = str(local.absolute()) if local.is_dir() else base
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def export_checkpoint(
    checkpoint: Path, out_dir: Path, *, critic: bool = False, merge: bool = False, base: str | None = None
) -> list[Path]:
    """Write the checkpoint's actor (and critic) as HF folders under `out_dir`; returns the folders.

    Without `critic`, `out_dir` itself is the actor's folder; with it, `out_dir/actor` and
    `out_dir/critic`. Everything is written to `.OUT_DIR.tmp` beside it and renamed at the end, so an
    interrupted export leaves no half folder under the name asked for.

    Raises:
        UserError: the checkpoint is missing or incomplete, or `out_dir` exists and is not empty.
    """
    checkpoint = resolve_checkpoint(checkpoint)
    actor = _require_model(checkpoint, "actor")
    critic_src = _require_model(checkpoint, "critic") if critic else None
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise UserError(f"`{out_dir}` already exists and is not empty; choose a new output folder")
    staging = out_dir.parent / f".{out_dir.name}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    actor_dest = staging / "actor" if critic else staging
    if is_sharded(actor):
        export_sharded(actor, actor_dest, value_model=False)
    if merge and is_adapter_folder(actor):
        _merged_lora(actor, actor_dest, base, value_model=False)
        _copy_files(actor, actor_dest, keep=_is_tokenizer_file)
    else:
        _copy_files(actor, actor_dest, keep=lambda _: True)
        if base and is_adapter_folder(actor):
            _set_base(actor_dest, base)
    _write_generation_config(actor_dest)
    written = [out_dir / "actor" if critic else out_dir]
    if critic_src is not None:
        if is_sharded(critic_src):
            export_sharded(critic_src, staging / "critic", value_model=True)
        elif merge and is_adapter_folder(critic_src):
            _merged_lora(critic_src, staging / "critic", base, value_model=True)
        else:
            _copy_files(critic_src, staging / "critic", keep=lambda _: True)
            if base and is_adapter_folder(critic_src):
                _set_base(staging / "critic", base)
        # The critic reads the same token ids as the actor: ship the tokenizer with it.
        _copy_files(actor, staging / "critic", keep=_is_tokenizer_file)
        written.append(out_dir / "critic")
    fsync_tree(staging)
    if out_dir.exists():
        out_dir.rmdir()  # empty, checked above
    staging.rename(out_dir)
    fsync_dir(out_dir.parent)
    return written
