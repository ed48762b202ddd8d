"""Turn GSM8K rows into relm's (verl's) parquet layout, from files you already have.

    python examples/gsm8k_preprocess.py --local_dataset_path ../shared/realworld/data/gsm8k \\
        --local_save_dir data/gsm8k
    python examples/gsm8k_preprocess.py --input test-00000-of-00001.parquet \\
        --output data/gsm8k/test.parquet --split test

The first form reads a folder holding `train` and `test` files (`.jsonl` as GSM8K's repository ships them,
or `.parquet` as the Hugging Face dataset `openai/gsm8k` does) and writes `train.parquet` and
`test.parquet` into `--local_save_dir` (`--local_dir`, verl's older name, works too); the second converts
one file. Nothing is downloaded. Each output row asks the question with verl's instruction to end on
`#### <answer>`, names `openai/gsm8k` as its data source (scored by relm's built-in gsm8k scorer), and
keeps the number after the reference's `####` as the ground truth. Train on it with
`relm train data.train_files=data/gsm8k/train.parquet data.val_files=data/gsm8k/test.parquet`.

`--multiturn tool` writes the rows of verl's multi-turn GSM8K example (verl's
`examples/data_preprocess/gsm8k_multiturn_w_tool.py`, Apache-2.0): its system prompt asking for the
`calc_gsm8k_reward` tool, the ground truth in `extra_info.tools_kwargs.calc_gsm8k_reward.create_kwargs`,
and `extra_info.interaction_kwargs`. `--multiturn interaction` writes those of verl's
`gsm8k_multiturn_w_interaction.py`: the system prompt asking to reconsider when the user says the answer
is wrong, and `interaction_kwargs` naming the `gsm8k` interaction (docs/multi_turn.md has both runs).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from relm.data.gsm8k import extract_gsm8k_answer

DATA_SOURCE = "openai/gsm8k"
SPLITS = ("train", "test")
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
MULTITURN_INSTRUCTION = "Let's think step by step and output the final answer after `####`."
"""verl's multi-turn scripts quote `####` with backticks where its single-turn one uses double quotes."""
MULTITURN_SYSTEM = {
    "tool": (
        "You are a math expert. You are given a question and you need to solve it step by step. "
        "Reasoning step by step before any tool call. "
        "You should use the `calc_gsm8k_reward` tool after step by step solving the question, "
        "before generate final answer at least once and refine your answer if necessary. "
        "Put your final answer in the format of `#### <answer>`."
    ),
    "interaction": (
        "You are a math expert. You are given a question and you need to solve it step by step. "
        "You should rethinking carefully if user point out your answer is wrong. "
        "Put your final answer in the format of `#### <answer>`."
    ),
}
"""The system prompts of verl's two multi-turn GSM8K preprocessors, word for word (the model reads them)."""


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of a `.jsonl` or `.parquet` file as dicts."""
    if path.suffix == ".parquet":
        return pq.read_table(path).to_pylist()
    if path.suffix in (".jsonl", ".json"):
        with path.open(encoding="utf-8") as file:
            return [json.loads(line) for line in file if line.strip()]
    raise ValueError(f"--input '{path}': expected a .jsonl or .parquet file")


def convert_row(row: dict[str, Any], index: int, split: str, multiturn: str | None = None) -> dict[str, Any]:
    """One GSM8K row in relm's layout (`multiturn`: `tool` or `interaction` for verl's multi-turn rows).

    Raises:
        ValueError: The row lacks `question`/`answer`, or its answer has no `#### <number>`.
    """
    missing = [column for column in ("question", "answer") if not isinstance(row.get(column), str)]
    if missing:
        raise ValueError(f"row {index} has no text in column(s) {', '.join(missing)}; GSM8K rows need both")
    ground_truth = extract_gsm8k_answer(row["answer"], method="strict")
    if ground_truth is None:
        raise ValueError(f"row {index}: answer does not end with '#### <number>': {row['answer'][-80:]!r}")
    extra_info = {"split": split, "index": index, "answer": row["answer"], "question": row["question"]}
    if multiturn is None:
        prompt = [{"role": "user", "content": f"{row['question']} {INSTRUCTION}"}]
    else:
        question = f"{row['question']} {MULTITURN_INSTRUCTION}"
        prompt = [
            {"role": "system", "content": MULTITURN_SYSTEM[multiturn]},
            {"role": "user", "content": question},
        ]
        interaction = {"query": question, "ground_truth": ground_truth}
        if multiturn == "tool":
            extra_info["need_tools_kwargs"] = True
            extra_info["tools_kwargs"] = {
                "calc_gsm8k_reward": {"create_kwargs": {"ground_truth": ground_truth}}
            }
        else:
            interaction = {"name": "gsm8k", **interaction}
        extra_info["interaction_kwargs"] = interaction
    return {
        "data_source": DATA_SOURCE,
        "prompt": prompt,
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": extra_info,
    }


def split_files(folder: Path) -> dict[str, Path]:
    """`train` and `test` files of a dataset folder: `<split>.jsonl`, `<split>.parquet` or `<split>-*.parquet`."""
    found: dict[str, Path] = {}
    for split in SPLITS:
        candidates = [
            folder / f"{split}.jsonl",
            folder / f"{split}.parquet",
            *sorted(folder.glob(f"{split}-*.parquet")),
        ]
        existing = [path for path in candidates if path.is_file()]
        if existing:
            found[split] = existing[0]
    if not found:
        raise ValueError(f"--local_dataset_path '{folder}' holds no train/test .jsonl or .parquet file")
    return found


def convert_file(source: Path, output: Path, split: str, multiturn: str | None = None) -> int:
    """Convert one file; returns the number of rows written."""
    if not source.is_file():
        raise ValueError(f"--input '{source}' does not exist")
    rows = [convert_row(row, index, split, multiturn) for index, row in enumerate(read_rows(source))]
    output.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), output)
    return len(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--local_dataset_path", type=Path, help="folder with GSM8K's train/test files")
    parser.add_argument("--local_save_dir", "--local_dir", type=Path, help="folder for train/test.parquet")
    parser.add_argument("--input", type=Path, help="one file of GSM8K rows: .jsonl or .parquet")
    parser.add_argument("--output", type=Path, help="parquet file to write (with --input)")
    parser.add_argument("--split", default="train", help="split name stored in extra_info (with --input)")
    parser.add_argument(
        "--multiturn",
        choices=sorted(MULTITURN_SYSTEM),
        help="the rows of verl's multi-turn GSM8K example: with the gsm8k tool, or with the gsm8k interaction",
    )
    args = parser.parse_args(argv)
    if (args.input is None) == (args.local_dataset_path is None):
        parser.error("give either --local_dataset_path (and --local_save_dir) or --input and --output")
    if args.input is not None and args.output is None:
        parser.error("--input needs --output")
    jobs = [(args.input, args.output, args.split)] if args.input is not None else None
    try:
        if jobs is None:
            save_dir = args.local_save_dir or Path("data/gsm8k")
            jobs = [
                (source, save_dir / f"{split}.parquet", split)
                for split, source in split_files(args.local_dataset_path).items()
            ]
        for source, output, split in jobs:
            # Every row of a file is checked before it is written: a bad row leaves no half-written file.
            count = convert_file(source, output, split, args.multiturn)
            print(f"wrote {count} rows to {output}")
    except (ValueError, OSError, pa.ArrowException) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
