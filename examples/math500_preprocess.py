"""Turn MATH-500 rows into relm's (verl's) parquet layout, from the file you already have.

    python examples/math500_preprocess.py --local_dataset_path ../shared/realworld/data/math500 \\
        --local_save_dir data/math500

MATH-500 is the 500-problem test subset of MATH chosen for PRM800K ("Let's Verify Step by Step"); its
rows carry `problem`, `solution`, `answer`, `subject`, `level` and `unique_id`. The folder holds
`test.jsonl` (or `test.parquet` / `test-*.parquet`, as the Hugging Face dataset ships it); nothing is
downloaded. Each output row asks the problem with verl's instruction to put the answer in `\\boxed{}`,
names `HuggingFaceH4/MATH-500` as its data source (the name verl's `default_compute_score` and relm's
scorer registry route to the boxed-answer math scorer), and keeps the `answer` field as the ground truth.
Evaluate a model on it with
`relm train data.val_files=data/math500/test.parquet trainer.val_only=true ...`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

DATA_SOURCE = "HuggingFaceH4/MATH-500"
INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
SPLIT = "test"


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of a `.jsonl` or `.parquet` file as dicts."""
    if path.suffix == ".parquet":
        return pq.read_table(path).to_pylist()
    if path.suffix in (".jsonl", ".json"):
        with path.open(encoding="utf-8") as file:
            return [json.loads(line) for line in file if line.strip()]
    raise ValueError(f"'{path}': expected a .jsonl or .parquet file")


def find_test_file(folder: Path) -> Path:
    """The folder's `test.jsonl`, `test.parquet` or `test-*.parquet`."""
    candidates = [folder / "test.jsonl", folder / "test.parquet", *sorted(folder.glob("test-*.parquet"))]
    for path in candidates:
        if path.is_file():
            return path
    raise ValueError(f"--local_dataset_path '{folder}' holds no test.jsonl or test .parquet file")


def convert_row(row: dict[str, Any], index: int) -> dict[str, Any]:
    """One MATH-500 row in relm's layout.

    Raises:
        ValueError: The row lacks the text of `problem`, `solution` or `answer`.
    """
    missing = [name for name in ("problem", "solution", "answer") if not isinstance(row.get(name), str)]
    if missing:
        raise ValueError(
            f"row {index} has no text in column(s) {', '.join(missing)}; MATH-500 rows need them"
        )
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{row['problem']} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": row["answer"]},
        "extra_info": {
            "split": SPLIT,
            "index": index,
            "answer": row["solution"],
            "question": row["problem"],
            "subject": str(row.get("subject", "")),
            "level": int(row.get("level") or 0),
            "unique_id": str(row.get("unique_id", "")),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--local_dataset_path", required=True, type=Path, help="folder with MATH-500's test file"
    )
    parser.add_argument(
        "--local_save_dir",
        "--local_dir",
        type=Path,
        default=Path("data/math500"),
        help="folder for test.parquet",
    )
    args = parser.parse_args(argv)
    try:
        source = find_test_file(args.local_dataset_path)
        rows = [convert_row(row, index) for index, row in enumerate(read_rows(source))]
    except (ValueError, OSError, pa.ArrowException) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    output = args.local_save_dir / f"{SPLIT}.parquet"
    output.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), output)
    print(f"wrote {len(rows)} rows to {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
