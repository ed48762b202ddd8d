"""relm's cache folder and how a folder is put into it: whole or not at all.

The zoo's model folders and the shipped tokenizers' unpacked folders are both built in a temporary
sibling and renamed into place, so concurrent processes (test workers, ranks of one run) either see
nothing or a complete folder, never one another's half-written files.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

__all__ = ["COMPLETE_MARKER", "default_cache_dir", "publish_folder"]

COMPLETE_MARKER = ".relm-zoo-complete"
"""Written last inside the temp folder, so a folder that has it was written in full."""


def default_cache_dir() -> Path:
    """`$RELM_CACHE`, else ~/.cache/relm."""
    return Path(os.environ.get("RELM_CACHE") or Path.home() / ".cache" / "relm")


def publish_folder(staging: Path, final: Path) -> None:
    """Rename the staged folder into place; another process may have got there first."""
    try:
        os.rename(staging, final)
        return
    except OSError:
        if (final / COMPLETE_MARKER).is_file():
            return  # another process won the race with an identical folder
    # A folder without the marker was left by something other than this function: replace it.
    shutil.rmtree(final, ignore_errors=True)
    os.rename(staging, final)
