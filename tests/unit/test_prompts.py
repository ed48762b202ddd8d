"""Prompt ids as the chat template renders them, `data.apply_chat_template_kwargs`, `data.truncation`, and the
vocabulary clamp shared by the engines' sampler and the trainer's logprobs."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoTokenizer

from relm.config.loader import load_config
from relm.config.translate import translate
from relm.data.dataset import PromptDataset, truncate_prompt
from relm.errors import UserError
from relm.learner.forward import response_logprobs
from relm.models.char_tokenizer import build_char_tokenizer
from relm.models.loading import load_causal_lm
from relm.models.tokenizer import encode_prompt
from relm.models.zoo import materialize_zoo
from relm.rollout.base import SamplingParams
from relm.rollout.hf_engine import HFRolloutEngine
from relm.rollout.native.engine import NativeRolloutEngine
from relm.rollout.sampling import SampledColumns

REALWORLD = Path(__file__).resolve().parents[3] / "shared" / "realworld" / "tokenizers"
QUESTION = [{"role": "user", "content": "Natalia sold clips to 48 of her friends. How many?"}]


def real_tokenizer(family: str) -> Any:
    folder = REALWORLD / family
    if not folder.is_dir():
        pytest.skip(f"{folder} is not on this machine")
    return AutoTokenizer.from_pretrained(folder)


def write_prompts(path: Path, contents: list[str]) -> str:
    rows = [
        {
            "prompt": [{"role": "user", "content": c}],
            "data_source": "src",
            "reward_model": {"ground_truth": "x"},
        }
        for c in contents
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


# --- template ids ----------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["qwen2.5", "llama3.2", "phi3", "mistral-nemo"])
def test_prompt_ids_are_the_templates_ids_with_one_bos(family):
    tokenizer = real_tokenizer(family)
    kwargs = {"date_string": "26 Jul 2024"} if family == "llama3.2" else {}
    expected = tokenizer.apply_chat_template(
        QUESTION, add_generation_prompt=True, tokenize=True, return_dict=False, **kwargs
    )
    ids = encode_prompt(tokenizer, QUESTION, chat_template_kwargs=kwargs)
    assert ids == list(expected)
    if tokenizer.bos_token_id is not None:
        # Rendering to text and encoding it with special tokens gives Llama and Mistral a second bos.
        assert ids.count(tokenizer.bos_token_id) == (1 if ids[0] == tokenizer.bos_token_id else 0)


def test_llama_date_comes_from_the_chat_template_kwargs():
    tokenizer = real_tokenizer("llama3.2")
    dated = encode_prompt(tokenizer, QUESTION, chat_template_kwargs={"date_string": "26 Jul 2024"})
    assert "Today Date: 26 Jul 2024" in tokenizer.decode(dated)
    other = encode_prompt(tokenizer, QUESTION, chat_template_kwargs={"date_string": "01 Jan 2025"})
    assert "Today Date: 01 Jan 2025" in tokenizer.decode(other) and other != dated


def test_template_kwargs_reach_a_custom_template_and_relms_own_arguments_win():
    tokenizer = build_char_tokenizer()
    template = "{{ greeting }}:{% for m in messages %}{{ m['content'] }}{% endfor %};"
    # `tokenize` and `return_dict` would change what comes back; verl drops them from the kwargs too.
    kwargs = {"greeting": "hey", "tokenize": False, "return_dict": True}
    ids = encode_prompt(tokenizer, [{"role": "user", "content": "q"}], template, kwargs)
    assert tokenizer.decode(ids) == "hey:q;"


def test_config_passes_template_kwargs_to_the_dataset(tmp_path):
    path = write_prompts(tmp_path / "p.parquet", ["q"])
    template = "{{ greeting }}|{{ messages[0]['content'] }}"
    cfg = load_config([f"data.train_files={path}", "data.apply_chat_template_kwargs.greeting=hey"])
    assert cfg.data.apply_chat_template_kwargs == {"greeting": "hey"}
    tokenizer = build_char_tokenizer()
    dataset = PromptDataset.from_spec(translate(cfg)[0].data, [path], tokenizer, chat_template=template)
    assert tokenizer.decode(dataset[0]["prompt_ids"]) == "hey|q"


# --- truncation ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("left", [5, 6, 7, 8, 9]),
        ("right", [0, 1, 2, 3, 4]),
        ("middle", [0, 1, 7, 8, 9]),  # verl: max // 2 from the front, the rest from the back
        ("error", list(range(10))),  # left for the caller to refuse
    ],
)
def test_truncate_prompt_by_hand(mode, expected):
    assert truncate_prompt(list(range(10)), 5, mode) == expected
    assert truncate_prompt([1, 2], 5, mode) == [1, 2]


def test_middle_truncation_of_an_even_budget():
    assert truncate_prompt(list(range(10)), 4, "middle") == [0, 1, 8, 9]


@pytest.mark.parametrize("mode", ["left", "right", "middle"])
def test_dataset_cuts_overlong_prompts_when_not_filtering(tmp_path, caplog, mode):
    tokenizer = build_char_tokenizer()
    path = write_prompts(tmp_path / "p.parquet", ["a", "abcdefghij"])  # 20 and 29 tokens with ChatML
    full = encode_prompt(tokenizer, [{"role": "user", "content": "abcdefghij"}])
    with caplog.at_level(logging.WARNING, logger="relm.data.dataset"):
        dataset = PromptDataset(
            [path], tokenizer, max_prompt_length=24, filter_overlong_prompts=False, truncation=mode
        )
    assert len(dataset) == 2 and dataset.num_truncated == 1 and dataset.num_filtered == 0
    assert dataset[1]["prompt_ids"] == truncate_prompt(full, 24, mode) and len(dataset[1]["prompt_ids"]) == 24
    assert (dataset[0]["truncated"], dataset[1]["truncated"]) == (False, True)
    assert (
        f"cut 1 of 2 prompts in data.train_files to data.max_prompt_length=24 tokens (data.truncation={mode})"
        in (caplog.text)
    )
    if mode == "left":  # the generation prompt survives: the model still starts its reply
        assert tokenizer.decode(dataset[1]["prompt_ids"]).endswith("<|im_start|>assistant\n")


def test_truncation_error_names_the_row_and_the_fixes(tmp_path):
    path = write_prompts(tmp_path / "p.parquet", ["a", "abcdefghij"])
    with pytest.raises(UserError) as err:
        PromptDataset(
            [path],
            build_char_tokenizer(),
            max_prompt_length=24,
            filter_overlong_prompts=False,
            truncation="error",
        )
    assert str(err.value) == (
        f"data.truncation=error: '{path}' row 1 is 29 tokens (chat template included), longer than "
        "data.max_prompt_length=24; raise data.max_prompt_length, set data.filter_overlong_prompts=true to "
        "drop such prompts, or data.truncation=left|right|middle to cut them"
    )


def test_filtering_comes_before_truncation_as_in_verl(tmp_path):
    path = write_prompts(tmp_path / "p.parquet", ["a", "abcdefghij"])
    dataset = PromptDataset([path], build_char_tokenizer(), max_prompt_length=24, truncation="left")
    assert len(dataset) == 1 and dataset.num_filtered == 1 and dataset.num_truncated == 0


# --- vocabulary clamp ------------------------------------------------------------------------------


def test_sampled_ids_stay_below_the_limit_and_logprobs_normalise_over_it():
    torch.manual_seed(0)
    logits = torch.randn(64, 12)
    logits[:, 10:] = 50.0  # rows past the tokenizer would win every draw
    columns = SampledColumns(pad_token_id=0, vocab_limit=10)
    finished = torch.zeros(64, dtype=torch.bool)
    for params in (SamplingParams(), SamplingParams(do_sample=False), SamplingParams(top_k=3, top_p=0.9)):
        token = columns.sample(logits, finished, params, torch.Generator().manual_seed(1))
        assert int(token.max()) < 10
        expected = torch.log_softmax(logits[:, :10], dim=-1).gather(-1, token[:, None]).squeeze(-1)
        torch.testing.assert_close(columns.logprobs[-1], expected)


def test_sampled_columns_keep_every_step_past_their_first_capacity():
    # 300 steps: the [rows, 256] buffers double once; every step's token, mask and logprob stay in place
    from relm.rollout.sampling import COLUMNS_CAPACITY

    torch.manual_seed(0)
    columns = SampledColumns(pad_token_id=0)
    finished = torch.zeros(3, dtype=torch.bool)
    drawn = []
    for step in range(COLUMNS_CAPACITY + 44):
        finished = finished | (torch.arange(3) == 2) & (step >= 7)  # row 2 ends after its 7th token
        drawn.append(
            columns.sample(torch.randn(3, 6), finished, SamplingParams(), torch.Generator().manual_seed(step))
        )
    assert columns.steps == 300 and len(columns.tokens) == 300
    assert torch.equal(torch.stack(columns.tokens, dim=1), torch.stack(drawn, dim=1))
    out = columns.pack(torch.zeros(3, dtype=torch.bool), width=310)
    assert torch.equal(out.response_ids[:, :300], torch.stack(drawn, dim=1))
    assert (
        out.response_mask[2].sum() == 7
        and out.response_mask[:2, :300].all()
        and not out.response_mask[:, 300:].any()
    )
    assert (out.logprobs[2, 7:] == 0).all() and (out.logprobs[:2, :300] < 0).all()


@pytest.mark.parametrize("engine_class", [NativeRolloutEngine, HFRolloutEngine])
@torch.no_grad()
def test_engine_and_trainer_logprobs_agree_under_a_vocabulary_limit(engine_class):
    model = load_causal_lm(str(materialize_zoo("zoo:tiny/qwen2")), dtype=torch.float32, device="cpu")
    limit = model.config.vocab_size - 20  # a fifth of the tiny vocabulary is "past the tokenizer"
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12]]
    engine = engine_class(model, pad_token_id=0, eos_token_ids=[], device="cpu", vocab_limit=limit)
    out = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=8, temperature=0.7, seed=3))
    assert int(out.response_ids.max()) < limit

    repeated = [p for p in prompts for _ in range(2)]
    width = max(map(len, repeated))
    prompt_ids = torch.tensor([[0] * (width - len(p)) + p for p in repeated])
    prompt_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in repeated])
    input_ids = torch.cat([prompt_ids, out.response_ids], dim=1)
    mask = torch.cat([prompt_mask, out.response_mask], dim=1)
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    for remove_padding in (False, True):
        trainer, _ = response_logprobs(
            model,
            input_ids,
            mask,
            positions,
            8,
            temperature=0.7,
            vocab_limit=limit,
            remove_padding=remove_padding,
        )
        torch.testing.assert_close(out.logprobs, trainer, atol=1e-4, rtol=0)
    unclamped, _ = response_logprobs(model, input_ids, mask, positions, 8, temperature=0.7)
    assert (unclamped - out.logprobs).abs().max() > 0.05  # the limit is what makes them agree
