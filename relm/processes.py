"""The machine's processes as /proc lists them: pid, parent and session.

Both the launcher (torchrun's workers, to forward signals) and the reward pool (a worker's whole tree, to
end it) walk this table; one reader keeps the parsing of `/proc/PID/stat` in one place.
"""

from __future__ import annotations

import os
from typing import NamedTuple


class ProcessEntry(NamedTuple):
    """One row of /proc."""

    pid: int
    ppid: int
    session: int


def list_processes() -> list[ProcessEntry]:
    """Every process in /proc with its parent and session (empty where there is no /proc)."""
    found = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                # pid (comm) state ppid pgrp session ...: comm may hold spaces and parentheses.
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone between the listing and the read
        found.append(ProcessEntry(int(entry), int(fields[1]), int(fields[3])))
    return found
