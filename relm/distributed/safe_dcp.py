"""Read a sharded (DCP) save's pickles without running code that a file might carry.

torch 2.13 reads two pickles of a DCP save unguarded: `dcp/.metadata` (a plain `pickle.load` in
`FileSystemReader.read_metadata`) and the non-tensor values inside the shard files
(`torch.load(..., weights_only=False)` in `DefaultLoadPlanner.load_bytes`: the optimizer's param groups).
`SafeReader` and `SafePlanner` replace those two reads: the metadata is unpickled with only the classes
DCP's metadata is made of, the values with `weights_only=True`. Imported only where a DCP save is read
(torch.distributed.checkpoint takes a second or more to import).
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint.metadata as dcp_metadata
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from relm.distributed.safe_load import first_line, refused
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


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP metadata, refusing any global outside the classes it is made of."""

    def find_class(self, module: str, name: str) -> Any:
        if module == METADATA_MODULE and not name.startswith("__"):
            found = getattr(dcp_metadata, name, None)
            if isinstance(found, type) and found.__module__ == METADATA_MODULE:  # not a name it imports
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
        raise refused(path, first_line(exc)) from exc
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
            self.refusal = refused(self.folder, f"a value in its shard files: {first_line(exc)}")
            raise self.refusal from exc
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded
