"""fsync helpers: make a written file tree survive a crash before it is renamed into place.

A rename is atomic, but on most file systems it can reach the disk before the data of the files it
moves. Without the fsyncs a power cut right after a checkpoint's rename could leave a folder with the
right name and empty files; with them, a name always stands for complete content.
"""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Flush a folder's entries (the names created, renamed or deleted in it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """Flush every file under `root`, then every folder, deepest first."""
    for folder, _, files in os.walk(root, topdown=False):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(folder))


def write_atomic_text(path: Path, text: str) -> None:
    """Replace `path` with `text` atomically: after a kill it holds the old or the new text, never half."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
