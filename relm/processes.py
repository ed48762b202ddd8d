"""The machine's processes as /proc lists them: pid, state, parent and session.

The launcher (torchrun's workers, to forward signals), the reward pool (a worker's whole tree, to end it)
and the reward workers' signal filter (the trainer's parent) read this table; one reader keeps the
parsing of `/proc/PID/stat` in one place.
"""

from __future__ import annotations

import os
from typing import NamedTuple


class ProcessEntry(NamedTuple):
    """One row of /proc."""

    pid: int
    state: str
    """`R`, `S`, ... ; `Z` for a zombie (ended, not yet collected by its parent)."""
    ppid: int
    session: int


def read_process(pid: int) -> ProcessEntry | None:
    """`pid`'s row of /proc, or None where it is gone (or there is no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            # pid (comm) state ppid pgrp session ...: comm may hold spaces and parentheses.
            fields = f.read().rsplit(")", 1)[1].split()
        return ProcessEntry(pid, fields[0], int(fields[1]), int(fields[3]))
    except (OSError, ValueError, IndexError):
        return None


def list_processes() -> list[ProcessEntry]:
    """Every process in /proc (empty where there is no /proc); one gone between the listing and the read
    is left out."""
    entries = os.listdir("/proc") if os.path.isdir("/proc") else []
    return [row for entry in entries if entry.isdigit() and (row := read_process(int(entry))) is not None]
