"""Reward models and LLM judges, piece by piece: scoring against HF's own forward, the re-rendered
conversation, the judge's template and parser, how model and rule scores are joined, and the config errors."""

from __future__ import annotations

import copy
import math
import re
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForSequenceClassification

from relm.config.loader import load_config
from relm.config.translate import translate
from relm.config.validate import validate_config
from relm.errors import UserError
from relm.models.loading import resolve_model_dir
from relm.models.tokenizer import encode_prompt, load_tokenizer
from relm.models.value_model import load_value_model
from relm.rewards import RewardManager, default_compute_score
from relm.rewards.judge import load_template, parse_score
from relm.rewards.model_reward import build_reward_model, score_with_reward_model
from relm.rewards.reward_model import (
    DiscriminativeRewardModel,
    ScoringInputs,
    load_discriminative_reward_model,
    render_conversation,
    reward_model_kind,
)

ZOO = "zoo:tiny/qwen2"


@pytest.fixture(scope="module")
def zoo_folder() -> Path:
    return Path(resolve_model_dir(ZOO))


@pytest.fixture(scope="module")
def tokenizer(zoo_folder: Path):
    return load_tokenizer(str(zoo_folder))


@pytest.fixture(scope="module")
def classifier_folder(tmp_path_factory: pytest.TempPathFactory, zoo_folder: Path) -> Path:
    folder = tmp_path_factory.mktemp("rm")
    config = AutoConfig.from_pretrained(zoo_folder)
    config.num_labels = 1
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(zoo_folder / name, folder / name)
    return folder


def _classifier(folder: Path, tokenizer, **kwargs) -> DiscriminativeRewardModel:
    return load_discriminative_reward_model(
        str(folder),
        tokenizer=tokenizer,
        device=torch.device("cpu"),
        dtype=torch.float32,
        micro_batch_size=kwargs.pop("micro_batch_size", None),
        max_length=kwargs.pop("max_length", None),
        rerender=kwargs.pop("rerender", False),
    )


def _inputs(tokenizer, responses: list[str], letters: list[str]) -> ScoringInputs:
    messages = [[{"role": "user", "content": letter}] for letter in letters]
    sequences = [
        encode_prompt(tokenizer, m) + tokenizer.encode(r, add_special_tokens=False)
        for m, r in zip(messages, responses, strict=True)
    ]
    return ScoringInputs(sequences, messages, responses, letters)


def test_classifier_scores_equal_hf_logits_of_each_sequence_alone(classifier_folder: Path, tokenizer) -> None:
    """Padding and micro-batching change nothing: each score is HF's logit of the unpadded sequence
    (whose last token is not the pad id, so HF's own pooling reads the right position)."""
    batch = _inputs(tokenizer, ["a", "aaaa", "xyz", "tt", "e"], ["a", "a", "o", "t", "x"])
    scores = _classifier(classifier_folder, tokenizer, micro_batch_size=2).score(batch).scores
    hf = AutoModelForSequenceClassification.from_pretrained(classifier_folder).eval()
    with torch.no_grad():
        expected = [float(hf(input_ids=torch.tensor([ids])).logits[0, 0]) for ids in batch.sequences]
    assert scores.tolist() == pytest.approx(expected, abs=1e-5)


def test_max_length_keeps_the_end(classifier_folder: Path, tokenizer) -> None:
    batch = _inputs(tokenizer, ["aaaa"], ["a"])
    model = _classifier(classifier_folder, tokenizer, max_length=6)
    assert model.inputs_of(batch) == [batch.sequences[0][-6:]]


def test_rerendered_conversation_is_the_chat_template_with_the_assistant_turn(tokenizer) -> None:
    ids = render_conversation(tokenizer, [{"role": "user", "content": "a"}], "aa")
    text = tokenizer.decode(ids)
    assert text.endswith("<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\naa<|im_end|>\n")


def test_value_head_reward_model_reads_the_last_token(tmp_path: Path, zoo_folder: Path, tokenizer) -> None:
    value_model = load_value_model(str(zoo_folder), dtype=torch.float32, device="cpu")
    torch.nn.init.normal_(value_model.value_head.weight)
    value_model.save_pretrained(tmp_path)
    assert reward_model_kind(str(tmp_path)) == "value_head"
    batch = _inputs(tokenizer, ["ab", "xxxxx"], ["a", "x"])

    scores = _classifier(tmp_path, tokenizer).score(batch).scores

    reloaded = load_value_model(str(tmp_path), dtype=torch.float32, device="cpu").eval()
    with torch.no_grad():
        expected = [
            float(reloaded(torch.tensor([ids]), None, torch.arange(len(ids))[None])[0, -1])
            for ids in batch.sequences
        ]
    assert scores.tolist() == pytest.approx(expected, abs=1e-5)


def test_a_causal_lm_without_judge_template_is_refused(zoo_folder: Path) -> None:
    with pytest.raises(UserError, match=r"neither a sequence-classification model .* judge"):
        reward_model_kind(str(zoo_folder))


def test_a_classifier_with_two_labels_is_refused(tmp_path: Path, zoo_folder: Path, tokenizer) -> None:
    config = AutoConfig.from_pretrained(zoo_folder)
    config.num_labels = 2
    AutoModelForSequenceClassification.from_config(config).save_pretrained(tmp_path)
    with pytest.raises(UserError, match="2 labels"):
        _classifier(tmp_path, tokenizer)


@pytest.mark.parametrize(
    ("text", "pattern", "expected"),
    [
        ("I give it 3, no, 8.5", r"-?\d+(?:\.\d+)?", 8.5),  # the last match
        ("Score: 4\nconfidence 90", r"Score: (\d+)", 4.0),  # the first group
        ("no number here", r"-?\d+(?:\.\d+)?", None),
        ("Score: x", r"Score: (\S+)", None),  # matched, but not a number
        ("value -2", r"-?\d+", -2.0),
    ],
)
def test_parse_score(text: str, pattern: str, expected: float | None) -> None:
    assert parse_score(text, re.compile(pattern)) == expected


def test_template_from_file_and_its_errors(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_text("Q: {prompt}\nA: {response}\nRate 0-9; JSON {{}} allowed", encoding="utf-8")
    assert load_template(None, str(path)).startswith("Q: {prompt}")
    with pytest.raises(UserError, match=r"field 'answer' is not one of"):
        load_template("{answer}", None)
    with pytest.raises(UserError, match=r"no `\{response\}` field"):
        load_template("Rate {prompt}", None)
    with pytest.raises(UserError, match=r"prompt_template_path=.*cannot be read"):
        load_template(None, str(tmp_path / "missing.txt"))


def _rows(tokenizer, responses: list[str], sources: list[str]):
    ids = [tokenizer.encode(r, add_special_tokens=False) for r in responses]
    width = max(len(i) for i in ids)
    response_ids = torch.zeros((len(ids), width), dtype=torch.long)
    response_mask = torch.zeros((len(ids), width), dtype=torch.long)
    for row, seq in enumerate(ids):
        response_ids[row, : len(seq)] = torch.tensor(seq)
        response_mask[row, : len(seq)] = 1
    messages = [[{"role": "user", "content": "a"}] for _ in responses]
    sequences = [encode_prompt(tokenizer, m) + i for m, i in zip(messages, ids, strict=True)]
    return sequences, messages, response_ids, response_mask, sources


def test_model_score_is_the_reward_and_rule_score_is_logged(classifier_folder: Path, tokenizer) -> None:
    model = _classifier(classifier_folder, tokenizer)
    sequences, messages, response_ids, response_mask, sources = _rows(
        tokenizer, ["aa", "ab", "x"], ["relm/letters", "no-rule-here", "relm/letters"]
    )
    result = score_with_reward_model(
        model,
        RewardManager(tokenizer, default_compute_score),
        tokenizer,
        sequences=sequences,
        messages=messages,
        response_ids=response_ids,
        response_mask=response_mask,
        data_sources=sources,
        ground_truths=["a", "a", "a"],
        extra_infos=[{}, {}, {}],
        custom_function=False,
    )
    alone = model.score(ScoringInputs(sequences, messages, ["aa", "ab", "x"], ["a"] * 3)).scores
    assert result.scores.tolist() == pytest.approx(alone.tolist())
    assert result.token_scores.sum(-1).tolist() == pytest.approx(alone.tolist())
    rule = result.extra["rule_score"]
    assert rule[0] == 1.0 and math.isnan(rule[1]) and rule[2] == 0.0  # no scorer for row 1: not scored


def test_custom_function_gets_the_model_score(classifier_folder: Path, tokenizer) -> None:
    model = _classifier(classifier_folder, tokenizer)
    sequences, messages, response_ids, response_mask, sources = _rows(
        tokenizer, ["aa", "ab"], ["mine", "mine"]
    )

    def compute_score(data_source, solution_str, ground_truth, extra_info):
        return 10.0 + extra_info["rm_score"]

    result = score_with_reward_model(
        model,
        RewardManager(tokenizer, compute_score),
        tokenizer,
        sequences=sequences,
        messages=messages,
        response_ids=response_ids,
        response_mask=response_mask,
        data_sources=sources,
        ground_truths=[None, None],
        extra_infos=[{"index": 0}, {"index": 1}],
        custom_function=True,
    )
    assert result.scores.tolist() == pytest.approx([10.0 + s for s in result.extra["rm_score"]])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ("reward_model.enable=true", r"needs `reward_model.model.path="),
        (
            "reward_model.enable=true reward_model.model.path=x reward_model.judge.prompt_template=Rate "
            "reward_model.judge.prompt_template_path=t.txt",
            "both set",
        ),
        (
            "reward_model.enable=true reward_model.model.path=x reward_model.rollout.name=vllm",
            "`native` or `hf`",
        ),
        (
            "reward_model.enable=true reward_model.model.path=x reward_model.judge.score_regex='('",
            "not a valid pattern",
        ),
        (
            "reward_model.enable=true reward_model.model.path=x reward_model.micro_batch_size_per_gpu=0",
            "at least 1",
        ),
    ],
)
def test_config_errors(overrides: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        validate_config(load_config(overrides.split()))


def test_a_reward_model_with_another_vocabulary_reads_the_rerendered_conversation(
    classifier_folder: Path, tokenizer
) -> None:
    """The policy's ids mean other tokens to it (or lie past its embedding): verl 0.9 re-renders always."""
    cfg = load_config(["reward_model.enable=true", f"reward_model.model.path={classifier_folder}"])
    spec = translate(cfg)[0].reward.model
    other = copy.deepcopy(tokenizer)
    other.add_tokens(["<policy-only>"])
    cpu = torch.device("cpu")
    assert build_reward_model(spec, device=cpu, policy_tokenizer=tokenizer).rerender is False  # type: ignore[attr-defined]
    assert build_reward_model(spec, device=cpu, policy_tokenizer=other).rerender is True  # type: ignore[attr-defined]
