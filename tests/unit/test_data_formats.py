"""Prompts in each form a verl or TRL user brings, read through relm's data path (`PromptDataset`).

Files (parquet, jsonl, json, csv), a `save_to_disk` folder and a Hub dataset id served by the local
Hub server; TRL's string prompts and top-level answer columns; verl 0.9's `max_samples` keys; and
mistyped local paths reported as missing paths rather than failed downloads.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from relm.config.loader import load_config
from relm.config.translate import translate
from relm.data.dataset import PromptDataset
from relm.errors import UserError
from relm.models.char_tokenizer import build_char_tokenizer
from relm.models.loading import resolve_model_dir
from tests.hub_server import serve_hub

QUESTIONS = ("2+2?", "3+3?", "a vowel?")
ANSWERS = ("4", "6", "a")


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _trl_rows(answer_column: str, conversational: bool = False) -> list[dict[str, Any]]:
    return [
        {"prompt": _user(q) if conversational else q, answer_column: a}
        for q, a in zip(QUESTIONS, ANSWERS, strict=True)
    ]


def _verl_rows() -> list[dict[str, Any]]:
    return [
        {
            "prompt": _user(q),
            "data_source": "src",
            "reward_model": {"ground_truth": a},
            "extra_info": {"i": i},
        }
        for i, (q, a) in enumerate(zip(QUESTIONS, ANSWERS, strict=True))
    ]


def _parquet(path: Path) -> tuple[str, str]:
    pq.write_table(pa.Table.from_pylist(_trl_rows("answer")), path / "p.parquet")
    return str(path / "p.parquet"), "answer"


def _jsonl(path: Path) -> tuple[str, str]:
    lines = "".join(json.dumps(row) + "\n" for row in _trl_rows("solution"))
    (path / "p.jsonl").write_text(lines, encoding="utf-8")
    return str(path / "p.jsonl"), "solution"


def _json(path: Path) -> tuple[str, str]:
    (path / "p.json").write_text(json.dumps(_trl_rows("ground_truth", conversational=True)), encoding="utf-8")
    return str(path / "p.json"), "ground_truth"


def _csv(path: Path) -> tuple[str, str]:
    lines = ["prompt,answer"] + [f'"{q}",{a}' for q, a in zip(QUESTIONS, ANSWERS, strict=True)]
    (path / "p.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path / "p.csv"), "answer"


def _saved(path: Path) -> tuple[str, str]:
    # verl's layout (nested reward_model) in a datasets folder; an `answer` column too, which loses to it.
    rows = [dict(row, answer="wrong") for row in _verl_rows()]
    datasets.Dataset.from_list(rows).save_to_disk(path / "saved")
    return str(path / "saved"), "reward_model.ground_truth"


@pytest.mark.parametrize("write", [_parquet, _jsonl, _json, _csv, _saved], ids=lambda f: f.__name__[1:])
def test_each_format_gives_chat_prompts_and_the_answer_column(
    tmp_path: Path, tokenizer, caplog, write: Callable[[Path], tuple[str, str]]
) -> None:
    source, column = write(tmp_path)
    with caplog.at_level(logging.INFO, logger="relm.data.dataset"):
        dataset = PromptDataset([source], tokenizer, max_prompt_length=64)
    assert [dataset[i]["raw_prompt"] for i in range(3)] == [_user(q) for q in QUESTIONS]
    assert [str(dataset[i]["ground_truth"]) for i in range(3)] == list(ANSWERS)  # csv reads "4" as 4
    assert f"data.train_files: the reward gets ground_truth from column '{column}'" in caplog.text
    assert (
        dataset[0]["prompt_ids"]
        == PromptDataset(_parquet(tmp_path)[0], tokenizer, max_prompt_length=64)[0]["prompt_ids"]
    )  # a string prompt renders as the same one-message chat


def test_a_file_without_an_answer_column_is_an_error_for_builtin_scorers_else_a_warning(
    tmp_path: Path, tokenizer, caplog
) -> None:
    path = tmp_path / "bare.jsonl"
    path.write_text(json.dumps({"prompt": "q"}) + "\n", encoding="utf-8")
    with pytest.raises(
        UserError, match=r"'.*bare.jsonl' has no answer for the reward .* the built-in scorers"
    ):
        PromptDataset([str(path)], tokenizer, max_prompt_length=64, answer_needed_by="the built-in scorers")
    with caplog.at_level(logging.WARNING, logger="relm.data.dataset"):
        dataset = PromptDataset([str(path)], tokenizer, max_prompt_length=64)
    assert dataset[0]["ground_truth"] is None
    assert "the reward gets ground_truth None" in caplog.text
    data = translate(load_config([f"data.train_files={path}"]))[0].data
    with pytest.raises(UserError, match="the built-in scorers"):
        PromptDataset.from_spec(data, [str(path)], tokenizer)


def test_max_samples_draw_as_verl(tmp_path: Path, tokenizer) -> None:
    rows = [{"prompt": f"q{i}", "answer": str(i)} for i in range(10)]
    path = tmp_path / "ten.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    cfg = load_config([f"data.train_files={path}", "data.train_max_samples=4", "data.val_max_samples=20"])
    data = translate(cfg)[0].data
    train = PromptDataset.from_spec(data, [str(path)], tokenizer)
    expected = np.random.default_rng(data.seed).choice(10, size=4, replace=False).tolist()
    assert [train[i]["row"] for i in range(len(train))] == expected
    assert len(PromptDataset.from_spec(data, [str(path)], tokenizer, files_key="data.val_files")) == 10
    in_order = dataclasses.replace(data, shuffle=False)
    assert [item["row"] for item in PromptDataset.from_spec(in_order, [str(path)], tokenizer)] == [0, 1, 2, 3]


def test_missing_local_paths_are_named_as_missing_not_as_failed_downloads(
    tmp_path: Path, tokenizer, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    (tmp_path / "data").mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # were either sent to the Hub, the error would say so
    with pytest.raises(UserError, match=r"^model folder `models/foo` does not exist"):
        resolve_model_dir("models/foo")
    for source in ("data/train", "data/train.jsonl", "train.parquet"):
        with pytest.raises(UserError, match=rf"^data.train_files: file '{source}' does not exist"):
            PromptDataset([source], tokenizer, max_prompt_length=64)


HUB_LOAD = """
import sys
from relm.data.dataset import PromptDataset
from relm.errors import UserError
from relm.models.char_tokenizer import build_char_tokenizer
for source, key in (("org/qa", "data.train_files"), ("org/qa", "data.val_files"), ("org/qa:extra", "data.train_files"),
                    ("org/none", "data.train_files")):
    try:
        items = PromptDataset([source], build_char_tokenizer(), max_prompt_length=64, files_key=key,
                              split="test" if key == "data.val_files" else "train")
        print("ok", [(item["raw_prompt"][0]["content"], item["ground_truth"]) for item in items])
    except UserError as exc:
        print("error:", exc)
"""


def test_a_hub_dataset_id_loads_its_split_through_datasets(tmp_path: Path) -> None:
    repo = tmp_path / "qa" / "data"
    repo.mkdir(parents=True)
    for split, rows in (
        ("train", [("q1", "1"), ("q2", "2")]),
        ("test", [("t", "9")]),
        ("extra", [("x", "0")]),
    ):
        lines = "".join(json.dumps({"prompt": q, "solution": a}) + "\n" for q, a in rows)
        (repo / f"{split}.jsonl").write_text(lines, encoding="utf-8")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    with serve_hub({"org/qa": repo.parent}) as (endpoint, requested):
        environ.update(HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT=endpoint, HF_HUB_DISABLE_PROGRESS_BARS="1")
        run = subprocess.run(
            [sys.executable, "-c", HUB_LOAD],
            capture_output=True,
            text=True,
            env=environ,
            check=False,
            cwd=tmp_path,
        )
    assert run.returncode == 0, run.stderr
    train, val, extra, missing = run.stdout.strip().splitlines()
    assert train == "ok [('q1', '1'), ('q2', '2')]"
    assert val == "ok [('t', '9')]"
    # datasets finds a repo's splits by file name (train, test, validation...): `extra` is not one.
    assert extra == (
        "error: data.train_files: dataset 'org/qa' has no split 'extra' (Unknown split \"extra\". Should be one "
        "of ['train', 'test'].); name one as `org/qa:<split>`"
    )
    assert missing.startswith(
        f"error: data.train_files: 'org/none' is neither a local file nor a dataset on {endpoint}"
    )
    assert any("/datasets/org/qa/resolve/" in line and "train.jsonl" in line for line in requested)
