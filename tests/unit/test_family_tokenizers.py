"""The real tokenizers shipped with relm (Qwen2.5, Phi-3, Mistral-Nemo) and the zoo entries that carry them."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from relm.models.cache import COMPLETE_MARKER
from relm.models.family_tokenizers import FAMILIES, FILES_DIR, tokenizer_folder
from relm.models.tokenizer import encode_prompt, load_tokenizer
from relm.models.zoo import ZOO, materialize_zoo, zoo_config, zoo_entry

REALWORLD = Path(__file__).resolve().parents[3] / "shared" / "realworld" / "tokenizers"
QUESTION = [
    {
        "role": "user",
        "content": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in "
        "May. How many clips did Natalia sell altogether in April and May?",
    }
]


def _realworld(family: str) -> Path:
    folder = REALWORLD / family
    if not folder.is_dir():
        pytest.skip(f"{folder} is not on this machine")
    return folder


@pytest.mark.parametrize("family", FAMILIES)
def test_unpacked_files_are_the_real_ones_with_license_and_source(family, tmp_path):
    folder = tokenizer_folder(family, tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "SOURCE.txt"):
        assert (folder / name).read_bytes() == (_realworld(family) / name).read_bytes(), name
    license_text = (folder / "LICENSE").read_text()
    assert ("MIT License" if family == "phi3" else "Apache License") in license_text
    stamp = (folder / "tokenizer.json").stat().st_mtime_ns
    assert tokenizer_folder(family, tmp_path) == folder and (folder / COMPLETE_MARKER).is_file()
    assert (folder / "tokenizer.json").stat().st_mtime_ns == stamp  # unpacked once
    assert [path.name for path in folder.parent.iterdir()] == [folder.name]  # no staging folder left


def test_the_package_ships_no_llama_files_and_keeps_each_compressed():
    assert sorted(path.name for path in FILES_DIR.iterdir()) == sorted(FAMILIES)
    for family in FAMILIES:
        names = {path.name for path in (FILES_DIR / family).iterdir()}
        assert {"tokenizer.json.xz", "tokenizer_config.json", "LICENSE", "SOURCE.txt"} <= names
        assert "tokenizer.json" not in names
    assert sum(path.stat().st_size for path in FILES_DIR.rglob("*")) < 4_000_000


# Every token has a row; the rows beyond are the published padding of the embedding (Qwen2.5-7B: 152,064).
TOKENS_AND_ROWS = {"qwen2.5": (151665, 151936), "phi3": (32011, 32064), "mistral-nemo": (131072, 131072)}


def test_full_size_entries_of_a_shipped_family_carry_its_tokenizer_and_its_ids():
    carried = {name: entry.tokenizer_family for name, entry in ZOO.items() if entry.tokenizer_family}
    assert carried == {
        "Qwen/Qwen2.5-0.5B": "qwen2.5",
        "Qwen/Qwen2.5-1.5B": "qwen2.5",
        "Qwen/Qwen2.5-0.5B-Instruct": "qwen2.5",
        "Qwen/Qwen2.5-1.5B-Instruct": "qwen2.5",
        "Qwen/Qwen2.5-3B-Instruct": "qwen2.5",
        "Qwen/Qwen2.5-7B-Instruct": "qwen2.5",
        "microsoft/Phi-3-mini-4k-instruct": "phi3",
        "microsoft/Phi-3-medium-4k-instruct": "phi3",
        "mistralai/Mistral-Nemo-Instruct-2407": "mistral-nemo",
    }
    for name, family in carried.items():
        tokenizer = zoo_entry(f"zoo:{name}").tokenizer()
        config = zoo_config(f"zoo:{name}")
        length, rows = TOKENS_AND_ROWS[family]
        assert len(tokenizer) == length and config.vocab_size in (rows, 152064), name
        assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (
            tokenizer.bos_token_id,
            tokenizer.eos_token_id,
            tokenizer.pad_token_id,
        ), name


def test_tiny_zoo_keeps_its_small_tokenizers():
    assert all(entry.tokenizer_family is None for name, entry in ZOO.items() if name.startswith("tiny/"))
    assert len(zoo_entry("zoo:tiny/qwen2").tokenizer()) == 101


def test_a_materialized_qwen25_entry_holds_the_real_tokenizer_and_encodes_as_it(tmp_path):
    folder = materialize_zoo("zoo:Qwen/Qwen2.5-0.5B-Instruct", cache_dir=tmp_path)
    real = _realworld("qwen2.5")
    assert (folder / "tokenizer.json").read_bytes() == (real / "tokenizer.json").read_bytes()
    assert (folder / "LICENSE").is_file() and (folder / "SOURCE.txt").is_file()
    tokenizer = load_tokenizer(str(folder))
    expected = AutoTokenizer.from_pretrained(real).apply_chat_template(
        QUESTION, add_generation_prompt=True, tokenize=True
    )
    expected = expected if isinstance(expected, list) else expected["input_ids"]
    assert encode_prompt(tokenizer, QUESTION) == list(expected)
    assert tokenizer.decode(expected[-3:]) == "<|im_start|>assistant\n"
