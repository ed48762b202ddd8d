"""examples/tiny_model.py beside real tokenizers of three families and one built here: each model folder has
the tokenizer's own architecture, and relm's prompt ids (its loader and dataset) are the ids the tokenizer
folder alone gives with its chat template (issue 37: a Qwen2 config.json made transformers re-tokenize
Llama-3.2 digit by digit and Phi-3 with `<0x00>` bytes, and nothing noticed). A chat template that refuses
a role ends in one `error:` line naming the row and `custom_chat_template`."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from relm.data.dataset import PromptDataset
from relm.errors import UserError
from relm.models.tokenizer import load_tokenizer

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "tiny_model.py"
REALWORLD = Path(__file__).resolve().parents[3] / "shared" / "realworld" / "tokenizers"
PROMPTS = [
    [{"role": "user", "content": "What is 1234567 times 3?  Answer  in  words, please."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " It costs 48 dollars."}],
]
LLAMA_KWARGS = {"date_string": "26 Jul 2024"}
"""Llama 3's template writes today's date unless given one."""

GEMMA_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'assistant' %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)
"""Gemma-2's chat template: it refuses a system message."""


def tiny_model_main() -> Any:
    spec = importlib.util.spec_from_file_location("tiny_model", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def gemma_like_tokenizer(folder: Path) -> Path:
    """A word-level tokenizer with Gemma-2's turn tokens and template, declaring its own class."""
    words = [
        "What",
        "is",
        "1234567",
        "times",
        "3?",
        "Answer",
        "in",
        "words,",
        "please.",
        "Be",
        "brief.",
        "It",
        "costs",
        "48",
        "dollars.",
        "user",
        "model",
    ]
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    vocab = {token: i for i, token in enumerate([*specials, *dict.fromkeys(words)])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )
    tokenizer.add_special_tokens({"additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"]})
    tokenizer.chat_template = GEMMA_TEMPLATE
    tokenizer.save_pretrained(folder)
    declared = json.loads((folder / "tokenizer_config.json").read_text())
    assert declared["tokenizer_class"] in ("PreTrainedTokenizerFast", "TokenizersBackend"), declared
    return folder


def prompt_ids(model_dir: Path, tmp_path: Path, prompts: list[list[dict[str, str]]], **kwargs: str) -> list:
    """The prompt ids relm trains on: its tokenizer loader, then its dataset over a verl-layout parquet."""
    data = tmp_path / "prompts.parquet"
    rows = [{"prompt": p, "data_source": "x", "reward_model": {"ground_truth": "1"}} for p in prompts]
    pq.write_table(pa.Table.from_pylist(rows), data)
    tokenizer = load_tokenizer(str(model_dir))
    dataset = PromptDataset([str(data)], tokenizer, max_prompt_length=512, chat_template_kwargs=kwargs)
    return [dataset[i]["prompt_ids"] for i in range(len(dataset))]


@pytest.mark.parametrize(
    ("folder", "architecture"),
    [("llama3.2", "LlamaForCausalLM"), ("phi3", "Phi3ForCausalLM"), ("mistral-nemo", "MistralForCausalLM")],
)
def test_a_real_tokenizer_gets_its_family_and_its_own_ids(tmp_path: Path, folder: str, architecture: str):
    source = REALWORLD / folder
    if not source.is_dir():
        pytest.skip(f"{REALWORLD} is not on this machine")
    out = tmp_path / "model"
    assert tiny_model_main()(["--tokenizer", str(source), "--output", str(out), "--hidden", "32"]) == 0
    assert json.loads((out / "config.json").read_text())["architectures"] == [architecture]
    kwargs = LLAMA_KWARGS if folder == "llama3.2" else {}
    declared = AutoTokenizer.from_pretrained(source)  # the folder alone: the class it declares
    expected = [
        list(
            declared.apply_chat_template(
                p, add_generation_prompt=True, tokenize=True, return_dict=False, **kwargs
            )
        )
        for p in PROMPTS
    ]
    assert prompt_ids(out, tmp_path, PROMPTS, **kwargs) == expected


def test_a_family_made_here_gets_gemma2_and_its_own_ids(tmp_path: Path):
    source = gemma_like_tokenizer(tmp_path / "tokenizer")
    out = tmp_path / "model"
    assert tiny_model_main()(["--tokenizer", str(source), "--output", str(out), "--hidden", "32"]) == 0
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Gemma2ForCausalLM"]
    declared = AutoTokenizer.from_pretrained(source)
    user_only = [PROMPTS[0]]
    expected = [
        declared.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=False)
        for p in user_only
    ]
    assert prompt_ids(out, tmp_path, user_only) == [list(ids) for ids in expected]
    # The system message is refused by the template: one line naming the row and the key to fix it.
    with pytest.raises(UserError) as refused:
        prompt_ids(out, tmp_path, PROMPTS)
    message = str(refused.value)
    assert "row 1" in message and "System role not supported" in message, message
    assert "actor_rollout_ref.model.custom_chat_template" in message and "\n" not in message


def test_a_tokenizer_of_no_known_family_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture):
    source = tmp_path / "tokenizer"
    backend = Tokenizer(models.WordLevel({"<unk>": 0, "hello": 1}, unk_token="<unk>"))
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<unk>").save_pretrained(
        source
    )
    assert tiny_model_main()(["--tokenizer", str(source), "--output", str(tmp_path / "model")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "--architecture" in err and "\n" not in err
    assert not (tmp_path / "model").exists()


def test_a_config_of_another_family_does_not_change_the_tokenizer(tmp_path: Path, caplog):
    """A Qwen2 config.json beside a Gemma-like tokenizer: transformers alone loads a Qwen2Tokenizer; relm
    loads the declared class, encodes as the tokenizer folder alone does, and says the two disagree."""
    from transformers import Qwen2Config

    folder = gemma_like_tokenizer(tmp_path / "model")
    Qwen2Config(vocab_size=16, hidden_size=8, num_hidden_layers=1, num_attention_heads=1).save_pretrained(
        folder
    )
    assert type(AutoTokenizer.from_pretrained(folder)).__name__ == "Qwen2Tokenizer"
    with caplog.at_level("WARNING", logger="relm.models.tokenizer"):
        ids = prompt_ids(folder, tmp_path, [PROMPTS[0]])
    declared = gemma_like_tokenizer(tmp_path / "alone")
    expected = AutoTokenizer.from_pretrained(declared).apply_chat_template(
        PROMPTS[0], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert ids == [list(expected)]
    assert any(
        "gemma2 tokenizer" in r.getMessage() and "model_type is qwen2" in r.getMessage()
        for r in caplog.records
    )
