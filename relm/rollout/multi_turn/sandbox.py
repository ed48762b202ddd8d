"""The box the Python tool runs model-written code in: a bubblewrap (`bwrap`) command line and the probe
that says whether one can be made here.

Each call gets new user, mount, PID, network, IPC and UTS namespaces. The mount namespace holds only what
the interpreter needs, read-only (/usr and its /bin, /lib, /lib64 links, the interpreter's prefix, and the
venv's site-packages when asked), a fresh /proc of its own PID namespace, a minimal /dev, and one tmpfs of
`disk_bytes` mounted at /tmp that is the working directory; no /etc, no home, nothing of the trainer's
folders. The environment is empty but for a few variables the runner needs. Killing the namespace's first
process (bwrap's init) kills every process of the call, background and detached ones included, and the
tmpfs vanishes with the mount namespace, so a call leaves nothing behind.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import sysconfig
from dataclasses import dataclass

INSTALL_HINT = "install bubblewrap (`apt-get install -y bubblewrap` on Debian/Ubuntu)"

_ENVIRONMENT = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONIOENCODING": "utf-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
}
"""All the environment a call sees (`--clearenv` drops the rest: API keys, tokens, paths)."""


@dataclass(frozen=True)
class BoxSpec:
    """What one call's box holds and may use."""

    disk_bytes: int
    """Size of the tmpfs at /tmp, the call's working directory and only writable place."""
    site_packages: bool
    """Whether the venv's site-packages are visible (read-only) so numpy, sympy, ... import."""


def interpreter() -> str:
    """The real interpreter file (a venv's `bin/python` is a link to it), which the box runs."""
    return os.path.realpath(sys.executable)


def site_package_dirs() -> list[str]:
    """The venv's site-packages folders that exist (purelib and platlib, usually one folder)."""
    paths = sysconfig.get_paths()
    return sorted({p for p in (paths["purelib"], paths["platlib"]) if os.path.isdir(p)})


def _system_binds() -> list[str]:
    """/usr read-only, and /bin, /lib, /lib64, /sbin as links where the host has merged them into /usr."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/lib", "/lib64", "/sbin"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    return args


def _readonly(paths: list[str]) -> list[str]:
    args: list[str] = []
    for path in paths:
        if path != "/usr" and not path.startswith("/usr/"):
            args += ["--ro-bind", path, path]
    return args


def bwrap_command(bwrap: str, spec: BoxSpec, argv: list[str]) -> list[str]:
    """The bwrap command line that runs `argv` in a new box made by `spec`."""
    # The venv whole (read-only), not only its site-packages: a venv under /tmp would otherwise show as
    # writable scratch folders around its bound site-packages.
    prefixes = list(dict.fromkeys([os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)]))
    executable = interpreter()
    if not any(executable.startswith(p + os.sep) for p in prefixes):
        prefixes.append(os.path.dirname(executable))
    visible = prefixes + (site_package_dirs() if spec.site_packages else [])
    environment = [a for key, value in _ENVIRONMENT.items() for a in ("--setenv", key, value)]
    return [
        bwrap,
        "--unshare-all",  # ipc, pid, net, uts, cgroup (and user, made mandatory below)
        "--unshare-user",
        "--disable-userns",  # no nested user namespaces: less kernel surface from inside
        "--die-with-parent",
        "--new-session",  # no TIOCSTI into the trainer's terminal
        "--cap-drop",
        "ALL",
        "--clearenv",
        *environment,
        *_system_binds(),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        str(spec.disk_bytes // 4),
        "--tmpfs",
        "/dev/shm",  # multiprocessing's semaphores
        "--remount-ro",
        "/dev",
        "--size",
        str(spec.disk_bytes),
        "--tmpfs",
        "/tmp",
        # After the scratch /tmp: an interpreter or venv that lives under /tmp stays visible on top of it.
        *_readonly(visible),
        "--chdir",
        "/tmp",
        "--remount-ro",  # the root bwrap builds is a tmpfs without a size: no writing there
        "/",
        *argv,
    ]


@functools.cache
def box_problem(bwrap: str | None) -> str | None:
    """Why no box can be made here (bwrap missing, user namespaces refused), or None when one can.

    Starts one box running the interpreter once (cached per bwrap path), so a refusal shows at start-up.
    """
    if bwrap is None:
        return f"`bwrap` is not on PATH; {INSTALL_HINT}"
    command = bwrap_command(
        bwrap, BoxSpec(disk_bytes=2**20, site_packages=False), [interpreter(), "-I", "-c", ""]
    )
    try:
        done = subprocess.run(command, capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`{bwrap}` did not start a box ({exc}); {INSTALL_HINT} and allow user namespaces"
    if done.returncode != 0:
        said = " ".join(done.stderr.decode(errors="replace").split())[:200]
        return (
            f"`{bwrap}` cannot make a box here ({said or f'exit code {done.returncode}'}); user namespaces "
            "must be allowed (sysctl kernel.unprivileged_userns_clone=1 or user.max_user_namespaces > 0; "
            "in Docker, a seccomp profile that permits them)"
        )
    return None
