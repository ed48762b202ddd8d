"""The Python tool survives what a model may write: each failure is a tool error with its cause, in
bounded time, and the next call works."""

from __future__ import annotations

import asyncio
import time

import pytest

from relm.rollout.multi_turn.python_tool import PythonTool, network_namespace_available
from relm.rollout.multi_turn.tools import ToolContext, run_tool

TOOL = PythonTool({"timeout_s": 3, "memory_mb": 256, "max_output_chars": 200})


def call(code: str):
    return asyncio.run(run_tool(TOOL, {"code": code}, ToolContext(row=0)))


@pytest.mark.parametrize(
    ("code", "kind", "says"),
    [
        ("while True: pass", "timeout", "timed out after 3 s"),
        ("import time; time.sleep(60)", "timeout", "timed out"),
        ("x = bytearray(8 * 2**30)", "memory", "memory limit of 256 MiB"),
        ("x = [0] * 10**9", "memory", "memory limit"),
        ("import os; os.abort()", "crash", "killed by signal 6"),
        ("import ctypes; ctypes.string_at(0)", "crash", "killed by signal 11"),
        ("raise ValueError('bad input')", "exception", "ValueError: bad input"),
        ("while True: print('x' * 1000)", "output_limit", "output exceeded 200 characters"),
    ],
)
def test_a_bad_snippet_is_a_tool_error_with_its_cause(code, kind, says):
    started = time.monotonic()
    result = call(code)
    assert time.monotonic() - started < 10
    assert result.error == kind and result.text.startswith("error:") and says in result.text
    assert len(result.text) < 2500
    assert call("print(6 * 7)").text == "42\n"  # the tool still works after it


def test_no_network():
    result = call("import socket; socket.create_connection(('127.0.0.1', 22), timeout=1)")
    assert result.error == "exception" and "Error" in result.text
    if network_namespace_available():
        # Under `unshare -rn` even a raw socket finds no interface but loopback, which is down.
        raw = call("import _socket; s = _socket.socket(); s.connect(('8.8.8.8', 53))")
        assert raw.error == "exception" and "unreachable" in raw.text.lower()


def test_calls_run_concurrently():
    async def both():
        return await asyncio.gather(
            *(run_tool(TOOL, {"code": "import time; time.sleep(1)"}, ToolContext(row=i)) for i in range(4))
        )

    started = time.monotonic()
    results = asyncio.run(both())
    assert all(r.error is None for r in results) and time.monotonic() - started < 3.5


def test_missing_code_argument():
    assert asyncio.run(run_tool(TOOL, {}, ToolContext(row=0))).error == "bad_arguments"
