"""`relm compat` on CPU says how much host memory a large model's check takes, before taking it."""

from __future__ import annotations

from pathlib import Path

from relm.compat.host_memory import BYTES_PER_PARAM, cpu_memory_note
from relm.memory.host import available_host_bytes


def test_estimate_matches_the_measured_climb_of_a_half_billion_model():
    # Qwen2.5-0.5B (0.49B parameters) climbed to 16.5 GB on CPU; the estimate, before activations:
    line, warn = cpu_memory_note("zoo:Qwen/Qwen2.5-0.5B", 494_000_000, available=64 * 10**9)
    assert 15 < 494_000_000 * BYTES_PER_PARAM / 1e9 < 19
    assert line.startswith("zoo:Qwen/Qwen2.5-0.5B on CPU: about 17.8 GB of host memory") and not warn


def test_more_than_free_is_a_warning_and_tiny_models_say_nothing():
    line, warn = cpu_memory_note("m", 494_000_000, available=8 * 10**9)
    assert warn and "more than the 8.0 GB free" in line
    assert cpu_memory_note("zoo:tiny/qwen2", 200_000, available=8 * 10**9) is None


def test_available_memory_takes_the_tighter_of_meminfo_and_the_cgroup(tmp_path: Path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 100000000 kB\nMemAvailable: 20000000 kB\n")
    cgroup = tmp_path / "cg"
    cgroup.mkdir()
    (cgroup / "memory.max").write_text("12000000000\n")
    (cgroup / "memory.current").write_text("2000000000\n")
    assert available_host_bytes(meminfo, cgroup) == 10_000_000_000
    (cgroup / "memory.max").write_text("max\n")
    assert available_host_bytes(meminfo, cgroup) == 20_000_000 * 1024
    assert available_host_bytes(tmp_path / "none", tmp_path / "none") is None
