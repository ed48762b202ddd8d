"""Read a range of rows of one tensor out of a model folder's safetensors files, and nothing else.

Why not `safetensors.safe_open`: it maps the whole file into the process, and every page a read touches
stays resident (and counts in the process's RSS) until the file is closed, so a rank that reads its
quarter of every tensor of a 2 GB file ends up holding most of the file mapped beside its shards. Here a
rank reads its own rows with `os.pread` into a buffer the size of one tensor's slice: the page cache
holds the file (shared by every rank, not counted as theirs) and the rank holds only what it keeps.

The format (a little-endian u64 header length, a JSON header of `name -> {dtype, shape, data_offsets}`,
then the raw bytes, row-major) is the safetensors specification's; a folder is either one
`model.safetensors` or several files named by `model.safetensors.index.json`'s `weight_map`.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME

_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


@dataclass(frozen=True)
class StoredTensor:
    """Where one tensor's bytes lie in its file."""

    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    """Byte offset of the tensor's first element in the file."""

    @property
    def row_bytes(self) -> int:
        """Bytes of one row (all dims but the first); a 0-d tensor is one row."""
        return math.prod(self.shape[1:]) * self.dtype.itemsize


class SafetensorsFolder:
    """The tensors of a folder's safetensors files, by name, read a row range at a time."""

    def __init__(self, folder: str | Path, files: list[str] | None = None) -> None:
        """The model weights of `folder` (one file or an index's shards), or the named `files` in it."""
        folder = Path(folder)
        index = folder / SAFE_WEIGHTS_INDEX_NAME
        if files is None and index.is_file():
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        self.tensors: dict[str, StoredTensor] = {}
        for name in files or [SAFE_WEIGHTS_NAME]:
            self.tensors.update(_read_header(folder / name))

    @staticmethod
    def present(folder: str | Path) -> bool:
        """Whether the folder keeps its weights as safetensors (one file, or an index of shards)."""
        folder = Path(folder)
        return (folder / SAFE_WEIGHTS_INDEX_NAME).is_file() or (folder / SAFE_WEIGHTS_NAME).is_file()

    def read_rows(self, name: str, begin: int, out: torch.Tensor) -> None:
        """Fill `out` (rows `begin .. begin + len(out)` of `name`, any dtype, any device) from the file.

        The rows are read in the file's dtype into one CPU buffer and cast while copied, so a bf16 file
        fills fp32 shards and the reverse.
        """
        stored = self.tensors[name]
        rows = out.shape[0] if out.dim() else 1
        if rows == 0:
            return
        buffer = torch.empty(rows * stored.row_bytes, dtype=torch.uint8)
        with open(stored.file, "rb", buffering=0) as f:
            view = memoryview(buffer.numpy())  # type: ignore[arg-type]  # an ndarray is a buffer
            offset, done = stored.start + begin * stored.row_bytes, 0
            while done < len(view):  # pread may return fewer bytes than asked (large reads)
                got = os.preadv(f.fileno(), [view[done:]], offset + done)
                if got <= 0:
                    raise OSError(f"{stored.file}: unexpected end of file reading `{name}`")
                done += got
        out.copy_(buffer.view(stored.dtype).view(out.shape))


def _read_header(path: Path) -> dict[str, StoredTensor]:
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    data_start = 8 + length
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(entry["dtype"])
        if dtype is None:
            raise ValueError(f"{path}: tensor `{name}` has dtype {entry['dtype']}, which relm does not read")
        tensors[name] = StoredTensor(
            path, dtype, tuple(entry["shape"]), data_start + entry["data_offsets"][0]
        )
    return tensors
