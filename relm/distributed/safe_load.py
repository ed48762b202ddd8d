"""Read checkpoint files without running code that a file might carry.

A `.pt` file is a pickle, and a pickle can name any function to call while it is read: a crafted
`trainer_state.pt` handed to `torch.load(..., weights_only=False)` runs whatever it names. relm saves
only tensors, dicts, lists, numbers and strings in its `.pt` files, so it reads them with
`weights_only=True` (torch's allowlisting unpickler) and refuses, with one line naming the file,
anything that asks for more.

A sharded (DCP) save has two more pickles that torch 2.13 reads unguarded: `dcp/.metadata` (a plain
`pickle.load` in `FileSystemReader.read_metadata`) and the non-tensor values inside the shard files
(`torch.load(..., weights_only=False)` in `DefaultLoadPlanner.load_bytes`: the optimizer's param
groups). `SafeReader` and `SafePlanner` replace those two reads: the metadata is unpickled with only
the classes DCP's metadata is made of, the values with `weights_only=True`.
"""

from __future__ import annotations

import io
import pickle
import re
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from relm.errors import UserError

METADATA_MODULE = "torch.distributed.checkpoint.metadata"
"""Every class of DCP's metadata record lives here (Metadata, TensorStorageMetadata, ...)."""

METADATA_GLOBALS = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
}
"""Other names a `.metadata` pickle uses (measured on torch 2.13 saves); each only builds a plain value."""


def refused(path: Path, why: str) -> UserError:
    """The one line for a checkpoint file relm will not read because reading it could run code."""
    return UserError(
        f"`{path}`: refused to load: it asks to run code when read ({why}); relm's own checkpoints never do, "
        "so this file was not written by relm or was altered: resume from a checkpoint relm wrote"
    )


def load_pt(path: Path) -> Any:
    """`torch.load` of a relm `.pt` file (tensors, dicts, lists, numbers, strings) that runs no code.

    Raises:
        UserError: the file names anything else (refused) or cannot be read at all.
    """
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise refused(path, _first_line(exc)) from exc
    except Exception as exc:  # noqa: BLE001 - a damaged file is the user's checkpoint problem
        raise UserError(f"`{path}` cannot be read ({type(exc).__name__}); resume from another step") from exc


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP metadata, refusing any global outside the classes it is made of."""

    def find_class(self, module: str, name: str) -> Any:
        if module == METADATA_MODULE and not name.startswith("__"):
            found = getattr(torch.distributed.checkpoint.metadata, name, None)
            if isinstance(found, type):
                return found
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype | torch.layout):
            return getattr(torch, name)
        if (module, name) in METADATA_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"`{module}.{name}`")


def read_dcp_metadata(path: Path) -> Metadata:
    """A DCP `.metadata` file, unpickled with only DCP's own metadata classes allowed.

    Raises:
        UserError: the pickle names anything else, or is not DCP metadata.
    """
    try:
        with path.open("rb") as file:
            metadata = _MetadataUnpickler(file).load()
    except pickle.UnpicklingError as exc:
        raise refused(path, _first_line(exc)) from exc
    except Exception as exc:  # noqa: BLE001 - a damaged file is the user's checkpoint problem
        raise UserError(f"`{path}` cannot be read ({type(exc).__name__}); use another checkpoint") from exc
    if not isinstance(metadata, Metadata):
        raise UserError(f"`{path}` is not a DCP metadata file; use another checkpoint")
    return metadata


class SafeReader(FileSystemReader):
    """torch's file-system reader with the metadata read by `read_dcp_metadata` instead of `pickle.load`."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        metadata = read_dcp_metadata(Path(self._get_metadata_path(rank)))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        assert metadata.storage_meta is not None  # for mypy: set just above
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafePlanner(DefaultLoadPlanner):
    """torch's default load planner with non-tensor values read by `weights_only=True`."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder
        """The DCP folder read, named when a value is refused."""
        self.refusal: UserError | None = None
        """The refusal raised inside `dcp.load`, which wraps it: the caller raises this one instead."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            loaded = torch.load(value, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:
            self.refusal = refused(self.folder, f"a value in its shard files: {_first_line(exc)}")
            raise self.refusal from exc
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


def _first_line(exc: BaseException) -> str:
    """The part of an unpickling error that names what the file asked for (torch's message is a page)."""
    text = str(exc)
    found = re.search(r"GLOBAL (\S+)", text) or re.search(r"^`([^`]+)`$", text)
    if found:
        return f"it names {found.group(1)}"
    lines = text.strip().splitlines()
    return " ".join(lines[0].split())[:160] if lines else type(exc).__name__
