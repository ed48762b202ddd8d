"""A Python interpreter tool: the model's code runs in a separate process with time, memory and output
limits and no network, so a bad snippet is a tool error the model reads, never a stuck or killed run.

Isolation, in layers: a fresh `python -I` (no site-packages of the user's, no environment paths) in its
own session (the whole process group is killed on timeout); `RLIMIT_AS` caps its memory and
`RLIMIT_CPU` its processor time; the wall-clock timeout catches sleeping or blocked code; stdout and
stderr are read up to the output limit, then the process is killed. The network is cut by running
it under `unshare -rn` (a new, empty network namespace) where the kernel allows unprivileged user
namespaces; elsewhere the child replaces `socket.socket` before running the code, which stops the
standard library but not a determined ctypes call (a warning says which one a run uses).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import resource
import shutil
import subprocess
import sys
import time
from typing import Any

from relm.rollout.multi_turn.tools import ToolContext, ToolResult, schema_name

logger = logging.getLogger("relm")

_RUNNER = r"""
import socket, sys
def _no_network(*args, **kwargs):
    raise OSError("network access is disabled in this sandbox")
socket.socket = _no_network
socket.create_connection = _no_network
socket.getaddrinfo = _no_network
code = sys.stdin.read()
namespace = {"__name__": "__main__"}
exec(compile(code, "<tool>", "exec"), namespace)
"""


@functools.cache
def network_namespace_available() -> bool:
    """Whether `unshare -rn` can start a process without network here (unprivileged user namespaces)."""
    if shutil.which("unshare") is None:
        return False
    try:
        return subprocess.run(["unshare", "-rn", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _limit_resources(memory_bytes: int, cpu_seconds: int) -> None:
    """Runs in the child between fork and exec."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


class PythonTool:
    """Runs the `code` argument with a fresh interpreter; what it prints is the result.

    `config` (verl's per-tool `config:` block): `timeout_s` (wall clock, default 10), `memory_mb`
    (address space, default 1024), `max_output_chars` (default 4096).
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
        self.max_output_chars = int(config.get("max_output_chars", 4096))
        self.isolate_network = network_namespace_available()
        if not self.isolate_network:
            logger.warning(
                "python tool: `unshare -rn` is not available here; the sandbox blocks sockets in Python only"
            )

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        code = arguments.get("code")
        if not isinstance(code, str):
            return ToolResult("error: pass the source as a string argument `code`", error="bad_arguments")
        return await self.run(code)

    async def run(self, code: str) -> ToolResult:
        """Run `code`; every failure (timeout, memory, crash, too much output) is a result, not a raise."""
        command = [sys.executable, "-I", "-c", _RUNNER]
        if self.isolate_network:
            command = ["unshare", "-rn", *command]
        started = time.monotonic()
        process = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=functools.partial(
                _limit_resources, self.memory_bytes, max(1, int(self.timeout_s) + 1)
            ),
            env={"PATH": os.environ.get("PATH", ""), "PYTHONIOENCODING": "utf-8"},
        )
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(code.encode())
        await process.stdin.drain()
        process.stdin.close()
        output, cause = bytearray(), None
        limit = self.max_output_chars * 4  # bytes; utf-8 characters take up to four
        try:
            async with asyncio.timeout(self.timeout_s):
                while chunk := await process.stdout.read(65536):
                    output += chunk
                    if len(output) > limit:
                        cause = "output_limit"
                        break
                if cause is None:
                    await process.wait()
        except TimeoutError:
            cause = "timeout"
        if process.returncode is None:
            _kill_group(process.pid)
            await process.wait()
        elapsed = time.monotonic() - started
        text = output.decode(errors="replace")
        metrics = {"time_s": elapsed}
        if cause == "timeout":
            return _error(f"timed out after {self.timeout_s:g} s", text, "timeout", metrics)
        if cause == "output_limit":
            return _error(
                f"output exceeded {self.max_output_chars} characters",
                text[: self.max_output_chars],
                cause,
                metrics,
            )
        returncode = process.returncode
        assert returncode is not None, "communicate() waited for the process"
        if returncode != 0:
            if "MemoryError" in text:
                return _error(
                    f"memory limit of {self.memory_bytes // 2**20} MiB exceeded", text, "memory", metrics
                )
            if returncode < 0:
                return _error(f"killed by signal {-returncode}", text, "crash", metrics)
            return _error(f"exit code {returncode}", text, "exception", metrics)
        return ToolResult(text[: self.max_output_chars], metrics=metrics)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, 9)


def _error(cause: str, output: str, kind: str, metrics: dict[str, float]) -> ToolResult:
    tail = output[-2000:].strip()
    return ToolResult(f"error: {cause}" + (f"\n{tail}" if tail else ""), error=kind, metrics=metrics)
