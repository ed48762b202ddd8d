"""The character tokenizer, tokenizer preflight and the model zoo."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from relm.data.demo_task import DEMO_PROMPT_TOKENS
from relm.errors import UserError
from relm.models.cache import publish_folder as _publish
from relm.models.char_tokenizer import build_char_tokenizer
from relm.models.registry import inspect_model_architecture
from relm.models.tokenizer import (
    encode_prompt,
    load_tokenizer,
    preflight_tokenizer,
)
from relm.models.zoo import COMPLETE_MARKER, ZOO, is_zoo_path, materialize_zoo, zoo_config

CHATML_PROMPT = "<|im_start|>user\nk<|im_end|>\n<|im_start|>assistant\n"


def _word_tokenizer(specials: list[str], **roles: str) -> PreTrainedTokenizerFast:
    """A tokenizer over a few words whose only special tokens are `specials` (roles name some)."""
    vocab = {token: i for i, token in enumerate([*specials, "hello", "world"])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=roles.get("unk_token")))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens(specials)
    return PreTrainedTokenizerFast(tokenizer_object=backend, **roles)


# --- character tokenizer ---------------------------------------------------------------------------


def test_char_tokenizer_is_small_one_token_per_character_and_round_trips():
    tokenizer = build_char_tokenizer()
    text = "Hello,  world!\n  {x: [1, 2]} ~|<>#"
    ids = tokenizer.encode(text, add_special_tokens=True)
    assert len(tokenizer) == 101 < 128
    assert len(ids) == len(text)  # nothing added, one id per character
    assert tokenizer.decode(ids) == text
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 3)
    assert tokenizer.eos_token == "<|im_end|>"


def test_chat_template_renders_chatml_with_generation_prompt():
    tokenizer = build_char_tokenizer()
    ids = encode_prompt(tokenizer, [{"role": "user", "content": "k"}])
    assert tokenizer.decode(ids) == CHATML_PROMPT
    # <|im_start|> "user\n" "k" <|im_end|> "\n" <|im_start|> "assistant\n" = 1+5+1+1+1+1+10
    assert len(ids) == 20 == DEMO_PROMPT_TOKENS
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")


def test_custom_chat_template_replaces_the_tokenizers_own():
    tokenizer = build_char_tokenizer()
    template = "{% for m in messages %}{{ m['role'] }}:{{ m['content'] }};{% endfor %}"
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    assert tokenizer.decode(encode_prompt(tokenizer, messages, template)) == "system:s;user:q;"


def test_prompt_without_any_template_joins_contents_by_newline():
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = None
    ids = encode_prompt(tokenizer, [{"role": "system", "content": "ab"}, {"role": "user", "content": "c"}])
    assert tokenizer.decode(ids) == "ab\nc"


# --- preflight -------------------------------------------------------------------------------------


def test_missing_pad_falls_back_to_unk_with_a_warning(caplog):
    tokenizer = _word_tokenizer(["<eos>", "<unk>"], eos_token="<eos>", unk_token="<unk>")
    with caplog.at_level(logging.WARNING, logger="relm.models.tokenizer"):
        preflight_tokenizer(tokenizer, name="mine")
    assert tokenizer.pad_token == "<unk>" and tokenizer.pad_token_id == 1
    assert "no pad token" in caplog.text and "'<unk>' (id 1)" in caplog.text and "mine" in caplog.text


def test_pad_fallback_prefers_a_pad_named_token_then_reserved_then_eos():
    named = _word_tokenizer(["<|eot|>", "<|reserved_1|>", "<|finetune_right_pad_id|>"], eos_token="<|eot|>")
    assert preflight_tokenizer(named).pad_token == "<|finetune_right_pad_id|>"
    reserved = _word_tokenizer(["<|eot|>", "<|reserved_1|>"], eos_token="<|eot|>")
    assert preflight_tokenizer(reserved).pad_token == "<|reserved_1|>"
    only_eos = _word_tokenizer(["<|eot|>"], eos_token="<|eot|>")
    assert preflight_tokenizer(only_eos).pad_token == "<|eot|>"
    bare = _word_tokenizer([])
    assert preflight_tokenizer(bare).pad_token_id == 0  # "hello": any id does, the mask hides it


def test_missing_eos_and_template_warn_once_and_do_not_crash(caplog):
    tokenizer = _word_tokenizer(["<unk>"], unk_token="<unk>")
    with caplog.at_level(logging.WARNING, logger="relm.models.tokenizer"):
        preflight_tokenizer(tokenizer)
    assert "no eos token" in caplog.text
    assert sum("no chat template" in record.message for record in caplog.records) == 1
    assert encode_prompt(tokenizer, [{"role": "user", "content": "hello world"}]) == [1, 2]


def test_load_tokenizer_reloads_a_saved_folder_and_repairs_its_pad(tmp_path, caplog):
    tokenizer = build_char_tokenizer()
    tokenizer.pad_token = None  # the folder's config then names no pad, but <|pad|> is still a special token
    tokenizer.save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING, logger="relm.models.tokenizer"):
        loaded = load_tokenizer(str(tmp_path))
    assert loaded.pad_token == "<|pad|>" and loaded.pad_token_id == 0
    assert "no pad token" in caplog.text
    assert loaded.decode(encode_prompt(loaded, [{"role": "user", "content": "k"}])) == CHATML_PROMPT


def test_load_tokenizer_errors_name_the_path(tmp_path):
    with pytest.raises(UserError, match=r"'/no/such/tokenizer' does not exist.*tokenizer_path"):
        load_tokenizer("/no/such/tokenizer")
    with pytest.raises(UserError, match=rf"cannot load a tokenizer from '{tmp_path}'"):
        load_tokenizer(str(tmp_path))  # a folder, but no tokenizer files in it


# --- zoo -------------------------------------------------------------------------------------------


def test_zoo_paths_and_unknown_names():
    assert is_zoo_path("zoo:tiny/qwen2") and not is_zoo_path("Qwen/Qwen2.5-0.5B") and not is_zoo_path(None)
    with pytest.raises(UserError, match=r"unknown zoo model 'zoo:tiny/nope'; known: .*zoo:tiny/qwen2"):
        materialize_zoo("zoo:tiny/nope")


def test_tiny_configs_match_the_char_tokenizer():
    tokenizer = build_char_tokenizer()
    for name, model_type in (("tiny/qwen2", "qwen2"), ("tiny/llama", "llama")):
        config = zoo_config(f"zoo:{name}")
        assert config.model_type == model_type
        assert (config.num_hidden_layers, config.hidden_size, config.intermediate_size) == (2, 64, 128)
        assert (config.num_attention_heads, config.num_key_value_heads) == (4, 2)
        assert config.vocab_size == len(tokenizer) and config.tie_word_embeddings
        assert config.max_position_embeddings == 256
        assert (config.pad_token_id, config.bos_token_id, config.eos_token_id) == (0, 1, 3)
    hd64 = zoo_config("zoo:tiny/qwen2-hd64")
    assert hd64.hidden_size // hd64.num_attention_heads == 64


@pytest.mark.parametrize(
    ("name", "num_params"),
    [
        # embed 151936*896 + 24 * (q,o 2*896^2 + k,v 2*896*128 + biases 896+2*128 + mlp 3*896*4864
        # + norms 2*896) + final norm 896 = 136,134,656 + 24 * 14,912,384 + 896 (tied lm_head)
        ("Qwen/Qwen2.5-0.5B", 494_032_768),
        # 151936*1536 + 28 * (2*1536^2 + 2*1536*256 + 1536+512 + 3*1536*8960 + 2*1536) + 1536
        ("Qwen/Qwen2.5-1.5B", 1_543_714_304),
        # 128256*2048 + 16 * (2*2048^2 + 2*2048*512 + 3*2048*8192 + 2*2048) + 2048 (no biases)
        ("meta-llama/Llama-3.2-1B", 1_235_814_400),
        # 151936*2048 + 36 * (2*2048^2 + 2*2048*256 + 2048+512 + 3*2048*11008 + 2*2048) + 2048
        ("Qwen/Qwen2.5-3B-Instruct", 3_085_938_688),
        # 2*152064*3584 (untied) + 28 * (2*3584^2 + 2*3584*512 + 3584+1024 + 3*3584*18944 + 2*3584) + 3584
        ("Qwen/Qwen2.5-7B-Instruct", 7_615_616_512),
        # 128256*3072 + 28 * (2*3072^2 + 2*3072*1024 + 3*3072*8192 + 2*3072) + 3072
        ("meta-llama/Llama-3.2-3B-Instruct", 3_212_749_824),
        # 2*32064*3072 + 32 * (qkv 3072*9216 + o 3072^2 + gate_up 3072*16384 + down 8192*3072 + 2*3072) + 3072
        ("microsoft/Phi-3-mini-4k-instruct", 3_821_079_552),
        # 2*32064*5120 + 40 * (5120*7680 + 5120^2 + 5120*35840 + 17920*5120 + 2*5120) + 5120
        ("microsoft/Phi-3-medium-4k-instruct", 13_960_238_080),
        # 256000*2304 + 26 * (q 2304*2048 + k,v 2*2304*1024 + o 2048*2304 + 3*2304*9216 + 4 norms*2304) + 2304
        ("google/gemma-2-2b-it", 2_614_341_888),
        # 256000*3584 + 42 * (3584*4096 + 2*3584*2048 + 4096*3584 + 3*3584*14336 + 4*3584) + 3584
        ("google/gemma-2-9b-it", 9_241_705_984),
        # 2*32002*4096 + 32 * (2*4096^2 + 2*4096*1024 + 3*4096*14336 + 2*4096) + 4096
        ("berkeley-nest/Starling-LM-7B-alpha", 7_241_748_480),
        # 2*151936*2048 + 24 * (3*(2048^2+2048) + 2048^2 + router 2048*60 + experts 60*3*2048*1408
        #   + shared 3*2048*5632 + shared gate 2048 + 2*2048) + 2048
        ("Qwen/Qwen1.5-MoE-A2.7B", 14_315_784_192),
        # 2*32000*4096 + 32 * (2*4096^2 + 2*4096*1024 + 8*3*4096*14336 + router 4096*8 + 2*4096) + 4096
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", 46_702_792_704),
        # 2*64000*4096 + 32 * (2*4096^2 + 2*4096*512 + 3*4096*11008 + 2*4096) + 4096
        ("01-ai/Yi-1.5-6B-Chat", 6_061_035_520),
        # 2*102400*4096 + 30 * (4*4096^2 (MHA) + 3*4096*11008 + 2*4096) + 4096
        ("deepseek-ai/deepseek-llm-7b-chat", 6_910_365_696),
        # 2*32768*4096 + 32 * (2*4096^2 + 2*4096*1024 + 3*4096*14336 + 2*4096) + 4096
        ("mistralai/Mistral-7B-Instruct-v0.3", 7_248_023_552),
        # 151936*1024 (tied) + 28 * (q 1024*2048 + k,v 2*1024*1024 + o 2048*1024 + 3*1024*3072
        #   + 2*1024 norms + q/k norms 2*128) + 1024
        ("Qwen/Qwen3-0.6B", 596_049_920),
        # 151936*2560 + 36 * (2560*4096 + 2*2560*1024 + 4096*2560 + 3*2560*9728 + 2*2560 + 2*128) + 2560
        ("Qwen/Qwen3-4B", 4_022_468_096),
        # 262144*1152 + 26 * (1152*1024 + 2*1152*256 + 1024*1152 + 3*1152*6912 + 4*1152 + 2*256) + 1152
        ("google/gemma-3-1b-it", 999_885_952),
        # 2*151936*2048 + 48 * (2048*4096 + 2*2048*512 + 4096*2048 + router 2048*128
        #   + 128 experts 3*2048*768 + 2*2048 + 2*128) + 2048
        ("Qwen/Qwen3-30B-A3B", 30_532_122_624),
        # 2*32064*4096 + lm_head bias 32064 + 32 * (q,o 2*(4096^2+4096) + k,v 2*(4096*1024+1024)
        #   + router 4096*16 + 16 experts 3*4096*6400 + 2 LayerNorms 2*2*4096) + final LayerNorm 2*4096
        ("microsoft/Phi-3.5-MoE-instruct", 41_873_153_344),
        # 2*102400*2048 + 27 * (q 2048*16*192 + kv_a 2048*(512+64) + kv_a norm 512 + kv_b 512*16*256
        #   + o 16*128*2048 + 2*2048) + layer 0 dense 3*2048*10944
        #   + 26 * (router 64*2048 + 64 experts 3*2048*1408 + 2 shared 3*2048*2816) + 2048
        ("deepseek-ai/DeepSeek-V2-Lite-Chat", 15_706_484_224),
        # 2*50304*2048 + 16 * (4*2048^2 + q/k norms 2*2048 + router 2048*64 + 64 experts 3*2048*1024
        #   + 2*2048) + 2048
        ("allenai/OLMoE-1B-7B-0924", 6_919_161_856),
        # 2*131072*5120 (untied) + 40 * (q 5120*4096 + k,v 2*5120*1024 + o 4096*5120 + 3*5120*14336
        #   + 2*5120) + 5120
        ("mistralai/Mistral-Nemo-Instruct-2407", 12_247_782_400),
    ],
)
def test_full_size_zoo_shapes_have_the_published_parameter_counts(name, num_params):
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(zoo_config(f"zoo:{name}"))
    assert sum(p.numel() for p in model.parameters()) == num_params


def test_materialize_writes_a_loadable_folder_and_reuses_it(tmp_path):
    folder = materialize_zoo("zoo:tiny/qwen2", cache_dir=tmp_path)
    assert folder.parent == tmp_path / "zoo" / "tiny" / "qwen2"
    for file in (
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        COMPLETE_MARKER,
    ):
        assert (folder / file).is_file(), file
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert materialize_zoo("zoo:tiny/qwen2", cache_dir=tmp_path) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not rewritten
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # no staging folder left behind

    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = load_tokenizer(str(folder))
    ids = torch.tensor([encode_prompt(tokenizer, [{"role": "user", "content": "a"}])])
    assert model(ids).logits.shape == (1, 20, 101)
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id == 3


def test_materialize_is_deterministic_per_seed_and_leaves_global_rng_alone(tmp_path):
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    first = load_file(
        materialize_zoo("zoo:tiny/llama", cache_dir=tmp_path / "a", seed=0) / "model.safetensors"
    )
    assert torch.equal(torch.rand(3), expected_next)
    again = load_file(
        materialize_zoo("zoo:tiny/llama", cache_dir=tmp_path / "b", seed=0) / "model.safetensors"
    )
    other = load_file(
        materialize_zoo("zoo:tiny/llama", cache_dir=tmp_path / "a", seed=1) / "model.safetensors"
    )
    assert first.keys() == again.keys()
    assert all(torch.equal(first[key], again[key]) for key in first)
    assert not torch.equal(first["model.embed_tokens.weight"], other["model.embed_tokens.weight"])


def test_zoo_cache_comes_from_relm_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RELM_CACHE", str(tmp_path))
    tokenizer = load_tokenizer("zoo:tiny/qwen2")
    assert tokenizer.eos_token == "<|im_end|>"
    assert list((tmp_path / "zoo" / "tiny" / "qwen2").iterdir())


def _staged(parent: Path, name: str, marker: bool = True) -> Path:
    folder = parent / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(name)
    if marker:
        (folder / COMPLETE_MARKER).write_text("")
    return folder


def test_publish_keeps_the_race_winners_folder_and_replaces_a_half_written_one(tmp_path):
    final = _staged(tmp_path, "final")
    _publish(_staged(tmp_path, "loser"), final)
    assert (final / "config.json").read_text() == "final"

    half = _staged(tmp_path, "half", marker=False)
    _publish(_staged(tmp_path, "complete"), half)
    assert (half / "config.json").read_text() == "complete" and (half / COMPLETE_MARKER).is_file()


def test_every_zoo_entry_builds_a_config():
    for name in ZOO:
        # The lookup task's model has its own 16-token vocabulary (relm.models.lookup_tokenizer).
        smallest = 16 if name == "tiny/qwen2-lookup" else len(build_char_tokenizer())
        assert zoo_config(f"zoo:{name}").vocab_size >= smallest


def test_tiny_zoo_shapes_and_family_quirks():
    """Every new tiny entry: 2 layers, head_dim 64, the char vocabulary; the quirks each one exists for."""
    tiny = [
        name
        for name in ZOO
        if name.startswith("tiny/") and name not in ("tiny/qwen2", "tiny/qwen2-lookup", "tiny/llama")
    ]
    assert len(tiny) == 13
    for name in tiny:
        config = zoo_config(f"zoo:{name}")
        # The inspected head_dim: for MLA it is the q/k head (nope + rope), not the config's head_dim.
        head_dim = inspect_model_architecture(config).head_dim
        assert (config.num_hidden_layers, head_dim, config.vocab_size) == (2, 64, 101), name
    assert zoo_config("zoo:tiny/gemma2").attn_logit_softcapping == 50.0
    assert zoo_config("zoo:tiny/mixtral").num_local_experts == 4
    deepseek = zoo_config("zoo:tiny/deepseek-v2")
    assert (deepseek.kv_lora_rank, deepseek.q_lora_rank, deepseek.first_k_dense_replace) == (32, None, 1)
    phimoe = zoo_config("zoo:tiny/phimoe")
    assert phimoe.attention_bias and phimoe.lm_head_bias
    assert zoo_config("zoo:tiny/starling").architectures == ["StarlingLmForCausalLM"]
    for name in ("tiny/gemma2", "tiny/mistral"):
        assert zoo_config(f"zoo:{name}").pad_token_id is None


def test_materialized_quirks_are_in_the_folder(tmp_path):
    gemma = materialize_zoo("zoo:tiny/gemma2", cache_dir=tmp_path)
    assert json.loads((gemma / "tokenizer_config.json").read_text())["pad_token"] is None
    assert load_tokenizer(str(gemma)).pad_token == "<|pad|>"  # the preflight's choice, not the folder's
    starling = materialize_zoo("zoo:tiny/starling", cache_dir=tmp_path)
    written = json.loads((starling / "config.json").read_text())
    assert (written["architectures"], written["model_type"]) == (["StarlingLmForCausalLM"], "mistral")
