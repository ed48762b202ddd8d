"""End-of-turn ids of the four real tokenizers (../shared/realworld) and the built-in one."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer, GenerationConfig

from relm.models.char_tokenizer import build_char_tokenizer
from relm.models.tokenizer import end_of_turn_ids

REALWORLD = Path(__file__).resolve().parents[3] / "shared" / "realworld" / "tokenizers"


@pytest.mark.parametrize(
    ("family", "expected"),
    [
        ("qwen2.5", ["<|im_end|>"]),
        ("llama3.2", ["<|eot_id|>"]),
        # Phi-3 ends a turn with <|end|> while its eos is <|endoftext|>: both stop a response.
        ("phi3", ["<|endoftext|>", "<|end|>"]),
        ("mistral-nemo", ["</s>"]),
    ],
)
def test_real_tokenizers_end_their_turns_where_their_templates_say(family, expected):
    folder = REALWORLD / family
    if not folder.is_dir():
        pytest.skip(f"{folder} is not on this machine")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.convert_ids_to_tokens(end_of_turn_ids(tokenizer)) == expected


def test_generation_config_ids_join_the_tokenizers():
    tokenizer = build_char_tokenizer()
    assert end_of_turn_ids(tokenizer) == [3]
    assert end_of_turn_ids(tokenizer, GenerationConfig(eos_token_id=[7, 3])) == [3, 7]
    assert end_of_turn_ids(tokenizer, GenerationConfig(eos_token_id=9)) == [3, 9]
