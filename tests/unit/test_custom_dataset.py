"""`data.custom_cls`: a user's verl dataset class is loaded and checked, and its items become relm's rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from relm.data.custom_dataset import custom_rows, load_dataset_class
from relm.errors import UserError

SOURCE = """
from torch.utils.data import Dataset


class Rows(Dataset):
    def __init__(self, data_files, tokenizer, config, processor=None):
        self.files, self.key = data_files, config.prompt_key

    def __len__(self):
        return 2

    def __getitem__(self, index):
        if index == 0:
            return {"raw_prompt": [{"role": "user", "content": "hi"}], "data_source": "s",
                    "reward_model": {"ground_truth": "7"}, "extra_info": {"i": 0}}
        return {self.key: "plain text", "reward_model": None}


class NoPrompt(Rows):
    def __getitem__(self, index):
        return {"data_source": "s"}


class NotADataset:
    def __init__(self, data_files, tokenizer, config, processor):
        pass
"""


def _file(tmp_path: Path, text: str = SOURCE) -> str:
    path = tmp_path / "mine.py"
    path.write_text(text)
    return str(path)


def test_items_become_rows_with_verls_fields(tmp_path: Path):
    cls = load_dataset_class(_file(tmp_path), "Rows")
    rows = custom_rows(
        cls, ["a.parquet"], None, {"prompt_key": "question"}, max_samples=-1, prompt_key="question",
        reward_fn_key="data_source",
    )  # fmt: skip
    assert rows == [
        {"raw_prompt": [{"role": "user", "content": "hi"}], "data_source": "s", "ground_truth": "7",
         "extra_info": {"i": 0}},
        {"raw_prompt": "plain text", "data_source": "unknown", "ground_truth": None, "extra_info": {}},
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("Rows", "import nowhere_such_module\n", "importing it failed (ModuleNotFoundError"),
        ("NotADataset", SOURCE, "`data.custom_cls.name=NotADataset`: must subclass torch.utils.data.Dataset"),
        ("Missing", SOURCE, "`data.custom_cls.name=Missing`: "),
    ],
)
def test_a_class_that_does_not_fit_is_one_line(tmp_path: Path, name: str, text: str, message: str):
    with pytest.raises(UserError) as err:
        load_dataset_class(_file(tmp_path, text), name)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_an_item_without_a_prompt_names_the_item(tmp_path: Path):
    cls = load_dataset_class(_file(tmp_path), "NoPrompt")
    with pytest.raises(UserError, match=r"item 0 has neither `raw_prompt` nor `prompt`"):
        custom_rows(
            cls, [], None, {"prompt_key": "prompt"}, max_samples=-1, prompt_key="prompt", reward_fn_key="x"
        )


def test_prompt_dataset_renders_the_classes_rows_and_draws_max_samples_when_the_class_does_not(
    tmp_path: Path,
):
    from relm.data.dataset import PromptDataset
    from relm.models.char_tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    common = dict(
        max_prompt_length=64, custom_cls=(_file(tmp_path), "Rows"), verl_config={"prompt_key": "prompt"}
    )
    whole = PromptDataset(["ignored.parquet"], tok, **common)
    assert [item["ground_truth"] for item in whole] == ["7", None]
    assert whole[1]["raw_prompt"] == [{"role": "user", "content": "plain text"}] and whole[0]["prompt_ids"]
    assert len(PromptDataset(["ignored.parquet"], tok, max_samples=1, **common)) == 1  # `Rows` takes none


def test_a_plus_key_on_the_command_line_reaches_the_classes_config(tmp_path: Path):
    """verl hands its whole `data` section to the class, keys added with Hydra's `+` included."""
    from relm.config.loader import load_config
    from relm.config.translate import translate
    from relm.data.dataset import PromptDataset
    from relm.models.char_tokenizer import build_char_tokenizer

    path = _file(tmp_path, SOURCE + """

class ReadsItsConfig(Rows):
    def __getitem__(self, index):
        item = super().__getitem__(0)
        return dict(item, extra_info={"min_response_length": self.config.min_response_length})

    def __init__(self, data_files, tokenizer, config, processor=None):
        super().__init__(data_files, tokenizer, config, processor)
        self.config = config
""")  # fmt: skip
    spec = translate(load_config([
        f"data.custom_cls.path={path}", "data.custom_cls.name=ReadsItsConfig", "+data.min_response_length=96",
    ]))[0].data  # fmt: skip
    dataset = PromptDataset(
        ["ignored.parquet"], build_char_tokenizer(), max_prompt_length=64, custom_cls=spec.custom_cls,
        verl_config=spec.verl_config,
    )  # fmt: skip
    assert [item["extra_info"] for item in dataset] == [{"min_response_length": 96}] * 2
