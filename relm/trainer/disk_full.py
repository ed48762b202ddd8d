"""A full disk (or quota) while the run writes: one `error:` line naming the folder, not an internal error.

Each writer says it differently: Python's own files raise `OSError` with errno ENOSPC (or EDQUOT),
safetensors a `SafetensorError` whose text ends in "No space left on device (os error 28)", torch.save
a `RuntimeError` "file write failed" with no errno at all. The cause is the user's to fix (free space,
another folder), so the run ends with exit code 2. A checkpoint cut short by it is a `.global_step_N.tmp`
folder that is never read (trainer/checkpoint.py); it is removed here to give the space back, and every
checkpoint saved before stays as it was.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from relm.trainer.checkpoint import checkpoint_steps, remove_stale_staging

_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_FULL_TEXTS = ("no space left on device", "os error 28", "disk quota exceeded", "os error 122")
_NEARLY_FULL_BYTES = 16 * 2**20
"""Free space under which a write failure with no errno (torch.save's) is taken for a full disk."""


def is_disk_full(exc: BaseException, folder: Path) -> bool:
    """Whether `exc` (or an exception it was raised from) means the disk holding `folder` is full."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in _FULL_ERRNOS:
            return True
        text = str(seen).lower()
        if any(part in text for part in _FULL_TEXTS):
            return True
        if "file write failed" in text and _free_bytes(folder) < _NEARLY_FULL_BYTES:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def disk_full_message(folder: Path, *, clean: bool = True) -> str:
    """The one line, after removing an unfinished checkpoint from `folder` if `clean` (rank 0's job)."""
    if clean and folder.is_dir():
        remove_stale_staging(folder)
    steps = checkpoint_steps(folder) if folder.is_dir() else []
    kept = (
        f"the checkpoints saved before stay (latest: global_step_{steps[-1]})"
        if steps
        else "no checkpoint was saved yet"
    )
    return (
        f"the disk holding `{folder}` (trainer.default_local_dir) is full: writing there failed; free space "
        f"or point trainer.default_local_dir at a disk with room; {kept}"
    )


def _free_bytes(folder: Path) -> int:
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            return shutil.disk_usage(candidate).free
    return 1 << 62
