"""The Python tool survives what a model may write: each failure is a tool error with its cause, in
bounded time, and the next call works."""

from __future__ import annotations

import asyncio
import functools
import json
import time
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from relm.models.tokenizer import _template_turn_end
from relm.rollout.base import FINISH_STOP, SamplingParams
from relm.rollout.multi_turn.driver import MultiTurnLimits, MultiTurnRollout
from relm.rollout.multi_turn.python_tool import PythonTool
from relm.rollout.multi_turn.render import ToolTurnRenderer
from relm.rollout.multi_turn.tools import ToolContext, run_tool
from tests.needs_box import skip_module_without_box
from tests.replay_engine import ReplayEngine

QWEN = Path(__file__).resolve().parents[3] / "shared" / "realworld" / "tokenizers" / "qwen2.5"

skip_module_without_box()

TOOL = PythonTool({"timeout_s": 3, "memory_mb": 256, "max_output_chars": 200})
# The same limits with room for a loaded machine: a box call took 0.1-0.15 s on a quiet 2-core VM and
# over 3 s at load average 10 (CI's `print(6 * 7)` timed out there), so the checks that a call works
# never hang on the 3-second limit the timeout cases test.
ROOMY = PythonTool({"timeout_s": 60, "memory_mb": 256, "max_output_chars": 200})


def call(code: str, tool: PythonTool = TOOL):
    return asyncio.run(run_tool(tool, {"code": code}, ToolContext(row=0)))


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
    assert time.monotonic() - started < 60  # a hang, not a slow machine: the limit is 3 s
    assert result.error == kind and result.text.startswith("error:") and says in result.text
    assert len(result.text) < 2500
    assert call("print(6 * 7)", ROOMY).text == "42\n"  # the tool still works after it


def test_no_network():
    result = call("import socket; socket.create_connection(('127.0.0.1', 22), timeout=1)")
    assert result.error == "exception" and "Error" in result.text
    # In the box's own network namespace even a raw socket finds no interface but loopback.
    raw = call("import _socket; s = _socket.socket(); s.connect(('8.8.8.8', 53))")
    assert raw.error == "exception" and "unreachable" in raw.text.lower()


def test_calls_run_concurrently():
    """Each call prints when its code started and ended (the box shares the wall clock): run concurrently,
    every call starts before any ends. No bound on the total time, which a loaded machine stretches."""
    code = "import time; a = time.time(); time.sleep(1); print(a, time.time())"

    async def all_four():
        return await asyncio.gather(*(run_tool(ROOMY, {"code": code}, ToolContext(row=i)) for i in range(4)))

    results = asyncio.run(all_four())
    assert all(r.error is None for r in results), results
    spans = [tuple(map(float, r.text.split())) for r in results]
    assert max(start for start, _ in spans) < min(end for _, end in spans), spans


def test_missing_code_argument():
    assert asyncio.run(run_tool(TOOL, {}, ToolContext(row=0))).error == "bad_arguments"


@functools.cache
def qwen_tokenizer():
    return AutoTokenizer.from_pretrained(str(QWEN))


def drive(tool: PythonTool, codes: list[str]):
    """The driver over `tool`: conversation k calls it with `codes[k]`, reads the result and answers."""
    if not QWEN.is_dir():
        pytest.skip("../shared/realworld/tokenizers/qwen2.5 is not here")
    tok = qwen_tokenizer()
    turn_end = _template_turn_end(tok)
    calls = [
        "<tool_call>\n" + json.dumps({"name": "python", "arguments": {"code": code}}) + "\n</tool_call>"
        for code in codes
    ]
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": f"Run case {k}."}],
            tools=[tool.schema],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for k in range(len(codes))
    ]
    engine = ReplayEngine(tok, turn_end, [[call, "#### 42"] for call in calls])
    engine.start(prompts)
    renderer = ToolTurnRenderer(tok, turn_end, chat_template_kwargs={"tools": [tool.schema]})
    rollout = MultiTurnRollout(
        engine,
        tok,
        renderer,
        {"python": tool},
        MultiTurnLimits(max_tool_response_length=400),
        tok.pad_token_id,
    )
    return tok, rollout.generate(prompts, SamplingParams(n=1, max_new_tokens=400))


def test_conversations_go_on_after_each_failure_and_the_step_counts_them():
    """The driver over the Python tool: four conversations each call it with a snippet that hangs, eats
    memory, crashes or floods the output; each reads its error (with the cause) as the tool's turn and
    answers in the next turn, and the rollout's metrics count four errors, one of them a timeout."""
    bad = {
        "while True: pass": "timed out after 3 s",
        "x = bytearray(8 * 2**30)": "memory limit of 256 MiB",
        "import os; os.abort()": "killed by signal 6",
        "while True: print('x' * 1000)": "output exceeded 200 characters",
    }
    tok, out = drive(TOOL, list(bad))
    gen = out.generation
    assert gen.finish_reasons == [FINISH_STOP] * len(bad)
    for row, says in enumerate(bad.values()):
        n = int(gen.response_mask[row].sum())
        text = tok.decode(gen.response_ids[row, :n])
        tool_turn = text[text.index("<tool_response>") : text.index("</tool_response>")]
        assert "error:" in tool_turn and says in tool_turn, tool_turn
        assert text.endswith("#### 42<|im_end|>"), "the model's next turn came after the error"
    assert out.metrics["multi_turn/tool_calls/mean"] == 1.0
    assert out.metrics["multi_turn/tool_errors"] == 4.0
    assert out.metrics["multi_turn/tool_timeouts"] == 1.0
    assert out.metrics["multi_turn/assistant_turns/mean"] == 2.0


def test_weak_mode_warns_at_every_step_that_used_the_tool(tmp_path, monkeypatch, caplog):
    """Without bwrap and with `allow_weak_sandbox: true`, each rollout step that ran code logs a warning."""
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on PATH
    weak = PythonTool({"timeout_s": 3, "allow_weak_sandbox": True})
    caplog.set_level("WARNING", logger="relm")
    for _step in range(2):
        caplog.clear()
        _, out = drive(weak, ["print(6 * 7)", "print(7 * 6)"])
        assert out.metrics["multi_turn/tool_errors"] == 0.0
        warnings = [r.getMessage() for r in caplog.records if "WITHOUT a box" in r.getMessage()]
        assert warnings and warnings[0].startswith("python tool: 2 calls this step"), warnings
