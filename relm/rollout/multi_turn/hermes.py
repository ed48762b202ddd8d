"""Tool calls in Hermes format, as Qwen2.5's chat template asks for them:
`<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, one block per call."""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass
from typing import Any

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

FORMATS = ("hermes",)
"""`multi_turn.format` values relm parses (verl's default is hermes)."""


@dataclass(frozen=True)
class ToolCall:
    """One call the model wrote; `error` says why it could not be read (the model is told so)."""

    name: str
    arguments: dict[str, Any]
    error: str | None = None


def parse_tool_calls(text: str) -> list[ToolCall]:
    """The calls in one assistant turn's text, in order. A block that is not a JSON object with a string
    `name` and object `arguments` is a call with `error` set, so the model reads what was wrong."""
    calls = []
    for body in _CALL.findall(text):
        try:
            value = json.loads(body.strip())
        except json.JSONDecodeError as exc:
            calls.append(ToolCall("", {}, f"the tool call is not valid JSON ({exc.msg})"))
            continue
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            calls.append(ToolCall("", {}, 'a tool call needs {"name": ..., "arguments": {...}}'))
            continue
        arguments = value.get("arguments", {})
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            with contextlib.suppress(json.JSONDecodeError):
                arguments = json.loads(arguments)
        if not isinstance(arguments, dict):
            calls.append(ToolCall(value["name"], {}, "`arguments` must be a JSON object"))
            continue
        calls.append(ToolCall(value["name"], arguments))
    return calls
