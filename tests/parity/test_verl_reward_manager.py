"""relm's reward path (RewardManager, DAPO's overlong penalty) against verl 0.9.1's DAPO and GDPO reward managers.

The same token ids, decoded by the same real (character-level) tokenizer, scored for `math_dapo` rows
with the soft overlong punishment on: verl's `DAPORewardManager` and relm's `RewardManager` plus
`overlong_penalty` (what `relm/trainer/collect.py` adds) must put the same reward on the same token.
Responses run from one token to the full width, so some fall inside the overlong buffer and some reach
the limit. The GDPO manager (verl's reward-loop class) must hand a custom scorer the same arguments as
relm's `gdpo` manager, row by row, and score the same.
"""

from __future__ import annotations

import importlib
import random
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from relm.config.loader import load_config
from relm.config.translate import translate
from relm.models.char_tokenizer import build_char_tokenizer
from relm.rewards.manager import RewardManager, build_reward_manager, place_on_last_token
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
    response_ids, response_mask, prompt_ids = _padded_batch(tokenizer, encoded)

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


REWARD_LOOP = "verl.experimental.reward_loop"


@pytest.fixture(scope="module")
def verl_gdpo(verl):
    """verl 0.9.1's `GDPORewardManager`, its own code.

    Its package's `__init__` files import the reward loop's server side (aiohttp, Ray actors), which the
    parity set-up does not install; the two packages are entered as plain folders instead, so only the
    manager's own module, its base class and the registry are imported, unchanged.
    """
    with pytest.MonkeyPatch.context() as patch:
        for name in (REWARD_LOOP, f"{REWARD_LOOP}.reward_manager"):
            parent, _, leaf = name.rpartition(".")
            package = types.ModuleType(name)
            package.__path__ = [str(Path(sys.modules[parent].__path__[0]) / leaf)]
            patch.setitem(sys.modules, name, package)
        registry = importlib.import_module(f"{REWARD_LOOP}.reward_manager.registry")
        sys.modules[f"{REWARD_LOOP}.reward_manager"].register = registry.register  # type: ignore[attr-defined]
        yield importlib.import_module(f"{REWARD_LOOP}.reward_manager.gdpo").GDPORewardManager
        for name in [name for name in sys.modules if name.startswith(f"{REWARD_LOOP}.")]:
            patch.delitem(sys.modules, name, raising=False)


def recording_scorer(calls: list) -> object:
    def compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs):
        calls.append({"data_source": data_source, "solution_str": solution_str, "ground_truth": ground_truth,
                      "extra_info": dict(extra_info), **kwargs})  # fmt: skip
        if len(solution_str) % 3 == 0:
            return float(len(solution_str))
        return {"score": len(solution_str) / 2, "format_reward": float(ground_truth == solution_str[-2:])}

    return compute_score


def test_gdpo_manager_passes_a_custom_scorer_what_verls_does(verl_gdpo):
    from omegaconf import OmegaConf
    from verl import DataProto

    tokenizer = build_char_tokenizer()
    rng = random.Random(1)
    texts, references = random_responses(rng, 24)
    encoded = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    num_rows = len(texts)
    response_ids, response_mask, prompt_ids = _padded_batch(tokenizer, encoded)
    sources = [rng.choice(["tool_use", "math_dapo"]) for _ in range(num_rows)]
    infos = [rng.choice([{}, {"index": row, "split": "train"}, {"experiment_name": "the row's"}]) for row in
             range(num_rows)]  # fmt: skip
    name = "qwen3_8b_vllm_fsdp"

    data = DataProto.from_dict(
        tensors={
            "prompts": prompt_ids,
            "responses": response_ids,
            "attention_mask": torch.cat([torch.ones_like(prompt_ids), response_mask], dim=1),
        },
        non_tensors={
            "data_source": np.array(sources, dtype=object),
            "reward_model": np.array([{"ground_truth": ref} for ref in references], dtype=object),
            "extra_info": np.array([dict(info) for info in infos], dtype=object),
        },
    )
    verl_calls: list = []
    config = OmegaConf.create({"trainer": {"experiment_name": name}})
    manager = verl_gdpo(config, tokenizer, recording_scorer(verl_calls))
    expected = [
        manager.loop.run_until_complete(manager.run_single(data[row : row + 1])) for row in range(num_rows)
    ]

    relm_calls: list = []
    spec = translate(load_config([
        "reward.reward_manager.name=gdpo", f"trainer.experiment_name={name}", "reward_model.num_workers=0",
    ]))[0].reward  # fmt: skip
    scored = build_reward_manager(tokenizer, recording_scorer(relm_calls), spec)(
        response_ids, response_mask, sources, references, infos
    )
    assert relm_calls == verl_calls
    assert all(call["extra_info"]["experiment_name"] == name for call in relm_calls)
    assert scored.scores.tolist() == [out["reward_score"] for out in expected]
    # (verl also files a plain-number score as `acc`; relm's managers report only the dict's numbers.)
    column = [out["reward_extra_info"].get("format_reward", float("nan")) for out in expected]
    assert np.allclose(scored.extra["format_reward"], column, equal_nan=True)


def _padded_batch(tokenizer, encoded: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Responses right-padded to MAX_RESPONSE_LENGTH, their mask, and one prompt ("1+1?") per row."""
    response_ids = torch.full((len(encoded), MAX_RESPONSE_LENGTH), tokenizer.pad_token_id)
    response_mask = torch.zeros(len(encoded), MAX_RESPONSE_LENGTH, dtype=torch.long)
    for row, ids in enumerate(encoded):
        response_ids[row, : len(ids)] = torch.tensor(ids)
        response_mask[row, : len(ids)] = 1
    prompt = torch.tensor(tokenizer("1+1?", add_special_tokens=False)["input_ids"])
    return response_ids, response_mask, prompt.repeat(len(encoded), 1)
