"""`relm compat`'s tokenizer stage on the four real tokenizers (../shared/realworld): a tiny random model with
each family's published vocabulary, written with the family's tokenizer files, reports the pad token (and
relm's choice where the family names none), eos and end-of-turn tokens, the rendered template and the
tokenizer's length against the embedding rows."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    LlamaConfig,
    MistralConfig,
    Phi3Config,
    Qwen2Config,
)

from relm.compat.checks import CompatOptions, check_model
from relm.compat.cli import main
from relm.compat.report import to_markdown
from relm.compat.tokenizer_facts import facts_lines

REALWORLD = Path(__file__).resolve().parents[3] / "shared" / "realworld" / "tokenizers"

# config class, embedding rows of the published checkpoints, generation_config.json's eos (None: the
# tokenizer's). Llama-3.2-Instruct publishes three stop ids; its tokenizer names one.
FAMILIES = {
    "qwen2.5": (Qwen2Config, 151936, None),
    "phi3": (Phi3Config, 32064, None),
    "mistral-nemo": (MistralConfig, 131072, None),
    "llama3.2": (LlamaConfig, 128256, [128001, 128008, 128009]),
}


def tiny_model_with_real_tokenizer(family: str, folder: Path) -> Path:
    """A 1-layer random model with `family`'s vocabulary size and special-token ids, the family's tokenizer
    files copied beside it as published, and a generation_config.json."""
    source = REALWORLD / family
    if not source.is_dir():
        pytest.skip(f"{source} is not on this machine")
    config_class, rows, generation_eos = FAMILIES[family]
    for file in source.iterdir():
        shutil.copyfile(file, folder / file.name)
    # The special tokens' ids as the files name them (parsing the JSON is seconds cheaper than loading).
    named = json.loads((source / "tokenizer_config.json").read_text())
    added = {
        token["content"]: token["id"]
        for token in json.loads((source / "tokenizer.json").read_text())["added_tokens"]
    }
    ids = {f"{kind}_token_id": added.get(named.get(f"{kind}_token")) for kind in ("bos", "eos", "pad")}
    config = config_class(
        vocab_size=rows,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        **ids,
    )
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config = GenerationConfig(
        bos_token_id=ids["bos_token_id"], eos_token_id=generation_eos or ids["eos_token_id"]
    )
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def facts(tmp_path_factory):
    """The tokenizer stage's report for each family (built once: the four tokenizers take seconds to load)."""
    reports = {}
    for family in FAMILIES:
        folder = tiny_model_with_real_tokenizer(family, tmp_path_factory.mktemp(family))
        reports[family] = check_model(str(folder), CompatOptions(device="cpu", tokenizer_only=True))
    return reports


def test_every_family_passes_the_tokenizer_stage_and_skips_the_rest(facts):
    for family, report in facts.items():
        assert [(stage.name, stage.status) for stage in report.stages] == [
            ("tokenizer", "pass"),
            ("load", "skipped"),
            ("rollout", "skipped"),
            ("update", "skipped"),
        ], family
        assert report.tokenizer.prompt_matches_template, family
        assert report.tokenizer.template_error is None


def test_qwen25_pads_with_endoftext_and_has_271_rows_no_token_reaches(facts):
    qwen = facts["qwen2.5"].tokenizer
    assert (qwen.length, qwen.embedding_rows, qwen.unreachable_rows) == (151665, 151936, 271)
    assert (qwen.pad_token, qwen.pad_token_id, qwen.pad_chosen_by_relm) == ("<|endoftext|>", 151643, False)
    assert (qwen.bos_token, qwen.eos_token, qwen.eos_token_id) == (None, "<|im_end|>", 151645)
    assert qwen.end_of_turn_tokens == ["<|im_end|>"]
    # The template writes Qwen's default system turn when the conversation has none.
    assert qwen.rendered == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_phi3_ends_a_turn_on_end_while_its_eos_is_endoftext(facts):
    phi3 = facts["phi3"].tokenizer
    assert (phi3.length, phi3.embedding_rows) == (32011, 32064)
    assert (phi3.eos_token, phi3.pad_token, phi3.pad_chosen_by_relm) == (
        "<|endoftext|>",
        "<|endoftext|>",
        False,
    )
    assert dict(zip(phi3.end_of_turn_tokens, phi3.end_of_turn_ids, strict=True)) == {
        "<|endoftext|>": 32000,
        "<|end|>": 32007,
    }
    assert phi3.rendered == "<|user|>\nWhat is 2 + 3?<|end|>\n<|assistant|>\n"


def test_mistral_nemo_names_no_pad_so_relm_picks_its_pad_named_special_token(facts):
    nemo = facts["mistral-nemo"]
    assert (nemo.tokenizer.length, nemo.tokenizer.embedding_rows) == (131072, 131072)
    assert (nemo.tokenizer.pad_token, nemo.tokenizer.pad_token_id, nemo.tokenizer.pad_chosen_by_relm) == (
        "<pad>",
        10,
        True,
    )
    assert "pad token '<pad>' (id 10): the tokenizer names none" in nemo.decisions
    # The template writes the bos itself; the prompt ids hold it once.
    assert nemo.tokenizer.rendered == "<s>[INST]What is 2 + 3?[/INST]"
    assert nemo.tokenizer.end_of_turn_tokens == ["</s>"]


def test_llama32_stops_on_the_generation_configs_three_ids_and_pads_with_finetune_right_pad(facts):
    llama = facts["llama3.2"].tokenizer
    assert (llama.length, llama.embedding_rows, llama.unreachable_rows) == (128256, 128256, 0)
    assert (llama.pad_token, llama.pad_chosen_by_relm) == ("<|finetune_right_pad_id|>", True)
    assert llama.generation_config_eos_ids == [128001, 128008, 128009]
    assert llama.end_of_turn_tokens == ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"]
    assert llama.rendered.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>")
    assert llama.rendered.endswith(
        "What is 2 + 3?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_facts_reach_the_console_lines_json_and_markdown(facts):
    report = facts["phi3"]
    lines = facts_lines(report.tokenizer)
    assert lines[0] == "tokenizer " + report.tokenizer.tokenizer_class + (
        ": 32,011 tokens, 32,064 embedding rows (53 rows no token reaches)"
    )
    assert "a response ends at: '<|endoftext|>' (32000), '<|end|>' (32007)" in lines
    assert report.to_dict()["tokenizer"]["end_of_turn_ids"] == [32000, 32007]
    markdown = to_markdown([report], "t")
    assert "Tokenizer facts:" in markdown and "32,011 / 32,064" in markdown


def test_too_few_embedding_rows_fails_the_tokenizer_stage(tmp_path):
    folder = tiny_model_with_real_tokenizer("phi3", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"vocab_size": 32000}))
    report = check_model(str(folder), CompatOptions(device="cpu", tokenizer_only=True))
    assert (report.status, report.failed_stage) == ("fail", "tokenizer")
    assert report.stage("tokenizer").error == "tokenizer has 32011 tokens but the embedding only 32000 rows"


def test_cli_tokenizer_only_on_the_zoos_qwen25_instruct(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RELM_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    assert (
        main(["zoo:Qwen/Qwen2.5-0.5B-Instruct", "--tokenizer-only", "--device", "cpu", "--out", str(out)])
        == 0
    )
    printed = capsys.readouterr().out
    assert (
        "tokenizer Qwen2Tokenizer: 151,665 tokens, 151,936 embedding rows (271 rows no token reaches)"
        in printed
    )
    (report,) = json.loads((out / "compat.json").read_text())["models"]
    assert (
        report["tokenizer"]["pad_token"] == "<|endoftext|>" and report["tokenizer"]["eos_token_id"] == 151645
    )
    assert (
        "| zoo:Qwen/Qwen2.5-0.5B-Instruct | Qwen2Tokenizer | 151,665 / 151,936 |"
        in (out / "compat.md").read_text()
    )
