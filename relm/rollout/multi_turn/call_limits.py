"""Limits that hold for ALL the processes of one Python tool call, not each process alone.

Two mechanisms, the first that works here:

- A cgroup per call (where the trainer may write cgroups, usually as root): `pids.max` caps the number of
  processes and threads, the memory limit caps their resident memory plus the tmpfs scratch they wrote
  (the kernel OOM-kills inside the call when it is reached). cgroup v1 (separate `pids` and `memory`
  hierarchies) or v2 (one hierarchy whose `cgroup.subtree_control` already enables both). The cgroup is
  created under the trainer's own, so the trainer's limits still hold, and removed after the call.
- Otherwise a watchdog in the trainer that sums the resident memory of the call's processes every 50 ms
  and kills the call past the limit (slack: what the processes allocate in one interval, each process
  still capped at the limit by RLIMIT_AS); the process count is then RLIMIT_NPROC set inside the box,
  which the kernel counts per user namespace (its ucounts), so it covers the call's processes only. It
  does not bind a trainer running as root (the kernel exempts root's own uid): that is why cgroups come
  first.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class CallCgroup:
    """One call's cgroup directories (one per v1 hierarchy, or one v2 directory)."""

    pids_dir: Path
    memory_dir: Path
    version: int

    def enter(self) -> None:
        """Move the calling process into the cgroup; runs in the child between fork and exec."""
        for folder in {self.pids_dir, self.memory_dir}:
            (folder / "cgroup.procs").write_text(str(os.getpid()))

    def oom_kills(self) -> int:
        """How many processes the kernel killed for memory in this cgroup."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        with contextlib.suppress(OSError, ValueError):
            for line in (self.memory_dir / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return 0

    def pids(self) -> list[int]:
        """The processes still in the cgroup."""
        found: set[int] = set()
        for folder in {self.pids_dir, self.memory_dir}:
            with contextlib.suppress(OSError):
                found |= {int(p) for p in (folder / "cgroup.procs").read_text().split()}
        return sorted(found)

    def remove(self) -> None:
        """Kill whatever is left in it and delete its directories."""
        deadline = time.monotonic() + 2
        while (left := self.pids()) and time.monotonic() < deadline:
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, 9)
            time.sleep(0.01)
        for folder in {self.pids_dir, self.memory_dir}:
            with contextlib.suppress(OSError):
                folder.rmdir()


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fs type, options) of the cgroup file systems."""
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) >= 4 and fields[2] in ("cgroup", "cgroup2"):
                found.append((fields[1], fields[2], set(fields[3].split(","))))
    return found


def _own_paths() -> dict[str, str]:
    """This process's cgroup path by v1 controller name, and by "" for v2."""
    paths = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                paths[name] = path
    return paths


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def create_cgroup(max_processes: int, memory_bytes: int) -> CallCgroup | None:
    """A new cgroup with these limits under this process's own, or None where none can be written."""
    own, name = _own_paths(), f"relm-box-{uuid.uuid4().hex[:12]}"
    made: list[Path] = []
    try:
        v1 = {
            c: point
            for point, kind, opts in _mounts()
            if kind == "cgroup"
            for c in ("pids", "memory")
            if c in opts
        }
        if "pids" in v1 and "memory" in v1 and "pids" in own and "memory" in own:
            pids_dir = Path(v1["pids"] + own["pids"]) / name
            memory_dir = Path(v1["memory"] + own["memory"]) / name
            for folder in (pids_dir, memory_dir):
                folder.mkdir()
                made.append(folder)
            _write(pids_dir / "pids.max", str(max_processes))
            _write(memory_dir / "memory.limit_in_bytes", str(memory_bytes))
            with contextlib.suppress(OSError):  # without swap accounting the file is absent
                _write(memory_dir / "memory.memsw.limit_in_bytes", str(memory_bytes))
            return CallCgroup(pids_dir, memory_dir, version=1)
        v2 = [point for point, kind, _ in _mounts() if kind == "cgroup2"]
        if v2 and "" in own:
            parent = Path(v2[0] + own[""])
            enabled = (parent / "cgroup.subtree_control").read_text().split()
            if "pids" in enabled and "memory" in enabled:
                folder = parent / name
                folder.mkdir()
                made.append(folder)
                _write(folder / "pids.max", str(max_processes))
                _write(folder / "memory.max", str(memory_bytes))
                with contextlib.suppress(OSError):  # absent without swap accounting
                    _write(folder / "memory.swap.max", "0")
                return CallCgroup(folder, folder, version=2)
    except OSError:
        for folder in made:
            with contextlib.suppress(OSError):
                folder.rmdir()
    return None


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it (a process orphaned inside the box's PID namespace is re-parented
    to the box's init, so it stays below the box's bwrap)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{current}/task"):
                with contextlib.suppress(OSError):
                    todo += [
                        int(c) for c in Path(f"/proc/{current}/task/{task}/children").read_text().split()
                    ]
    return found


def resident_bytes(pids: list[int]) -> int:
    """The summed resident memory of `pids` (those that are gone count 0)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE
    return total
