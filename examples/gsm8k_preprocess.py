"""Turn GSM8K rows into relm's (verl's) parquet layout, from a file you already have.

    python examples/gsm8k_preprocess.py --input train.jsonl --output data/gsm8k/train.parquet --split train
    python examples/gsm8k_preprocess.py --input test-00000-of-00001.parquet \\
        --output data/gsm8k/test.parquet --split test

The input is a `.jsonl` or `.parquet` file with GSM8K's `question` and `answer` columns (as the Hugging
Face dataset `openai/gsm8k` ships them; nothing is downloaded here). Each output row asks the question
with verl's instruction to end on `#### <answer>`, names `openai/gsm8k` as its data source (scored by
relm's built-in gsm8k scorer), and keeps the number after the reference's `####` as the ground truth.
Train on it with
`relm train data.train_files=data/gsm8k/train.parquet data.val_files=data/gsm8k/test.parquet`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from relm.rewards.registry import extract_gsm8k_answer

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of a `.jsonl` or `.parquet` file as dicts."""
    if path.suffix == ".parquet":
        return pq.read_table(path).to_pylist()
    if path.suffix in (".jsonl", ".json"):
        with path.open(encoding="utf-8") as file:
            return [json.loads(line) for line in file if line.strip()]
    raise ValueError(f"--input '{path}': expected a .jsonl or .parquet file")


def convert_row(row: dict[str, Any], index: int, split: str) -> dict[str, Any]:
    """One GSM8K row in relm's layout.

    Raises:
        ValueError: The row lacks `question`/`answer`, or its answer has no `#### <number>`.
    """
    missing = [column for column in ("question", "answer") if not isinstance(row.get(column), str)]
    if missing:
        raise ValueError(f"row {index} has no text in column(s) {', '.join(missing)}; GSM8K rows need both")
    ground_truth = extract_gsm8k_answer(row["answer"], method="strict")
    if ground_truth is None:
        raise ValueError(f"row {index}: answer does not end with '#### <number>': {row['answer'][-80:]!r}")
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{row['question']} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"split": split, "index": index, "answer": row["answer"], "question": row["question"]},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True, type=Path, help="GSM8K rows: .jsonl or .parquet")
    parser.add_argument("--output", required=True, type=Path, help="parquet file to write")
    parser.add_argument("--split", default="train", help="split name stored in extra_info (train/test)")
    args = parser.parse_args(argv)
    try:
        if not args.input.is_file():
            raise ValueError(f"--input '{args.input}' does not exist")
        rows = [convert_row(row, index, args.split) for index, row in enumerate(read_rows(args.input))]
    except (ValueError, OSError, pa.ArrowException) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.output.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), args.output)
    print(f"wrote {len(rows)} rows to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
