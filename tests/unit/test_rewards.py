"""Rule scorers, custom reward loading and the reward manager."""

from __future__ import annotations

import math
import textwrap

import numpy as np
import pytest
import torch

from relm.data.demo_task import letter_share_score
from relm.errors import UserError
from relm.models.char_tokenizer import build_char_tokenizer
from relm.rewards import (
    RewardManager,
    default_compute_score,
    load_custom_reward,
    place_on_last_token,
    register_scorer,
    registry,
    resolve_compute_score,
)
from relm.rewards.registry import extract_gsm8k_answer, gsm8k_score


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


def _responses(
    tokenizer, texts: list[str], width: int, eos: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, width] right-padded response ids (eos appended) and their mask."""
    ids = torch.full((len(texts), width), tokenizer.pad_token_id)
    mask = torch.zeros((len(texts), width), dtype=torch.long)
    for row, text in enumerate(texts):
        tokens = tokenizer.encode(text) + ([tokenizer.eos_token_id] if eos else [])
        ids[row, : len(tokens)] = torch.tensor(tokens)
        mask[row, : len(tokens)] = 1
    return ids, mask


# --- scorers ---------------------------------------------------------------------------------------


def test_letter_share_score_by_hand():
    assert letter_share_score("aab", "a") == pytest.approx(2 / 3)
    assert letter_share_score("a a", "a") == pytest.approx(2 / 3)  # the space is a character too
    assert letter_share_score("xxxx<|im_end|>", "x") == 1.0  # special tokens do not dilute
    assert letter_share_score("", "a") == 0.0 and letter_share_score("<|im_end|>", "a") == 0.0
    assert letter_share_score("bcd", "a") == 0.0
    assert letter_share_score("abab", "ab") == 1.0
    with pytest.raises(ValueError, match="non-empty"):
        letter_share_score("a", "")


def test_default_compute_score_dispatches_and_names_unknown_sources():
    assert default_compute_score("relm/letters", "ssst", "s") == 0.75
    assert default_compute_score("openai/gsm8k", "so #### 72", "72") == 1.0
    with pytest.raises(
        UserError, match=r"data_source 'my/task' has no built-in scorer .*custom_reward_function.path"
    ):
        default_compute_score("my/task", "x", "y")


def test_register_scorer_adds_sources_and_refuses_a_second_owner(monkeypatch):
    monkeypatch.setattr(registry, "_SCORERS", dict(registry._SCORERS))  # leave no test scorers behind

    @register_scorer("test/echo-a", "test/echo-b")
    def echo(solution_str, ground_truth):
        return float(solution_str == ground_truth)

    assert default_compute_score("test/echo-b", "x", "x") == 1.0
    with pytest.raises(ValueError, match="already has scorer echo"):
        register_scorer("test/echo-a")(lambda s, g: 0.0)


def test_gsm8k_answers_by_hand():
    assert extract_gsm8k_answer("3 + 4 = 7\n#### 1,234") == "1234"
    assert extract_gsm8k_answer("first #### 5 then #### -6") == "-6"  # the last one is the answer
    assert extract_gsm8k_answer("the answer is 42.") is None
    assert extract_gsm8k_answer("costs $3, so 12 in total.", method="flexible") == "12"
    assert gsm8k_score("#### $18", "18") == 1.0
    assert gsm8k_score("#### 18.0", "18") == 1.0
    assert gsm8k_score("#### 17", "18", format_score=0.1) == 0.1
    assert gsm8k_score("18", "18") == 0.0  # strict: no #### at all
    assert gsm8k_score("I think 18", "18", method="flexible") == 1.0


# --- placement and manager -------------------------------------------------------------------------


def test_place_on_last_token_by_hand():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0], [1, 0, 0]])
    placed = place_on_last_token(torch.tensor([1.0, 2.0, 3.0, -4.0]), mask)
    expected = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 2.0], [0.0, 0.0, 0.0], [-4.0, 0.0, 0.0]])
    assert placed.dtype == torch.float32 and torch.equal(placed, expected)
    assert place_on_last_token(torch.tensor([1.0]), torch.zeros((1, 0), dtype=torch.long)).shape == (1, 0)


def test_manager_decodes_masked_ids_scores_and_places(tokenizer):
    ids, mask = _responses(tokenizer, ["aab", "eeee", ""], width=6)
    manager = RewardManager(tokenizer, default_compute_score)
    result = manager(ids, mask, ["relm/letters"] * 3, ["a", "e", "o"], [{}, {}, {}])
    assert result.texts == ["aab", "eeee", ""]  # eos and padding dropped
    assert torch.allclose(result.scores, torch.tensor([2 / 3, 1.0, 0.0]))
    assert result.token_scores[0, 3] == pytest.approx(2 / 3)  # on the eos, the last generated token
    assert result.token_scores[1, 4] == 1.0 and result.token_scores.sum() == pytest.approx(5 / 3)


def test_manager_passes_verl_keywords_and_collects_extra_metrics(tokenizer):
    calls = []

    def compute_score(data_source, solution_str, ground_truth, extra_info):
        calls.append((data_source, solution_str, ground_truth, extra_info))
        extra = {"acc": np.float32(1.0), "pred": solution_str}  # non-numeric values are not metrics
        if extra_info["i"] == 1:
            extra["len"] = len(solution_str)
        return {"score": torch.tensor(0.5), **extra}

    ids, mask = _responses(tokenizer, ["x", "yz"], width=4)
    result = RewardManager(tokenizer, compute_score)(ids, mask, ["s0", "s1"], [None, 3], [{"i": 0}, {"i": 1}])
    assert calls == [("s0", "x", None, {"i": 0}), ("s1", "yz", 3, {"i": 1})]
    assert result.scores.tolist() == [0.5, 0.5]
    assert result.extra["acc"] == [1.0, 1.0]
    assert math.isnan(result.extra["len"][0]) and result.extra["len"][1] == 2.0
    assert "pred" not in result.extra


@pytest.mark.parametrize(
    ("returned", "shown"),
    [
        (None, "NoneType None"),
        (float("nan"), "float nan"),
        (float("inf"), "float inf"),
        ("1.0", "str '1.0'"),
        ({"acc": 1.0}, r"dict \{'acc': 1.0\} \(no 'score' key\)"),
        ({"score": None}, "dict {'score': None}"),
    ],
)
def test_manager_rejects_non_scores_naming_row_and_source(tokenizer, returned, shown):
    def compute_score(data_source, solution_str, ground_truth, extra_info):
        return 1.0 if extra_info["i"] == 0 else returned

    ids, mask = _responses(tokenizer, ["a", "b"], width=3)
    # One failure in two responses is past the default share (0.25): the run ends, naming an example.
    with pytest.raises(
        UserError,
        match=rf"compute_score failed on 1 of 2 responses.*it returned {shown}.* on response 1 \(data_source 'b/src'\)",
    ):
        RewardManager(tokenizer, compute_score)(
            ids, mask, ["a/src", "b/src"], [None, None], [{"i": 0}, {"i": 1}]
        )


def test_manager_turns_a_raising_function_into_a_user_error(tokenizer):
    def compute_score(data_source, solution_str, ground_truth, extra_info):
        raise KeyError("answer")

    ids, mask = _responses(tokenizer, ["a"], width=2)
    with pytest.raises(
        UserError,
        match=r"compute_score failed on 1 of 1 responses.* it raised KeyError: 'answer' on response 0 \(data_source 'd'\)",
    ):
        RewardManager(tokenizer, compute_score)(ids, mask, ["d"], [None], [{}])
    with pytest.raises(UserError, match=r"data_source 'nope' has no built-in scorer"):
        RewardManager(tokenizer, default_compute_score)(ids, mask, ["nope"], [None], [{}])


# --- custom reward files ---------------------------------------------------------------------------


def _write(folder, name: str, source: str) -> str:
    path = folder / name
    path.write_text(textwrap.dedent(source))
    return str(path)


def test_custom_reward_loads_and_can_import_its_siblings(tmp_path):
    _write(tmp_path, "helpers_for_reward.py", "def double(x):\n    return 2 * x\n")
    path = _write(
        tmp_path,
        "reward.py",
        """
        from helpers_for_reward import double

        def my_score(data_source, solution_str, ground_truth, extra_info=None):
            return double(len(solution_str))
        """,
    )
    function = load_custom_reward(path, "my_score")
    assert function(data_source="x", solution_str="abc", ground_truth=None, extra_info={}) == 6
    assert resolve_compute_score(path, "my_score").__name__ == "my_score"
    assert resolve_compute_score(None) is default_compute_score


def test_custom_reward_errors(tmp_path):
    with pytest.raises(UserError, match=r"custom_reward_function.path: file '/no/reward.py' does not exist"):
        load_custom_reward("/no/reward.py", "compute_score")
    broken = _write(tmp_path, "broken.py", "import json\nraise RuntimeError('no GPU here\\nsecond line')\n")
    with pytest.raises(
        UserError, match=r"importing '.*broken.py' raised RuntimeError: no GPU here second line; fix"
    ):
        load_custom_reward(broken, "compute_score")
    syntax = _write(tmp_path, "syntax.py", "def f(:\n")
    with pytest.raises(UserError, match=r"raised SyntaxError"):
        load_custom_reward(syntax, "compute_score")
    other = _write(
        tmp_path, "other.py", "def score_a(**kw):\n    return 0\ndef score_b(**kw):\n    return 1\nX = 1\n"
    )
    with pytest.raises(
        UserError, match=r"defines no function 'compute_score' \(functions: score_a, score_b\)"
    ):
        load_custom_reward(other, "compute_score")
    narrow = _write(tmp_path, "narrow.py", "def compute_score(solution_str, ground_truth):\n    return 0\n")
    with pytest.raises(
        UserError, match=r"compute_score\(solution_str, ground_truth\) .* cannot be called as"
    ):
        load_custom_reward(narrow, "compute_score")
    assert (
        load_custom_reward(other, "score_b")(data_source="", solution_str="", ground_truth=1, extra_info={})
        == 1
    )


def test_gdpo_manager_adds_the_experiment_name_to_each_extra_info_by_hand(tokenizer):
    """verl 0.9.1's `gdpo` manager is its naive one plus `extra_info["experiment_name"]` (tests/parity
    compares with verl's own class)."""
    from relm.config.loader import load_config
    from relm.config.translate import translate
    from relm.rewards.manager import build_reward_manager

    calls = []

    def compute_score(data_source, solution_str, ground_truth, extra_info):
        calls.append((data_source, solution_str, ground_truth, extra_info))
        return float(len(solution_str))

    def reward_spec(*overrides: str):
        return translate(load_config(["reward_model.num_workers=0", *overrides]))[0].reward

    gdpo = reward_spec("reward.reward_manager.name=gdpo", "trainer.experiment_name=qwen3_gdpo")
    naive = reward_spec("trainer.experiment_name=qwen3_gdpo")
    ids, mask = _responses(tokenizer, ["ab", "c", "d"], width=4)
    prompt_info = {"index": 7}  # one prompt's dict, shared by its responses as the rollout repeats it
    infos = [prompt_info, prompt_info, {"experiment_name": "from the row"}]
    result = build_reward_manager(tokenizer, compute_score, gdpo)(
        ids, mask, ["s"] * 3, ["g", "g", None], infos
    )
    assert calls == [
        ("s", "ab", "g", {"index": 7, "experiment_name": "qwen3_gdpo"}),
        ("s", "c", "g", {"index": 7, "experiment_name": "qwen3_gdpo"}),
        ("s", "d", None, {"experiment_name": "qwen3_gdpo"}),  # the run's name wins, as verl assigns it
    ]
    assert result.scores.tolist() == [2.0, 1.0, 1.0]
    assert prompt_info == {"index": 7}  # the prompt's own dict is left alone
    calls.clear()
    build_reward_manager(tokenizer, compute_score, naive)(ids, mask, ["s"] * 3, ["g", "g", None], infos)
    assert [call[3] for call in calls] == infos  # naive adds nothing
