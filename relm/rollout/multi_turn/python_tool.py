"""A Python interpreter tool: the model's code runs in a box (bubblewrap, relm/rollout/multi_turn/sandbox.py)
with time, memory, process, disk and output limits for the whole call, so a bad or hostile snippet is a tool
error the model reads, never a stuck, leaking or killed run (docs/security.md, "The python tool's box").

Where no box can be made (bwrap missing, user namespaces refused) the tool refuses to start, unless its
config says `allow_weak_sandbox: true`: then the code runs in a plain subprocess that can read and write
whatever the trainer can, and every step that used the tool logs a warning.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import resource
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from relm.errors import UserError
from relm.rollout.multi_turn.call_limits import CallCgroup, create_cgroup, descendants, resident_bytes
from relm.rollout.multi_turn.sandbox import (
    BoxSpec,
    box_problem,
    bwrap_command,
    interpreter,
    site_package_dirs,
)
from relm.rollout.multi_turn.tools import ToolContext, ToolResult, schema_name

logger = logging.getLogger("relm")

_BOX_RUNNER = r"""
import resource, sys
_n = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_NPROC, (_n, _n))
sys.path.extend(sys.argv[2:])
sys.argv[:] = ["<tool>"]
del _n
exec(compile(sys.stdin.read(), "<tool>", "exec"), {"__name__": "__main__"})
"""
"""Inside the box: the process cap (counted per user namespace, so only the call's processes count), the
read-only site-packages on sys.path (no .pth file runs), then the code from stdin."""

_WEAK_RUNNER = r"""
import socket, sys
class _NoSocket(socket.socket):
    def __init__(self, *args, **kwargs):
        raise OSError("network access is disabled in this sandbox")
def _no_network(*args, **kwargs):
    raise OSError("network access is disabled in this sandbox")
socket.socket = _NoSocket
socket.create_connection = _no_network
socket.getaddrinfo = _no_network
exec(compile(sys.stdin.read(), "<tool>", "exec"), {"__name__": "__main__"})
"""
"""Without a box: Python's own socket functions refuse (a subclass, so `import ssl` still works); a
ctypes call or `_socket` gets around it."""

_WATCH_INTERVAL_S = 0.05


def _limit_resources(memory_bytes: int, cpu_seconds: int, file_bytes: int, cgroup: CallCgroup | None) -> None:
    """Runs in the child between fork and exec; every process of the call inherits these."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    if cgroup is not None:
        cgroup.enter()


class PythonTool:
    """Runs the `code` argument with a fresh interpreter in a box; what it prints is the result.

    `config` (verl's per-tool `config:` block): `timeout_s` (wall clock of the whole call, default 10),
    `memory_mb` (all the call's processes together, default 1024), `max_processes` (default 64),
    `disk_mb` (the call's scratch /tmp, default 256), `max_output_chars` (default 4096), `site_packages`
    (the venv's packages visible read-only, default true), `use_cgroups` (default true: a cgroup per
    call where one can be written, else a watchdog), `allow_weak_sandbox` (default false: refuse to
    start where no box can be made).
    """

    DEFAULT_SCHEMA: dict[str, Any] = {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run Python code and return what it prints (stdout and stderr).",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string", "description": "Python source; print the answer"}},
                "required": ["code"],
            },
        },
    }

    def __init__(
        self, config: dict[str, Any] | None = None, tool_schema: dict[str, Any] | None = None
    ) -> None:
        config = dict(config or {})
        self.schema = tool_schema or self.DEFAULT_SCHEMA
        self.name = schema_name(self.schema)
        self.timeout_s = float(config.get("timeout_s", 10.0))
        self.memory_bytes = int(config.get("memory_mb", 1024)) * 2**20
        self.max_processes = int(config.get("max_processes", 64))
        self.disk_bytes = int(config.get("disk_mb", 256)) * 2**20
        self.max_output_chars = int(config.get("max_output_chars", 4096))
        self.use_cgroups = bool(config.get("use_cgroups", True))
        self.spec = BoxSpec(disk_bytes=self.disk_bytes, site_packages=bool(config.get("site_packages", True)))
        self.bwrap = shutil.which("bwrap")
        problem = box_problem(self.bwrap)
        self.boxed = problem is None
        self.weak_calls = 0
        if problem is not None:
            if not config.get("allow_weak_sandbox", False):
                raise UserError(
                    f"python tool: no box for model-written code: {problem}; or, to run it unboxed (it can "
                    "then read, write and signal what the trainer can), set `allow_weak_sandbox: true` in the "
                    "tool's `config:` block"
                )
            logger.warning(
                "python tool: %s; `allow_weak_sandbox: true`: model code runs WITHOUT a box", problem
            )

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        code = arguments.get("code")
        if not isinstance(code, str):
            return ToolResult("error: pass the source as a string argument `code`", error="bad_arguments")
        return await self.run(code)

    def end_step(self) -> None:
        """Called by the rollout once a step: in weak mode, a warning for each step that ran code."""
        if self.weak_calls:
            logger.warning(
                "python tool: %d calls this step ran model code WITHOUT a box (allow_weak_sandbox: true): it "
                "could read and change the trainer's files and environment; install bubblewrap",
                self.weak_calls,
            )
        self.weak_calls = 0

    def _command(self) -> list[str]:
        if not self.boxed:
            self.weak_calls += 1
            return [sys.executable, "-I", "-c", _WEAK_RUNNER]
        assert self.bwrap is not None
        visible = site_package_dirs() if self.spec.site_packages else []
        argv = [interpreter(), "-I", "-c", _BOX_RUNNER, str(self.max_processes), *visible]
        return bwrap_command(self.bwrap, self.spec, argv)

    async def run(self, code: str) -> ToolResult:
        """Run `code`; every failure (timeout, memory, crash, too much output) is a result, not a raise."""
        started = time.monotonic()
        cgroup = (
            create_cgroup(self.max_processes, self.memory_bytes) if self.boxed and self.use_cgroups else None
        )
        try:
            return await self._run(code, started, cgroup)
        finally:
            if cgroup is not None:
                cgroup.remove()

    async def _run(self, code: str, started: float, cgroup: CallCgroup | None) -> ToolResult:
        limits = (self.memory_bytes, max(1, int(self.timeout_s) + 1), self.disk_bytes, cgroup)
        # The output pipe is ours, not asyncio's: asyncio's `Process.wait()` also waits for its pipes to
        # close, which a paused reader (output limit) or a detached holder of the pipe would hold off.
        read_fd, write_fd = os.pipe()
        try:
            process = await asyncio.create_subprocess_exec(
                *self._command(),
                stdin=asyncio.subprocess.PIPE,
                stdout=write_fd,
                stderr=write_fd,
                start_new_session=True,
                preexec_fn=functools.partial(_limit_resources, *limits),
                env={"PATH": os.environ.get("PATH", ""), "PYTHONIOENCODING": "utf-8"},
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        stream = asyncio.StreamReader()
        pipe, _ = await asyncio.get_running_loop().connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(stream), os.fdopen(read_fd, "rb", buffering=0)
        )
        try:
            return await self._watch_call(process, stream, code, started, cgroup)
        finally:
            if process.returncode is None:  # cancelled midway: the box goes all the same
                _kill(process.pid, self.boxed)
            pipe.close()

    async def _watch_call(
        self,
        process: asyncio.subprocess.Process,
        stream: asyncio.StreamReader,
        code: str,
        started: float,
        cgroup: CallCgroup | None,
    ) -> ToolResult:
        assert process.stdin is not None
        process.stdin.write(code.encode())  # sent as the child reads; close() flushes, never blocks
        process.stdin.close()
        output = bytearray()
        reader = asyncio.ensure_future(self._read(process, stream, output))
        waiting: set[asyncio.Future[Any]] = {reader}
        watchdog = None
        if self.boxed and cgroup is None:  # no cgroup: the trainer sums the call's memory
            watchdog = asyncio.ensure_future(self._watch(process.pid))
            waiting.add(watchdog)
        remaining = self.timeout_s - (time.monotonic() - started)
        done, _ = await asyncio.wait(
            waiting, timeout=max(0.0, remaining), return_when=asyncio.FIRST_COMPLETED
        )
        cause = reader.result() if reader in done else "memory" if done else "timeout"
        for task in waiting - done:
            task.cancel()
        if process.returncode is None:
            _kill(process.pid, self.boxed)
            await process.wait()
        elapsed = time.monotonic() - started
        text = output.decode(errors="replace")
        metrics = {"time_s": elapsed}
        returncode = process.returncode
        assert returncode is not None, "the process was waited for"
        if cause is None and (
            cgroup is not None and cgroup.oom_kills() or "MemoryError" in text and returncode
        ):
            cause = "memory"
        if cause == "timeout":
            return _error(f"timed out after {self.timeout_s:g} s", text, "timeout", metrics)
        if cause == "output_limit":
            return _error(
                f"output exceeded {self.max_output_chars} characters",
                text[: self.max_output_chars],
                cause,
                metrics,
            )
        if cause == "memory":
            return _error(
                f"memory limit of {self.memory_bytes // 2**20} MiB exceeded", text, "memory", metrics
            )
        if self.boxed and returncode > 128:  # bwrap passes a signal on as 128 + its number
            returncode = -(returncode - 128)
        if returncode < 0:
            return _error(f"killed by signal {-returncode}", text, "crash", metrics)
        if returncode != 0:
            return _error(f"exit code {returncode}", text, "exception", metrics)
        return ToolResult(text[: self.max_output_chars], metrics=metrics)

    async def _read(
        self, process: asyncio.subprocess.Process, stream: asyncio.StreamReader, output: bytearray
    ) -> str | None:
        """Read until the call ends (every holder of its stdout gone); "output_limit" past the limit."""
        limit = self.max_output_chars * 4  # bytes; utf-8 characters take up to four
        while chunk := await stream.read(65536):
            output += chunk
            if len(output) > limit:
                return "output_limit"
        await process.wait()
        return None

    async def _watch(self, pid: int) -> None:
        """Return once the call's processes together hold more than the memory limit."""
        while resident_bytes(descendants(pid)) <= self.memory_bytes:
            await asyncio.sleep(_WATCH_INTERVAL_S)


def _kill(pid: int, boxed: bool) -> None:
    """Kill the call: the box's init first (the kernel then kills every process in its PID namespace, and
    bwrap exits once it has reaped it), then the session bwrap leads."""
    if boxed:
        with contextlib.suppress(OSError, ValueError):
            for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
                os.kill(int(child), 9)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, 9)


def _error(cause: str, output: str, kind: str, metrics: dict[str, float]) -> ToolResult:
    tail = output[-2000:].strip()
    return ToolResult(f"error: {cause}" + (f"\n{tail}" if tail else ""), error=kind, metrics=metrics)
