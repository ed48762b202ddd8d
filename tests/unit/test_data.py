"""Demo task data, the parquet prompt dataset and the seeded, resumable loader."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from relm.data.dataset import PromptDataset
from relm.data.demo_task import DEMO_DATA_SOURCE, DEMO_LETTERS, DEMO_PROMPT_TOKENS, write_demo_parquet
from relm.data.loader import PromptLoader
from relm.errors import UserError
from relm.models.char_tokenizer import build_char_tokenizer
from relm.rollout.padding import left_pad

# ChatML wrapper around a message's content: <|im_start|>user\n ... <|im_end|>\n<|im_start|>assistant\n
WRAPPER_TOKENS = 19


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


def _user(content: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": content}]


def _write(path: Path, rows: list[dict[str, Any]]) -> str:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def _prompts(tmp_path: Path, contents: list[str], name: str = "p.parquet") -> str:
    rows = [
        {
            "prompt": _user(c),
            "data_source": "src",
            "reward_model": {"ground_truth": c[:1]},
            "extra_info": {"i": i},
        }
        for i, c in enumerate(contents)
    ]
    return _write(tmp_path / name, rows)


# --- demo task -------------------------------------------------------------------------------------


def test_demo_parquet_has_verl_layout_and_fits_the_prompt_budget(tmp_path, tokenizer):
    train, val = write_demo_parquet(tmp_path)
    assert write_demo_parquet(tmp_path) == (train, val)  # rewriting in place is fine
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.parquet", "val.parquet"]  # no staging left
    table = pq.read_table(train)
    assert table.num_rows == 512 and pq.read_table(val).num_rows == 32
    assert set(table.column_names) == {"prompt", "data_source", "reward_model", "extra_info"}
    row = table.slice(7, 1).to_pylist()[0]
    assert row == {
        "data_source": DEMO_DATA_SOURCE,
        "prompt": [{"role": "user", "content": DEMO_LETTERS[1]}],
        "reward_model": {"style": "rule", "ground_truth": DEMO_LETTERS[1]},
        "extra_info": {"index": 7, "split": "train"},
    }
    dataset = PromptDataset([str(train)], tokenizer, max_prompt_length=DEMO_PROMPT_TOKENS)
    assert len(dataset) == 512 and dataset.num_filtered == 0
    assert {len(dataset[i]["prompt_ids"]) for i in range(len(dataset))} == {DEMO_PROMPT_TOKENS}
    with pytest.raises(UserError, match=r"all 32 prompts .* raise data.max_prompt_length to at least 20"):
        PromptDataset(
            [str(val)], tokenizer, max_prompt_length=DEMO_PROMPT_TOKENS - 1, files_key="data.val_files"
        )


# --- dataset ---------------------------------------------------------------------------------------


def test_dataset_applies_the_template_and_keeps_row_fields(tmp_path, tokenizer):
    dataset = PromptDataset([_prompts(tmp_path, ["hi", "yo"])], tokenizer, max_prompt_length=64)
    item = dataset[1]
    assert tokenizer.decode(item["prompt_ids"]) == "<|im_start|>user\nyo<|im_end|>\n<|im_start|>assistant\n"
    assert (item["data_source"], item["ground_truth"], item["extra_info"]) == ("src", "y", {"i": 1})
    assert (item["index"], item["row"]) == (1, 1) and item["raw_prompt"] == _user("yo")


def test_overlong_prompts_are_filtered_counted_and_logged(tmp_path, tokenizer, caplog):
    contents = ["a", "abcdef", "ab", "abcdefghij", "abc"]  # 20, 25, 21, 29, 22 tokens
    with caplog.at_level(logging.WARNING, logger="relm.data.dataset"):
        dataset = PromptDataset(
            [_prompts(tmp_path, contents)], tokenizer, max_prompt_length=WRAPPER_TOKENS + 3
        )
    assert dataset.num_filtered == 2 and len(dataset) == 3
    assert [dataset[i]["row"] for i in range(3)] == [0, 2, 4]
    assert [dataset[i]["index"] for i in range(3)] == [0, 1, 2]
    assert "dropped 2 of 5 prompts" in caplog.text and "(longest 29)" in caplog.text


def test_left_padding_puts_every_prompt_end_in_the_last_column(tmp_path, tokenizer):
    dataset = PromptDataset([_prompts(tmp_path, ["a", "abc"])], tokenizer, max_prompt_length=64)
    ids, mask = left_pad([dataset[0]["prompt_ids"], dataset[1]["prompt_ids"]], pad_id=tokenizer.pad_token_id)
    assert ids.shape == mask.shape == (2, 22)
    assert mask[0].tolist() == [0, 0] + [1] * 20 and mask[1].tolist() == [1] * 22
    assert ids[0, :2].tolist() == [tokenizer.pad_token_id] * 2
    assert ids[:, -1].tolist() == [tokenizer.encode("\n")[0]] * 2  # "...assistant\n"
    assert ids[0, 2:].tolist() == dataset[0]["prompt_ids"]


def test_optional_columns_default(tmp_path, tokenizer, caplog):
    path = _write(tmp_path / "bare.parquet", [{"prompt": _user("q")}])
    with caplog.at_level(logging.WARNING, logger="relm.data.dataset"):
        item = PromptDataset([path], tokenizer, max_prompt_length=64)[0]
    assert (item["data_source"], item["ground_truth"], item["extra_info"]) == ("unknown", None, {})
    assert "no column 'data_source'" in caplog.text


def test_several_files_concatenate_and_a_single_path_is_accepted(tmp_path, tokenizer):
    first, second = _prompts(tmp_path, ["a"], "1.parquet"), _prompts(tmp_path, ["b", "c"], "2.parquet")
    dataset = PromptDataset([first, second], tokenizer, max_prompt_length=64)
    assert [(dataset[i]["file"], dataset[i]["row"]) for i in range(3)] == [
        (first, 0),
        (second, 0),
        (second, 1),
    ]
    assert len(PromptDataset(second, tokenizer, max_prompt_length=64)) == 2


@pytest.mark.parametrize(
    ("cell", "message"),
    [
        ([], r"row 0 column 'prompt' is list \[\]; it must be a text or a non-empty list"),
        (5, r"row 0 column 'prompt' is int 5"),
        ([{"role": "user"}], r"row 0 column 'prompt': message 0 is dict"),
        (["hello"], r"row 0 column 'prompt': message 0 is str 'hello'"),
        (
            [{"role": "user", "content": 5}],
            r"row 0 column 'prompt': message 0 has role str 'user' and content int 5",
        ),
    ],
)
def test_malformed_prompt_cells_name_file_row_and_fix(tmp_path, tokenizer, cell, message):
    # One row per file: pyarrow needs one type per column, and bad cells have other types.
    good = _write(tmp_path / "good.parquet", [{"prompt": _user("ok")}])
    bad = _write(tmp_path / "bad.parquet", [{"prompt": cell}, {"prompt": cell}])
    with pytest.raises(UserError, match=rf"data.prompt_key: '{bad}' {message}"):
        PromptDataset([good, bad], tokenizer, max_prompt_length=64)


def test_a_bad_row_after_good_ones_is_named_by_its_row(tmp_path, tokenizer):
    bad = _write(tmp_path / "bad.parquet", [{"prompt": _user("ok")}, {"prompt": _user(None)}])
    with pytest.raises(
        UserError, match=r"row 1 column 'prompt': message 0 has role str 'user' and content NoneType"
    ):
        PromptDataset([bad], tokenizer, max_prompt_length=64)


def test_file_level_errors(tmp_path, tokenizer):
    with pytest.raises(UserError, match=r"data.train_files: file '/no/such.parquet' does not exist"):
        PromptDataset(["/no/such.parquet"], tokenizer, max_prompt_length=64)
    junk = tmp_path / "junk.parquet"
    junk.write_text("question,answer\n1,2\n")
    with pytest.raises(UserError, match=r"data.val_files: '.*junk.parquet' is not a readable parquet file"):
        PromptDataset([str(junk)], tokenizer, max_prompt_length=64, files_key="data.val_files")
    other = _write(tmp_path / "other.parquet", [{"question": "q", "answer": "a"}])
    with pytest.raises(
        UserError, match=r"has no column 'prompt' \(columns: question, answer\); set data.prompt_key"
    ):
        PromptDataset([other], tokenizer, max_prompt_length=64)
    with pytest.raises(UserError, match=r"data.train_files: no files given"):
        PromptDataset([], tokenizer, max_prompt_length=64)
    empty = tmp_path / "empty.parquet"
    pq.write_table(
        pa.table({"prompt": pa.array([], type=pa.list_(pa.struct([("role", pa.string())])))}), empty
    )
    with pytest.raises(UserError, match=r"hold no rows"):
        PromptDataset([str(empty)], tokenizer, max_prompt_length=64)


# --- loader ----------------------------------------------------------------------------------------


@pytest.fixture()
def ten_prompts(tmp_path, tokenizer):
    return PromptDataset(
        [_prompts(tmp_path, [chr(ord("a") + i) for i in range(10)])],
        tokenizer,
        max_prompt_length=64,
        return_raw_chat=True,
    )


def test_loader_order_is_the_seeded_permutation_of_each_epoch(ten_prompts):
    loader = PromptLoader(ten_prompts, batch_size=4, shuffle=True, seed=7)
    assert loader.batches_per_epoch == 2  # 10 // 4, the partial batch dropped
    seen = [(loader.epoch, loader.step_in_epoch, loader.next_batch().indices) for _ in range(5)]
    for epoch in (0, 1, 2):
        order = torch.randperm(10, generator=torch.Generator().manual_seed(7 + epoch)).tolist()
        assert [indices for e, _, indices in seen if e == epoch] == [order[0:4], order[4:8]][: 5 - 2 * epoch]
    assert [(e, s) for e, s, _ in seen] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0)]
    assert (loader.epoch, loader.step_in_epoch) == (2, 1)


def test_loader_batch_carries_the_rows_fields(ten_prompts):
    batch = PromptLoader(ten_prompts, batch_size=3, shuffle=False, seed=0).next_batch()
    assert batch.indices == [0, 1, 2] and len(batch) == 3
    assert batch.prompt_ids == [ten_prompts[i]["prompt_ids"] for i in range(3)]
    assert batch.data_sources == ["src"] * 3 and batch.ground_truths == ["a", "b", "c"]
    assert batch.extra_infos == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert batch.raw_prompts == [_user("a"), _user("b"), _user("c")]


def test_loader_state_round_trip_resumes_at_the_same_position(ten_prompts):
    original = PromptLoader(ten_prompts, batch_size=3, shuffle=True, seed=1)
    for _ in range(4):  # 3 batches an epoch: stop one batch into epoch 1
        original.next_batch()
    state = original.state_dict()
    resumed = PromptLoader(ten_prompts, batch_size=3, shuffle=True, seed=1)
    resumed.load_state_dict(state)
    assert (resumed.epoch, resumed.step_in_epoch) == (1, 1)
    assert [resumed.next_batch().indices for _ in range(5)] == [
        original.next_batch().indices for _ in range(5)
    ]

    with pytest.raises(UserError, match=r"batch size 3 over 10 prompts, this run has 5 over 10"):
        PromptLoader(ten_prompts, batch_size=5, shuffle=True, seed=1).load_state_dict(state)


def test_iter_epoch_gives_one_pass_each_call_without_drop_last(ten_prompts):
    loader = PromptLoader(ten_prompts, batch_size=4, shuffle=False, seed=0, drop_last=False)
    assert loader.batches_per_epoch == 3
    passes = [[batch.indices for batch in loader.iter_epoch()] for _ in range(2)]
    assert passes[0] == passes[1] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert (loader.epoch, loader.step_in_epoch) == (2, 0)


def test_dataset_smaller_than_a_batch_names_the_key_and_size(ten_prompts):
    with pytest.raises(UserError, match=r"data.train_batch_size=16 is larger than the dataset \(10 prompts"):
        PromptLoader(ten_prompts, batch_size=16, shuffle=True, seed=0)
    assert (
        PromptLoader(ten_prompts, batch_size=16, shuffle=False, seed=0, drop_last=False).batches_per_epoch
        == 1
    )
