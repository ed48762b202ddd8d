"""Sharded checkpoints with torch.distributed.checkpoint (DCP), readable at any world size.

A data-parallel run saves each model as

    actor/                 config.json, generation_config.json, tokenizer files (rank 0)
      scheduler.pt         the lr schedule, and whether the optimizer had state to save (rank 0)
      dcp/                 model and optimizer state, one file per rank plus DCP's .metadata

Every file is read without running code it might carry (`relm.distributed.safe_load`, `safe_dcp`).

DCP records which slice of which tensor each file holds, so a load reshards to whatever the loading
run holds: 4 ranks read what 2 wrote, and one process without a process group reads it into plain
tensors. Keys are the models' own parameter names (the optimizer's too, through
`get_state_dict`), identical with and without FSDP, which is what makes the formats interchangeable.

A single-process run keeps writing the plain HF folder with `optimizer.pt` (`trainer/checkpoint.py`);
a data-parallel run resumes from that too (`load_full_into_sharded`), and `relm export` turns a
sharded checkpoint into a plain HF folder (`export_sharded`).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from relm.distributed.context import DistContext
from relm.distributed.safe_load import load_pt
from relm.errors import UserError
from relm.models.value_model import VALUE_HEAD_FILE, ValueModel

DCP_FOLDER = "dcp"
SCHEDULER_FILE = "scheduler.pt"


def is_sharded(folder: Path) -> bool:
    """Whether a model folder of a checkpoint holds a DCP save."""
    return (folder / DCP_FOLDER / ".metadata").is_file()


def save_sharded(
    model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, folder: Path, dist: DistContext
) -> None:
    """Every rank writes its shards of model and optimizer; rank 0 the config and the lr schedule.

    `folder` must exist on every rank (a shared file system across nodes); the caller makes it atomic.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    # An optimizer that never stepped (the actor during `critic_warmup`) is saved without state:
    # `get_state_dict` would first give it one by a zero-lr step, which advances AdamW's step count.
    stepped = bool(optimizer.state)
    if stepped:
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optim_state}
    else:
        state = {"model": get_model_state_dict(model)}
    dcp.save(state, checkpoint_id=str(folder / DCP_FOLDER))
    if dist.is_main:
        model.config.save_pretrained(folder)  # type: ignore[union-attr,operator]  # nn.Module hides the HF model's API
        generation = getattr(model, "generation_config", None)
        if generation is not None:
            generation.save_pretrained(folder)
        torch.save({"scheduler": scheduler.state_dict(), "optimizer_saved": stepped}, folder / SCHEDULER_FILE)


def load_sharded(
    model: nn.Module, optimizer: torch.optim.Optimizer | None, scheduler: Any, folder: Path, what: str
) -> None:
    """Restore model (and optimizer, scheduler) from `folder/dcp`, whatever world size wrote it.

    Works sharded (every rank calls it) and in one process without a process group.

    Raises:
        UserError: the checkpoint holds another model (names or shapes differ).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException, not an Exception
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_state_dict,
        set_model_state_dict,
        set_state_dict,
    )

    from relm.distributed.safe_dcp import SafePlanner, SafeReader, read_dcp_metadata

    dcp_folder = folder / DCP_FOLDER
    saved = None
    if scheduler is not None:
        saved = load_pt(folder / SCHEDULER_FILE)
        if not saved["optimizer_saved"]:
            optimizer = None  # it never stepped: the fresh optimizer is the saved one
    state: dict[str, Any]  # DCP's state dict: {"model": ..., "optimizer": ...}
    if optimizer is None:
        state = {"model": get_model_state_dict(model)}
    else:
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optim_state}
    # Read (and refuse) the metadata here first: inside `dcp.load` a refusal comes back wrapped.
    read_dcp_metadata(dcp_folder / ".metadata")
    planner = SafePlanner(dcp_folder)
    try:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.filterwarnings("ignore", message=".*single process.*")
            dcp.load(state, storage_reader=SafeReader(dcp_folder), planner=planner)
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - DCP reports a mismatch in many types
        if planner.refusal is not None:
            raise planner.refusal from exc
        raise UserError(
            f"checkpoint `{folder}` does not fit this run's {what} ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:200] if str(exc) else ''}); set trainer.resume_mode=disable or "
            "point model.path at the model it was saved for"
        ) from exc
    if optimizer is None:
        set_model_state_dict(model, state["model"])
    else:
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    if saved is not None:
        scheduler.load_state_dict(saved["scheduler"])


def load_full_into_sharded(model: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Whole tensors (a single-process checkpoint's safetensors) into a sharded model; names unprefixed
    relative to `model`, missing tied weights allowed."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    # torch's dict[str, ValueType] is invariant; a tensor is one of its value types.
    set_model_state_dict(model, tensors, options=StateDictOptions(full_state_dict=True, strict=False))  # type: ignore[arg-type]


def load_full_optimizer_into_sharded(
    model: nn.Module, optimizer: torch.optim.Optimizer, saved: dict[str, Any]
) -> None:
    """A single-process `optimizer.state_dict()` (states keyed by parameter index) into a sharded one.

    The index is the position among `model`'s trainable parameters, the order `build_optimizer` gives
    them, which FSDP keeps: index i is the i-th trainable name, the key DCP-style state dicts use.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    if not saved["state"]:
        return  # it never stepped: the fresh optimizer is the saved one (the schedule sets the lr)
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    by_name: dict[str, Any] = {
        "state": {names[index]: value for index, value in saved["state"].items()},
        "param_groups": [
            {**group, "params": [names[index] for index in group["params"]]}
            for group in saved["param_groups"]
        ],
    }
    set_optimizer_state_dict(model, optimizer, by_name, options=StateDictOptions(full_state_dict=True))


def export_sharded(folder: Path, dest: Path, *, value_model: bool) -> None:
    """Write the model of a sharded checkpoint folder as a plain HF folder at `dest` (one process).

    Streamed tensor by tensor: the model is built from the folder's config.json on the meta device only
    to name its tensors (the names and the tied weights `save_pretrained` would write), then each tensor
    is read from DCP alone and written into the safetensors file (`relm.models.safetensors_write`), so
    the export holds one tensor at a time, never the whole fp32 model. A critic is written as
    `ValueModel.save_pretrained` writes it (backbone folder plus value_head.safetensors).
    """
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from relm.distributed.safe_dcp import read_dcp_metadata
    from relm.models.safetensors_write import TensorEntry, write_streamed

    config = AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        causal_lm = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model: nn.Module = ValueModel(causal_lm) if value_model else causal_lm
    saved: nn.Module = model.backbone if isinstance(model, ValueModel) else model
    prefix = "model." + ("backbone." if value_model else "")  # DCP's key: the state dict's "model" entry
    stored = read_dcp_metadata(folder / DCP_FOLDER / ".metadata").state_dict_metadata
    entries, seen = [], set()
    for name, tensor in saved.state_dict(keep_vars=True).items():
        if id(tensor) in seen:
            continue  # a tied weight is written once, under its first name, as save_pretrained does
        seen.add(id(tensor))
        meta = stored.get(prefix + name)
        if meta is None or not hasattr(meta, "size"):
            raise UserError(f"checkpoint `{folder}` holds no `{name}`: it was saved for another model")
        entries.append(TensorEntry(name, meta.properties.dtype, tuple(meta.size)))  # type: ignore[union-attr]  # a tensor's metadata
    write_streamed(dest, entries, lambda entry: read_one_tensor(folder, prefix + entry.name, entry))
    config.architectures = [type(saved).__name__]
    config.save_pretrained(dest)
    generation = getattr(saved, "generation_config", None)
    if generation is not None and not value_model:
        generation.save_pretrained(dest)
    if value_model:
        head = {
            name: read_one_tensor(
                folder, f"model.value_head.{name}", TensorEntry(name, t.dtype, tuple(t.shape))
            )
            for name, t in model.value_head.state_dict().items()  # type: ignore[union-attr]  # a ValueModel's
        }
        save_file(head, str(dest / VALUE_HEAD_FILE))


def read_one_tensor(folder: Path, key: str, entry: Any) -> torch.Tensor:
    """One whole tensor (`key`, DCP's flattened name) of a sharded checkpoint, read alone."""
    import torch.distributed.checkpoint as dcp

    from relm.distributed.safe_dcp import SafePlanner, SafeReader

    dcp_folder = folder / DCP_FOLDER
    tensor = torch.empty(entry.shape, dtype=entry.dtype)
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message=".*single process.*")
        dcp.load({key: tensor}, storage_reader=SafeReader(dcp_folder), planner=SafePlanner(dcp_folder))
    return tensor
