"""The lookup task: a tool use a random model learns by RL from scratch on a CPU (docs/multi_turn.md).

Each row's answer is a letter drawn at random for that row and handed only to the `lookup` tool
(`extra_info.tools_kwargs.lookup.create_kwargs.letter`); the prompt says nothing about it. The reward
is 1 when the conversation's last model turn answers the tool's result with exactly that letter and 0
otherwise, so a policy that calls the tool and writes any letter scores 1/6, and one that copies the
result scores 1. The
model is `zoo:tiny/qwen2-lookup`: `zoo:tiny/qwen2`'s shape with `relm.models.lookup_tokenizer`'s 16
tokens, in which the whole call is one token.
"""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from relm.data.lookup_task import LOOKUP_DATA_SOURCE
from relm.models.lookup_tokenizer import LOOKUP_LETTERS
from relm.rollout.multi_turn.tools import ToolContext, ToolResult, schema_name

LOOKUP_PROMPT = "?"
"""The user's turn: the same for every row, so only the tool can tell the rows apart."""


class Lookup:
    """The `lookup` tool: the row's letter (`tools_kwargs.lookup.create_kwargs.letter`), whatever it is asked."""

    DEFAULT_SCHEMA: dict[str, Any] = {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "The letter this conversation's key maps to.",
            "parameters": {"type": "object", "properties": {}, "required": []},
        },
    }

    def __init__(
        self, config: dict[str, Any] | None = None, tool_schema: dict[str, Any] | None = None
    ) -> None:
        self.schema = tool_schema or self.DEFAULT_SCHEMA
        self.name = schema_name(self.schema)

    def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        letter = context.kwargs.get("create_kwargs", {}).get("letter")
        if not isinstance(letter, str):
            return ToolResult(
                "error: this row has no extra_info.tools_kwargs.lookup.create_kwargs.letter", error="no_key"
            )
        return ToolResult(letter)


def lookup_rows(num_rows: int, split: str, seed: int) -> list[dict[str, Any]]:
    """Rows in verl's parquet layout; each row's letter is drawn at random (`seed`) and only its tool knows it."""
    draw = random.Random(seed)
    rows = []
    for index in range(num_rows):
        letter = draw.choice(LOOKUP_LETTERS)
        rows.append(
            {
                "data_source": LOOKUP_DATA_SOURCE,
                "prompt": [{"role": "user", "content": LOOKUP_PROMPT}],
                "reward_model": {"style": "rule", "ground_truth": letter},
                "extra_info": {
                    "index": index,
                    "split": split,
                    "tools_kwargs": {"lookup": {"create_kwargs": {"letter": letter}}},
                },
            }
        )
    return rows


def write_lookup_task(directory: str | Path, num_train: int = 512, num_val: int = 64) -> dict[str, Path]:
    """Write the task's `train.parquet`, `val.parquet` and `tools.yaml` (verl's tool config) into `directory`.

    Each file is written beside its final name and renamed into place, so runs started together on one
    folder never read a half-written file. The two splits draw their letters from different seeds.

    Returns:
        Paths by name: `train`, `val`, `tools`.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = {name: directory / f"{name}.{ext}" for name, ext in (("train", "parquet"), ("val", "parquet"))}
    paths["tools"] = directory / "tools.yaml"
    for name, num_rows, seed in (("train", num_train, 0), ("val", num_val, 1)):
        table = pa.Table.from_pylist(lookup_rows(num_rows, name, seed))
        _publish(paths[name], lambda staging, table=table: pq.write_table(table, staging))
    config = {"tools": [{"class_name": f"{Lookup.__module__}.{Lookup.__name__}", "config": {}}]}
    text = yaml.safe_dump(config, sort_keys=False)
    _publish(paths["tools"], lambda staging: Path(staging).write_text(text, encoding="utf-8"))
    return paths


def _publish(path: Path, write: Any) -> None:
    handle, staging = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(handle)
    try:
        write(staging)
        os.replace(staging, path)
    finally:
        if os.path.exists(staging):
            os.unlink(staging)
