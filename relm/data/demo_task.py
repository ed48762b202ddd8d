"""The built-in demo task: "write the letter k", scored by the share of k's in the response.

It is chosen so that RL from random weights shows a rising reward within minutes on a CPU: the
reward is dense (every character counts, not just an exact match), the prompt is a single
character the policy can condition on, and a 2-layer model with a character vocabulary can
represent the optimal policy. The prompt is the bare letter because the ChatML wrapper alone
costs 19 tokens with the character tokenizer (20 with the letter; see `DEMO_PROMPT_TOKENS`).
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

DEMO_DATA_SOURCE = "relm/letters"
DEMO_LETTERS = ("a", "e", "o", "s", "t", "x")
DEMO_PROMPT_TOKENS = 20
"""Prompt length in tokens with the char tokenizer and ChatML template: the demo's
`data.max_prompt_length` must be at least this."""

_SPECIAL_TOKEN = re.compile(r"<\|[^|<>]*\|>")


def letter_share_score(solution_str: str, ground_truth: str) -> float:
    """Share of the response's characters that equal the target letter, in [0, 1].

    Special tokens written as text (`<|im_end|>`) are removed first, so a response's eos never
    dilutes its score whether or not the decoder skipped special tokens. Empty scores 0.
    """
    if not ground_truth:
        raise ValueError(f"ground_truth must be a non-empty string, got {ground_truth!r}")
    text = _SPECIAL_TOKEN.sub("", solution_str)
    if not text:
        return 0.0
    # Longer targets count the characters their non-overlapping occurrences cover.
    return text.count(ground_truth) * len(ground_truth) / len(text)


def demo_rows(num_rows: int, split: str) -> list[dict[str, Any]]:
    """Rows in verl's parquet layout; letters cycle so every letter is equally frequent."""
    rows = []
    for index in range(num_rows):
        letter = DEMO_LETTERS[index % len(DEMO_LETTERS)]
        rows.append(
            {
                "data_source": DEMO_DATA_SOURCE,
                "prompt": [{"role": "user", "content": letter}],
                "reward_model": {"style": "rule", "ground_truth": letter},
                "extra_info": {"index": index, "split": split},
            }
        )
    return rows


def write_demo_parquet(directory: str | Path, num_train: int = 512, num_val: int = 32) -> tuple[Path, Path]:
    """Write `train.parquet` and `val.parquet` of the demo task into `directory`.

    Each file is written beside its final name and renamed into place, so runs started together
    on a shared cache folder never read a half-written file.

    Returns:
        (train path, val path).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = (directory / "train.parquet", directory / "val.parquet")
    for path, num_rows, split in ((paths[0], num_train, "train"), (paths[1], num_val, "test")):
        handle, staging = tempfile.mkstemp(prefix=f".{path.name}.", dir=directory)
        os.close(handle)
        try:
            pq.write_table(pa.Table.from_pylist(demo_rows(num_rows, split)), staging)
            os.replace(staging, path)
        finally:
            if os.path.exists(staging):
                os.unlink(staging)
    return paths
