"""A seccomp filter that keeps a reward worker, and everything it starts, from signalling the trainer.

`process_tree.guard_signals` refuses `os.kill` aimed at the trainer and names the call, but a reward
can signal without it: `subprocess.run(["kill", ...])`, ctypes' `libc.kill`, `kill -9 -1` in a shell.
The worker runs as the trainer's user, so only the kernel can refuse those. Before any user code runs,
each worker installs this classic-BPF seccomp program (with `PR_SET_NO_NEW_PRIVS`, which seccomp needs
without CAP_SYS_ADMIN); the kernel keeps it on every thread, child and `exec` after. It makes these
calls fail with EPERM (nothing is sent, the caller sees the error):

- `kill`, `tgkill`, `rt_sigqueueinfo`, `rt_tgsigqueueinfo` and `pidfd_open` whose first argument is
  the trainer's pid, the trainer's parent's (the torchrun agent or the user's shell), `-1` (every
  process) or minus the trainer's process group; `kill(pid, 0)` (does it exist?) stays allowed;
- `tkill` and `pidfd_send_signal` always: `tkill` is obsolete (libc uses `tgkill`), and a pidfd's
  target cannot be seen from its file descriptor (one can come from opening `/proc/<pid>`);
- any system call of another architecture than the interpreter's (x86_64's 32-bit and x32 entry
  points, where the numbers differ): a 32-bit program started by a reward does not run.

No library does this without a compiler or a system package (pyseccomp needs libseccomp.so.2 installed),
and the program is 30-odd instructions, so it is written out here. On an architecture other than
x86_64 and aarch64 there is no filter (`supported` says so; the pool warns once).
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
from dataclasses import dataclass

from relm.processes import read_process


@dataclass(frozen=True)
class _Arch:
    audit: int
    """AUDIT_ARCH_* the kernel puts in seccomp_data.arch."""
    seccomp: int
    kill: int
    tkill: int
    tgkill: int
    rt_sigqueueinfo: int
    rt_tgsigqueueinfo: int
    pidfd_send_signal: int = 424
    pidfd_open: int = 434
    foreign_from: int | None = None
    """Numbers from here on are another ABI under the same arch (x86_64's x32 bit)."""


_ARCHES = {
    "x86_64": _Arch(0xC000003E, 317, 62, 200, 234, 129, 297, foreign_from=0x40000000),
    "aarch64": _Arch(0xC00000B7, 277, 129, 130, 131, 138, 240),
}

_PR_SET_NO_NEW_PRIVS = 38
_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_FILTER_FLAG_TSYNC = 1
_ALLOW = 0x7FFF0000
_DENY = 0x00050000 | 1  # SECCOMP_RET_ERRNO | EPERM
# BPF opcodes: BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_JMP|BPF_JGE|BPF_K, BPF_RET|BPF_K.
_LD, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06
# seccomp_data: nr at 0, arch at 4, args[i] at 16 + 8 i (the low 32 bits first: little-endian only,
# which both arches are; pid_t and int arguments are 32 bits, and the kernel ignores the rest).
_NR, _ARCH, _ARG0, _ARG1 = 0, 4, 16, 24


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_ushort),
        ("jt", ctypes.c_ubyte),
        ("jf", ctypes.c_ubyte),
        ("k", ctypes.c_uint),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def supported() -> bool:
    """Whether this machine gets the filter (Linux on x86_64 or aarch64)."""
    return sys.platform.startswith("linux") and platform.machine() in _ARCHES


def program(arch: _Arch, targets: list[int]) -> list[tuple[int, int, int, int]]:
    """The BPF program as (code, jt, jf, k), jumps resolved; `targets` are pids as the kernel sees them."""
    words = sorted({t & 0xFFFFFFFF for t in targets})
    code: list[tuple[int, int | str, int | str, int]] = [
        (_LD, 0, 0, _ARCH),
        (_JEQ, 1, 0, arch.audit),
        (_RET, 0, 0, _DENY),
        (_LD, 0, 0, _NR),
    ]
    if arch.foreign_from is not None:
        code.append((_JGE, "deny", 0, arch.foreign_from))
    code += [(_JEQ, "deny", 0, nr) for nr in (arch.tkill, arch.pidfd_send_signal)]
    code.append((_JEQ, "kill", 0, arch.kill))
    by_pid = (arch.tgkill, arch.rt_sigqueueinfo, arch.rt_tgsigqueueinfo, arch.pidfd_open)
    code += [(_JEQ, "by_pid", 0, nr) for nr in by_pid]
    code.append((_RET, 0, 0, _ALLOW))
    labels = {"kill": len(code)}
    code.append((_LD, 0, 0, _ARG0))
    code += [(_JEQ, "kill_target", 0, w) for w in words]
    code.append((_RET, 0, 0, _ALLOW))
    labels["kill_target"] = len(code)
    code += [(_LD, 0, 0, _ARG1), (_JEQ, "allow", "deny", 0)]  # signal 0 only asks whether it exists
    labels["by_pid"] = len(code)
    code.append((_LD, 0, 0, _ARG0))
    code += [(_JEQ, "deny", 0, w) for w in words]
    labels["allow"] = len(code)
    code.append((_RET, 0, 0, _ALLOW))
    labels["deny"] = len(code)
    code.append((_RET, 0, 0, _DENY))

    def offset(at: int, jump: int | str) -> int:
        return jump if isinstance(jump, int) else labels[jump] - at - 1

    return [(op, offset(i, jt), offset(i, jf), k) for i, (op, jt, jf, k) in enumerate(code)]


def install(trainer_pid: int) -> bool:
    """Install the filter on this process (every thread) for good; False where it is not supported
    or the kernel refused it (the worker then has only `guard_signals`)."""
    if not supported():
        return False
    arch = _ARCHES[platform.machine()]
    row = read_process(trainer_pid)
    parent = row.ppid if row is not None else 0
    targets = [trainer_pid, -1, -os.getpgid(trainer_pid)] + ([parent] if parent > 1 else [])
    code = program(arch, targets)
    filters = (_SockFilter * len(code))(*(_SockFilter(*instruction) for instruction in code))
    fprog = _SockFprog(len(code), filters)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return False
    result = libc.syscall(
        ctypes.c_long(arch.seccomp),
        ctypes.c_uint(_SECCOMP_SET_MODE_FILTER),
        ctypes.c_uint(_SECCOMP_FILTER_FLAG_TSYNC),
        ctypes.byref(fprog),
    )
    return bool(result == 0)
