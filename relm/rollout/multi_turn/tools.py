"""The `Tool` protocol, the calculator, and loading tools from verl's tool config YAML.

A tool takes the arguments the model wrote and the row's context and returns text for the model, a
reward and metrics. `execute` may be a coroutine (the Python tool waits on a subprocess) or a plain
function (run in a worker thread), so the calls of one turn across the batch run concurrently.
"""

from __future__ import annotations

import ast
import asyncio
import importlib
import inspect
import logging
import operator
import sys
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

from relm.errors import UserError

logger = logging.getLogger("relm")

VERL_EQUIVALENTS = {
    "verl.tools.gsm8k_tool.Gsm8kTool": "relm.rollout.multi_turn.gsm8k.Gsm8kTool",
    "verl.interactions.gsm8k_interaction.Gsm8kInteraction": "relm.rollout.multi_turn.gsm8k.Gsm8kInteraction",
}
"""verl's example classes that relm runs its own counterpart of (verl itself needs Ray to import, and
0.8+ no longer ships them): verl's example configs work as they are."""


@dataclass(frozen=True)
class ToolResult:
    """What one call returns: the text the model reads, a reward, and numbers for the step's metrics."""

    text: str
    reward: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    """Why the call failed (a tool error the model reads in `text`), or None."""


@dataclass(frozen=True)
class ToolContext:
    """What a call knows beside its arguments: the row's `extra_info.tools_kwargs[name]` and the
    conversation's index in the batch."""

    row: int
    kwargs: dict[str, Any] = field(default_factory=dict)
    """verl's per-row `tools_kwargs[name]`: `create_kwargs`, `execute_kwargs`, ..."""


class Tool(Protocol):
    """A function the model may call; `schema` is the OpenAI-style function schema the chat template shows."""

    name: str
    schema: dict[str, Any]

    def execute(
        self, arguments: dict[str, Any], context: ToolContext
    ) -> ToolResult | Awaitable[ToolResult]: ...


def schema_name(schema: dict[str, Any]) -> str:
    """The function name of an OpenAI-style tool schema (`{"type": "function", "function": {"name": ...}}`)."""
    function = schema.get("function", schema)
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or not name:
        raise UserError(f"tool_schema {schema!r} has no function name; write `tool_schema.function.name`")
    return name


_OPERATORS: dict[type, Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
_MAX_EXPONENT = 1000
"""A larger power is refused: `9**9**9` would hold the run for minutes."""


def evaluate_arithmetic(expression: str) -> float | int:
    """The value of `expression` with numbers and + - * / // % ** and parentheses only (no names, no calls).

    Walking the parsed tree instead of calling `eval` keeps a model's text from running anything.
    """

    def walk(node: ast.AST) -> float | int:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, int | float)
            and not isinstance(node.value, bool)
        ):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
                raise ValueError(f"exponent {right} is too large")
            return _OPERATORS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](walk(node.operand))
        raise ValueError(f"unsupported expression element {type(node).__name__}")

    return walk(ast.parse(expression, mode="eval"))


class Calculator:
    """Arithmetic on one `expression` argument; errors come back as text the model reads."""

    DEFAULT_SCHEMA: dict[str, Any] = {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression (+ - * / // % ** and parentheses).",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "e.g. (3 + 4) * 12"}},
                "required": ["expression"],
            },
        },
    }

    def __init__(
        self, config: dict[str, Any] | None = None, tool_schema: dict[str, Any] | None = None
    ) -> None:
        self.schema = tool_schema or self.DEFAULT_SCHEMA
        self.name = schema_name(self.schema)

    def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        expression = arguments.get("expression")
        if not isinstance(expression, str):
            return ToolResult(
                "error: pass the expression as a string argument `expression`", error="bad_arguments"
            )
        try:
            value = evaluate_arithmetic(expression)
        except (SyntaxError, ValueError, ZeroDivisionError, OverflowError, TypeError) as exc:
            return ToolResult(f"error: {type(exc).__name__}: {exc}", error=type(exc).__name__)
        return ToolResult(str(value))


class _VerlStyleTool:
    """A tool written against verl's `BaseTool` (`create`/`execute(instance_id, parameters)`/`release`),
    driven through relm's protocol: one instance per call, created with the row's `create_kwargs`."""

    def __init__(self, tool: Any, schema: dict[str, Any]) -> None:
        self.tool, self.schema, self.name = tool, schema, schema_name(schema)

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        created = await _maybe_await(self.tool.create(**context.kwargs.get("create_kwargs", {})))
        instance_id = created[0] if isinstance(created, tuple) else created
        try:
            response, reward, metrics = await _maybe_await(
                self.tool.execute(instance_id, arguments, **context.kwargs.get("execute_kwargs", {}))
            )
        finally:
            await _maybe_await(self.tool.release(instance_id))
        text = response if isinstance(response, str) else getattr(response, "text", None) or ""
        return ToolResult(str(text), float(reward or 0.0), dict(metrics or {}))


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def run_tool(tool: Tool, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
    """One call, awaited: a coroutine tool directly, a plain one in a worker thread. An exception the
    tool raises is a tool error the model reads, never the end of the run."""
    try:
        if inspect.iscoroutinefunction(tool.execute):
            result = await tool.execute(arguments, context)
        else:
            result = await _maybe_await(await asyncio.to_thread(tool.execute, arguments, context))
    except Exception as exc:  # the tool's own bug: the model reads it, the run goes on
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        return ToolResult(f"error: {reason}", error=type(exc).__name__)
    if isinstance(result, tuple):  # (text, reward, metrics), as the protocol and verl return
        text, reward, metrics = (list(result) + [0.0, {}])[:3]
        return ToolResult(str(text), float(reward or 0.0), dict(metrics or {}))
    return result


@dataclass(frozen=True)
class ConfigEntry:
    """One entry of verl's tool or interaction config, its class imported."""

    where: str
    """`key=path: section[index]`, which every error about the entry starts with."""
    entry: dict[str, Any]
    """The entry as written (`class_name`, `config`, `tool_schema` or `name`)."""
    cls: type
    """The class `class_name` names."""


def config_entries(config_path: str, key: str, section: str, what: str) -> list[ConfigEntry]:
    """The entries of verl's tool config (`tools:`) or interaction config (`interaction:`): a YAML
    mapping whose `section` is a non-empty list of mappings, each with a dotted `class_name` importable
    from the file's folder or sys.path.

    Args:
        config_path: The YAML file.
        key: The config key that names it, for the error lines.
        section: The list's key (`tools`, `interaction`).
        what: What the file configures, for the error lines (`tool`, `interaction`).

    Raises:
        UserError: The file is missing or malformed, or an entry's class does not import.
    """
    path = Path(config_path)
    if not path.is_file():
        raise UserError(
            f"{key}={config_path}: no such file; give verl's {what} config YAML (`{section}:` list)"
        )
    try:
        entries = (yaml.safe_load(path.read_text()) or {}).get(section)
    except (yaml.YAMLError, AttributeError) as exc:
        raise UserError(
            f"{key}={config_path}: not a YAML mapping holding a `{section}:` list ({exc})"
        ) from exc
    if not isinstance(entries, list) or not entries:
        raise UserError(f"{key}={config_path}: needs a non-empty `{section}:` list")
    loaded = []
    for index, entry in enumerate(entries):
        where = f"{key}={config_path}: {section}[{index}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("class_name"), str):
            raise UserError(f"{where} needs a `class_name` (a dotted Python name)")
        loaded.append(ConfigEntry(where, entry, import_class(entry["class_name"], path.parent, where)))
    return loaded


def load_tools(config_path: str) -> dict[str, Tool]:
    """The tools of a verl tool config: `tools:` entries with `class_name` (a dotted name importable from
    the config file's folder or sys.path), `config` and an OpenAI-style `tool_schema`.

    Raises:
        UserError: The file is missing or malformed, a class does not import, or two tools share a name.
    """
    key = "actor_rollout_ref.rollout.multi_turn.tool_config_path"
    tools: dict[str, Tool] = {}
    for loaded in config_entries(config_path, key, "tools", "tool"):
        where, entry, cls = loaded.where, loaded.entry, loaded.cls
        schema = entry.get("tool_schema")
        config = dict(entry.get("config") or {})
        try:
            instance = cls(config=config, tool_schema=schema)
        except UserError as exc:  # the tool names the problem and its fix itself
            raise UserError(f"{where}: {exc}") from exc
        except Exception as exc:
            raise UserError(
                f"{where}: {entry['class_name']}(config=..., tool_schema=...) raised {exc!r}"
            ) from exc
        schema = getattr(instance, "schema", None) or getattr(instance, "tool_schema", None) or schema
        if isinstance(schema, dict) is False:
            schema = _to_dict(schema)
        if not isinstance(schema, dict):
            raise UserError(f"{where} has no `tool_schema`; write the OpenAI-style function schema")
        tool: Tool = _VerlStyleTool(instance, schema) if _is_verl_style(instance) else instance
        if tool.name in tools:
            raise UserError(f"{where}: a second tool named `{tool.name}`; give each tool its own name")
        tools[tool.name] = tool
    return tools


def _to_dict(schema: Any) -> Any:
    dump = getattr(schema, "model_dump", None)  # verl keeps schemas as pydantic models
    return dump(exclude_unset=True) if dump else schema


def _is_verl_style(tool: Any) -> bool:
    try:
        return "instance_id" in inspect.signature(tool.execute).parameters
    except (TypeError, ValueError, AttributeError):
        return False


def import_class(dotted: str, folder: Path, where: str) -> type:
    """The class a config's `class_name` names, importable from `folder` (the config's) or sys.path;
    one of verl's example classes is swapped for relm's counterpart (VERL_EQUIVALENTS), with a log line."""
    if dotted in VERL_EQUIVALENTS:
        logger.warning("%s: `%s` runs as relm's built-in `%s`", where, dotted, VERL_EQUIVALENTS[dotted])
        dotted = VERL_EQUIVALENTS[dotted]
    module_name, _, attr = dotted.rpartition(".")
    if not module_name:
        raise UserError(f"{where}: class_name `{dotted}` needs a module, e.g. my_tools.LookupTool")
    added = str(folder.resolve()) not in sys.path
    if added:
        sys.path.insert(0, str(folder.resolve()))
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise UserError(
            f"{where}: cannot import `{module_name}` ({type(exc).__name__}: {exc}); put it beside the tool "
            "config or on PYTHONPATH"
        ) from exc
    finally:
        if added:
            sys.path.remove(str(folder.resolve()))
    cls = getattr(module, attr, None)
    if cls is None:
        raise UserError(f"{where}: module `{module_name}` has no `{attr}`")
    return cls
