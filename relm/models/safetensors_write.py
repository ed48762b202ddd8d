"""Write safetensors files one tensor at a time: the header first (names, dtypes, shapes are known up
front), then each tensor's bytes as it is made, so the writer never holds more than one tensor.

`safetensors.torch.save_file` (and `save_pretrained`) take a dict of every tensor of the file, which for an
export of a sharded checkpoint means the whole fp32 model in one process. Files are cut at
`max_file_bytes` and named as `save_pretrained` names them (`model.safetensors`, or
`model-00001-of-00003.safetensors` ... with `model.safetensors.index.json`), so
`from_pretrained` reads the folder as its own.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME

_NAMES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
MAX_FILE_BYTES = 5 * 2**30
"""Where a file is cut (save_pretrained's historical default shard size)."""


@dataclass(frozen=True)
class TensorEntry:
    """One tensor to write: its name in the file, dtype and shape."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def num_bytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def write_streamed(
    folder: Path,
    entries: Sequence[TensorEntry],
    make: Callable[[TensorEntry], torch.Tensor],
    max_file_bytes: int = MAX_FILE_BYTES,
) -> list[Path]:
    """Write `entries` into safetensors files in `folder`, calling `make` for each tensor in turn.

    Returns the files written. `make` must return a tensor of the entry's shape (any dtype: it is cast).
    """
    groups: list[list[TensorEntry]] = [[]]
    size = 0
    for entry in entries:
        if groups[-1] and size + entry.num_bytes > max_file_bytes:
            groups.append([])
            size = 0
        groups[-1].append(entry)
        size += entry.num_bytes
    if len(groups) == 1:
        names = [SAFE_WEIGHTS_NAME]
    else:
        names = [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    folder.mkdir(parents=True, exist_ok=True)
    for name, group in zip(names, groups, strict=True):
        _write_file(folder / name, group, make)
    if len(groups) > 1:
        index = {
            "metadata": {"total_size": sum(e.num_bytes for e in entries)},
            "weight_map": {e.name: name for name, group in zip(names, groups, strict=True) for e in group},
        }
        (folder / SAFE_WEIGHTS_INDEX_NAME).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return [folder / name for name in names]


def _write_file(
    path: Path, entries: Sequence[TensorEntry], make: Callable[[TensorEntry], torch.Tensor]
) -> None:
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for entry in entries:
        header[entry.name] = {
            "dtype": _NAMES[entry.dtype],
            "shape": list(entry.shape),
            "data_offsets": [offset, offset + entry.num_bytes],
        }
        offset += entry.num_bytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for entry in entries:
            tensor = make(entry)
            if tuple(tensor.shape) != entry.shape:
                raise ValueError(f"`{entry.name}` has shape {tuple(tensor.shape)}, expected {entry.shape}")
            tensor = tensor.detach().to("cpu", entry.dtype).contiguous()
            f.write(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
            del tensor
