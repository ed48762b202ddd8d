"""examples/gsm8k_preprocess.py on three hand-written GSM8K rows (no downloads)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from relm.data.dataset import PromptDataset
from relm.models.char_tokenizer import build_char_tokenizer
from relm.rewards.registry import default_compute_score

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "gsm8k_preprocess.py"

ROWS = [
    {
        "question": "Natalia sold clips to 48 friends in April, and half as many in May. How many in all?",
        "answer": "In May she sold 48/2 = <<48/2=24>>24 clips.\nIn all 48+24 = <<48+24=72>>72.\n#### 72",
    },
    {
        "question": "A shop sells 1,200 pens a day. How many in 5 days?",
        "answer": "1,200 * 5 = <<1200*5=6000>>6,000\n#### 6,000",
    },
    {"question": "It is 3 degrees and drops 5. What is it now?", "answer": "3 - 5 = -2\n#### -2"},
]
SUFFIX = ' Let\'s think step by step and output the final answer after "####".'


def _load_script():
    spec = importlib.util.spec_from_file_location("gsm8k_preprocess", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def script():
    return _load_script()


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def test_jsonl_rows_become_relm_parquet(tmp_path, script, capsys):
    output = tmp_path / "out" / "train.parquet"
    assert script.main(["--input", str(_jsonl(tmp_path / "in.jsonl", ROWS)), "--output", str(output)]) == 0
    assert "wrote 3 rows" in capsys.readouterr().out
    rows = pq.read_table(output).to_pylist()
    assert [row["reward_model"] for row in rows] == [
        {"style": "rule", "ground_truth": "72"},
        {"style": "rule", "ground_truth": "6000"},  # the reference's thousands comma is dropped
        {"style": "rule", "ground_truth": "-2"},
    ]
    first = rows[0]
    assert first["data_source"] == "openai/gsm8k"
    assert first["prompt"] == [{"role": "user", "content": ROWS[0]["question"] + SUFFIX}]
    assert first["extra_info"] == {
        "split": "train",
        "index": 0,
        "answer": ROWS[0]["answer"],
        "question": ROWS[0]["question"],
    }
    assert [row["extra_info"]["index"] for row in rows] == [0, 1, 2]


def test_parquet_input_and_split_and_the_output_trains(tmp_path, script):
    source = tmp_path / "test-00000-of-00001.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), source)
    output = tmp_path / "test.parquet"
    assert script.main(["--input", str(source), "--output", str(output), "--split", "test"]) == 0

    # relm reads the file as training data, and its built-in scorer grades answers against it.
    dataset = PromptDataset([str(output)], build_char_tokenizer(), max_prompt_length=512)
    assert len(dataset) == 3 and dataset[1]["extra_info"]["split"] == "test"
    item = dataset[1]
    assert (
        default_compute_score(item["data_source"], "5 days: 6,000 pens.\n#### 6,000", item["ground_truth"])
        == 1.0
    )
    assert default_compute_score(item["data_source"], "#### 6001", item["ground_truth"]) == 0.0


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"question": "q", "answer": "the answer is 4"}], "row 0: answer does not end with '#### <number>'"),
        ([ROWS[0], {"question": "q"}], "row 1 has no text in column(s) answer"),
    ],
)
def test_bad_rows_are_named(tmp_path, script, capsys, rows, message):
    output = tmp_path / "out.parquet"
    assert script.main(["--input", str(_jsonl(tmp_path / "in.jsonl", rows)), "--output", str(output)]) == 2
    assert message in capsys.readouterr().err
    assert not output.exists()


def test_missing_or_unknown_input(tmp_path, script, capsys):
    assert (
        script.main(["--input", str(tmp_path / "nope.jsonl"), "--output", str(tmp_path / "o.parquet")]) == 2
    )
    assert "does not exist" in capsys.readouterr().err
    csv = tmp_path / "rows.csv"
    csv.write_text("question,answer\n")
    assert script.main(["--input", str(csv), "--output", str(tmp_path / "o.parquet")]) == 2
    assert "expected a .jsonl or .parquet file" in capsys.readouterr().err


REALWORLD_GSM8K = Path(__file__).resolve().parents[3] / "shared" / "realworld" / "data" / "gsm8k"


def test_a_dataset_folder_becomes_train_and_test_parquet(tmp_path, script, capsys):
    source = tmp_path / "gsm8k"
    source.mkdir()
    _jsonl(source / "train.jsonl", ROWS)
    pq.write_table(pa.Table.from_pylist(ROWS[:2]), source / "test-00000-of-00001.parquet")  # HF's file name
    save = tmp_path / "data"
    assert script.main(["--local_dataset_path", str(source), "--local_save_dir", str(save)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"wrote 3 rows to {save / 'train.parquet'}",
        f"wrote 2 rows to {save / 'test.parquet'}",
    ]
    assert [r["extra_info"]["split"] for r in pq.read_table(save / "test.parquet").to_pylist()] == [
        "test"
    ] * 2
    # verl's older name for the output folder
    assert script.main(["--local_dataset_path", str(source), "--local_dir", str(tmp_path / "old")]) == 0
    assert (tmp_path / "old" / "train.parquet").is_file()


def test_a_folder_without_gsm8k_files_is_named(tmp_path, script, capsys):
    assert script.main(["--local_dataset_path", str(tmp_path), "--local_save_dir", str(tmp_path / "o")]) == 2
    assert "holds no train/test .jsonl or .parquet file" in capsys.readouterr().err


def test_the_real_gsm8k_files_convert_whole(tmp_path, script):
    if not REALWORLD_GSM8K.is_dir():
        pytest.skip(f"{REALWORLD_GSM8K} is not on this machine")
    assert script.main(["--local_dataset_path", str(REALWORLD_GSM8K), "--local_save_dir", str(tmp_path)]) == 0
    for split, num_rows in (("train", 7473), ("test", 1319)):
        rows = pq.read_table(tmp_path / f"{split}.parquet").to_pylist()
        assert len(rows) == num_rows
        # The ground truth is the reference's number after `####`, thousands commas dropped.
        for row in rows:
            final = row["extra_info"]["answer"].split("####")[-1].strip().replace(",", "")
            assert row["reward_model"]["ground_truth"] == final
        assert set(rows[0]) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
