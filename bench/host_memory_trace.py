"""Where a CPU run's host memory goes: `relm train` in this process with a sampler beside it.

    nice -n 10 .venv/bin/python bench/host_memory_trace.py OUT.json -- data.train_files=... (main_ppo's args)

Every `--every` seconds a thread reads the process's resident set (/proc/self/status: RssAnon, RssFile)
and glibc's own accounting (`mallinfo2`, summed over every arena: bytes allocated, free in the heap,
mapped on their own), tagged with the phase the run is in (the host watchdog's `phase()`), and after
every micro-batch of an update the same figures are logged once more. OUT.json gets the sample at the
largest resident set, the one with the most bytes allocated, the largest of each phase, the
per-micro-batch log and every sample, so a gap between plan and peak can be split into live allocations,
free heap and memory malloc never saw (relm's own line prints the plan). The experiment options change
one setting for the run: `--chunk-values` (a vocabulary chunk's fp32 values), `--keep-factor`
(`host_allocator.KEEP_FACTOR`), `--mmap-threshold` (blocks of that many bytes and up mapped on their own).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from relm.memory.host_allocator import _glibc, heap_info

MIB = 2**20


def reading(phase: str) -> dict[str, Any]:
    """One sample: MiB figures of /proc/self/status and mallinfo2."""
    status = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem", "Threads"):
            parts = value.split()
            status[key] = int(parts[0]) / 1024 if key != "Threads" else int(parts[0])
    info = heap_info()
    if info is None:
        raise SystemExit("bench/host_memory_trace.py needs glibc 2.33 or later (mallinfo2)")
    return {
        "t": time.monotonic(),
        "phase": phase,
        **status,
        "heap_mib": info.arena / MIB,
        "allocated_mib": info.uordblks / MIB,
        "heap_free_mib": info.fordblks / MIB,
        "mapped_mib": info.hblkhd / MIB,
        "top_free_mib": info.keepcost / MIB,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out")
    parser.add_argument("--every", type=float, default=0.02)
    parser.add_argument(
        "--mmap-threshold", type=int, default=None, help="experiment: map blocks this big on their own"
    )
    parser.add_argument(
        "--chunk-values", type=int, default=None, help="experiment: fp32 values a vocab chunk holds"
    )
    parser.add_argument(
        "--keep-factor", type=float, default=None, help="experiment: host_allocator.KEEP_FACTOR"
    )
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args()
    args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args

    import relm.learner.actor as actor
    import relm.trainer.run as run
    from relm.trainer import main_ppo

    samples: list[dict[str, Any]] = []
    micro: list[dict[str, Any]] = []
    phase_of: list[Callable[[], str]] = [lambda: "start"]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(ns.every):
            samples.append(reading(phase_of[0]()))

    class TracedWatchdog(run.HostWatchdog):  # type: ignore[misc]
        def start(self) -> None:
            phase_of[0] = self.phase
            super().start()

    release = actor.release_heap_fragments

    def traced_release() -> bool:
        trimmed = release()
        micro.append({**reading(phase_of[0]()), "trimmed": trimmed})
        return trimmed

    if ns.mmap_threshold is not None:
        import relm.trainer.train_command as train_command

        setting = train_command.set_host_allocator

        def mapped_big(world_size: int) -> bool:
            done = setting(world_size)
            libc = _glibc()
            assert libc is not None, "--mmap-threshold needs glibc"
            libc.mallopt(-4, 1 << 20)  # M_MMAP_MAX
            libc.mallopt(-3, ns.mmap_threshold)  # M_MMAP_THRESHOLD
            return done

        train_command.set_host_allocator = mapped_big
    if ns.chunk_values is not None:
        import relm.learner.forward as forward

        forward.DEFAULT_CHUNK_VALUES = ns.chunk_values
    if ns.keep_factor is not None:
        import relm.memory.host_allocator as host_allocator

        host_allocator.KEEP_FACTOR = ns.keep_factor
    run.HostWatchdog = TracedWatchdog
    actor.release_heap_fragments = traced_release
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    code = main_ppo.main(args)
    stop.set()
    sampler.join()
    peak = max(samples, key=lambda s: s["VmRSS"])
    live = max(samples, key=lambda s: s["allocated_mib"] + s["mapped_mib"])
    by_phase: dict[str, dict[str, Any]] = {}
    for s in samples:
        name = s["phase"].split(" of ")[0]
        if name not in by_phase or s["VmRSS"] > by_phase[name]["VmRSS"]:
            by_phase[name] = s
    Path(ns.out).write_text(
        json.dumps(
            {
                "exit": code,
                "peak": peak,
                "live_peak": live,
                "by_phase": by_phase,
                "micro": micro,
                "samples": samples,
            },
            indent=1,
        )
    )
    print(
        json.dumps(
            {"peak": peak, "live_peak": live, "by_phase": {k: v["VmRSS"] for k, v in by_phase.items()}},
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
