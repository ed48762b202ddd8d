"""examples/math500_preprocess.py: verl's layout, the data source verl's scorer routes to math, real rows."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from relm.rewards.registry import default_compute_score

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "math500_preprocess.py"
REALWORLD_MATH500 = Path(__file__).resolve().parents[3] / "shared" / "realworld" / "data" / "math500"

ROWS = [
    {
        "problem": "What is $1+1$?",
        "solution": "We add: $1+1=\\boxed{2}$.",
        "answer": "2",
        "subject": "Prealgebra",
        "level": 1,
        "unique_id": "test/prealgebra/1.json",
    },
    {
        "problem": "Simplify $\\frac{2}{4}$.",
        "solution": "Divide by 2: $\\boxed{\\frac{1}{2}}$.",
        "answer": "\\frac{1}{2}",
        "subject": "Prealgebra",
        "level": 2,
        "unique_id": "test/prealgebra/2.json",
    },
]


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("math500_preprocess", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _folder(tmp_path: Path, rows: list[dict]) -> Path:
    folder = tmp_path / "math500"
    folder.mkdir()
    (folder / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return folder


def test_rows_become_verls_layout(tmp_path, script, capsys):
    save = tmp_path / "data"
    assert (
        script.main(["--local_dataset_path", str(_folder(tmp_path, ROWS)), "--local_save_dir", str(save)])
        == 0
    )
    assert capsys.readouterr().out.strip() == f"wrote 2 rows to {save / 'test.parquet'}"
    rows = pq.read_table(save / "test.parquet").to_pylist()
    assert rows[1] == {
        "data_source": "HuggingFaceH4/MATH-500",
        "prompt": [
            {
                "role": "user",
                "content": "Simplify $\\frac{2}{4}$. Let's think step by step and output the final answer "
                "within \\boxed{}.",
            }
        ],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "\\frac{1}{2}"},
        "extra_info": {
            "split": "test",
            "index": 1,
            "answer": ROWS[1]["solution"],
            "question": ROWS[1]["problem"],
            "subject": "Prealgebra",
            "level": 2,
            "unique_id": "test/prealgebra/2.json",
        },
    }


def test_the_data_source_routes_to_the_math_scorer(tmp_path, script):
    save = tmp_path / "data"
    assert (
        script.main(["--local_dataset_path", str(_folder(tmp_path, ROWS)), "--local_save_dir", str(save)])
        == 0
    )
    row = pq.read_table(save / "test.parquet").to_pylist()[1]
    truth = row["reward_model"]["ground_truth"]
    assert default_compute_score(row["data_source"], row["extra_info"]["answer"], truth) == 1.0
    assert default_compute_score(row["data_source"], "so $\\boxed{\\frac{1}{3}}$", truth) == 0.0


@pytest.mark.parametrize(
    ("rows", "message"),
    [([{"problem": "p", "answer": "1"}], "row 0 has no text in column(s) solution"), ([], None)],
)
def test_bad_input_is_named(tmp_path, script, capsys, rows, message):
    folder = _folder(tmp_path, rows) if message else tmp_path  # no test file at all
    assert script.main(["--local_dataset_path", str(folder), "--local_save_dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and (message or "holds no test.jsonl") in err
    assert not (tmp_path / "o" / "test.parquet").exists()


def test_the_real_math500_file_converts_whole(tmp_path, script):
    if not REALWORLD_MATH500.is_dir():
        pytest.skip(f"{REALWORLD_MATH500} is not on this machine")
    assert (
        script.main(["--local_dataset_path", str(REALWORLD_MATH500), "--local_save_dir", str(tmp_path)]) == 0
    )
    rows = pq.read_table(tmp_path / "test.parquet").to_pylist()
    assert len(rows) == 500 and len({r["extra_info"]["unique_id"] for r in rows}) == 500
    # Every row's own answer, boxed as a model would write it, scores 1.0 through verl's routing.
    boxed = [f"The answer is $\\boxed{{{r['reward_model']['ground_truth']}}}$." for r in rows]
    scores = [
        default_compute_score(r["data_source"], b, r["reward_model"]["ground_truth"])
        for r, b in zip(rows, boxed, strict=True)
    ]
    assert scores == [1.0] * 500
