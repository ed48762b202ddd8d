"""relm's reward path (RewardManager, DAPO's overlong penalty) against verl 0.9.1's DAPO reward manager.

The same token ids, decoded by the same real (character-level) tokenizer, scored for `math_dapo` rows
with the soft overlong punishment on: verl's `DAPORewardManager` and relm's `RewardManager` plus
`overlong_penalty` (what `relm/trainer/collect.py` adds) must put the same reward on the same token.
Responses run from one token to the full width, so some fall inside the overlong buffer and some reach
the limit.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from relm.models.char_tokenizer import build_char_tokenizer
from relm.rewards.manager import RewardManager, place_on_last_token
from relm.rewards.registry import default_compute_score
from relm.rewards.shaping import overlong_penalty

pytestmark = pytest.mark.verl

MAX_RESPONSE_LENGTH = 24
BUFFER_LEN = 8
PENALTY_FACTOR = 0.5


def random_responses(rng: random.Random, count: int) -> tuple[list[str], list[str]]:
    """Texts of 1 to MAX_RESPONSE_LENGTH characters (one token each) and their references."""
    texts, references = [], []
    for _ in range(count):
        reference = str(rng.randint(0, 99))
        answer = rng.choice([reference, str(rng.randint(0, 99)), f"\\boxed{{{reference}}}"])
        body = rng.choice(["", "so ", "We add them up. ", "x=1, y=2; thus "])
        text = body * rng.randint(0, 3) + ("Answer: " if "boxed" not in answer else "") + answer
        texts.append(text[-rng.randint(1, MAX_RESPONSE_LENGTH) :])
        references.append(reference)
    return texts, references


def test_dapo_rewards_with_overlong_penalty_match_verl(verl):
    from verl import DataProto
    from verl.workers.reward_manager.dapo import DAPORewardManager

    tokenizer = build_char_tokenizer()
    rng = random.Random(0)
    texts, references = random_responses(rng, 64)
    encoded = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    assert all(1 <= len(ids) <= MAX_RESPONSE_LENGTH for ids in encoded)
    num_rows = len(texts)
    response_ids = torch.full((num_rows, MAX_RESPONSE_LENGTH), tokenizer.pad_token_id)
    response_mask = torch.zeros(num_rows, MAX_RESPONSE_LENGTH, dtype=torch.long)
    for row, ids in enumerate(encoded):
        response_ids[row, : len(ids)] = torch.tensor(ids)
        response_mask[row, : len(ids)] = 1
    prompt_ids = torch.tensor(tokenizer("1+1?", add_special_tokens=False)["input_ids"]).repeat(num_rows, 1)

    data = DataProto.from_dict(
        tensors={
            "prompts": prompt_ids,
            "responses": response_ids,
            "attention_mask": torch.cat([torch.ones_like(prompt_ids), response_mask], dim=1),
        },
        non_tensors={
            "data_source": np.array(["math_dapo"] * num_rows, dtype=object),
            "reward_model": np.array([{"ground_truth": ref} for ref in references], dtype=object),
            "extra_info": np.array([{} for _ in range(num_rows)], dtype=object),
        },
    )
    overlong = SimpleNamespace(enable=True, len=BUFFER_LEN, penalty_factor=PENALTY_FACTOR, log=False)
    manager = DAPORewardManager(
        tokenizer, num_examine=0, max_resp_len=MAX_RESPONSE_LENGTH, overlong_buffer_cfg=overlong
    )
    expected = manager(data)

    scored = RewardManager(tokenizer, default_compute_score)(
        response_ids, response_mask, ["math_dapo"] * num_rows, references, [{}] * num_rows
    )
    penalty = overlong_penalty(
        response_mask.sum(-1), max_response_length=MAX_RESPONSE_LENGTH, buffer_len=BUFFER_LEN,
        penalty_factor=PENALTY_FACTOR,
    )  # fmt: skip
    actual = scored.token_scores + place_on_last_token(penalty, response_mask)
    torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-6)
    assert (
        (penalty < 0).any()
        and (penalty == 0).any()
        and (scored.scores > 0).any()
        and (scored.scores < 0).any()
    )
    assert scored.extra["acc"] == [float(score > 0) for score in scored.scores.tolist()]
