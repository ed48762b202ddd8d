"""The optimal token baselines and their input, each token's sum of squared probabilities, against numbers by hand."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import PreTrainedModel

from relm.algorithms import compute_advantages, estimator_needs
from relm.learner.forward import response_token_stats
from relm.learner.vocab_chunks import sum_pi_squared
from tests.tiny_models import tiny_lm
from tests.unit.test_forward import PROMPTS, RESPONSES, R, experience


def test_sum_pi_squared_by_hand():
    # softmax([0, ln 3]) = [1/4, 3/4]: 1/16 + 9/16. Uniform over 4: 4 * 1/16. A near one-hot: 1.
    logits = torch.tensor(
        [[0.0, math.log(3.0), -math.inf, -math.inf], [0.0, 0.0, 0.0, 0.0], [100.0, 0, 0, 0]]
    )
    assert sum_pi_squared(logits).tolist() == pytest.approx([10 / 16, 1 / 4, 1.0])
    # Halving the logits (temperature 2): p proportional to [1, sqrt 3], sum p^2 = 4 / (1 + sqrt 3)^2.
    assert float(sum_pi_squared(torch.tensor([0.0, math.log(3.0) / 2]))) == pytest.approx(
        4 / (1 + 3**0.5) ** 2
    )
    # Logits far from 0 keep their precision: [1000, 1001] (exact in fp32) gives softmax([0, 1])'s
    # (1 + e^2) / (1 + e)^2 to float32 rounding, not to the ~1e-4 that subtracting two log-sums near 2000 leaves.
    e = math.e
    got = float(sum_pi_squared(torch.tensor([1000.0, 1001.0])))
    assert got == pytest.approx((1 + e**2) / (1 + e) ** 2, rel=1e-6)


@pytest.fixture(scope="module")
def model() -> PreTrainedModel:
    return tiny_lm()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("vocab_chunk", [None, 3])
@pytest.mark.parametrize("remove_padding", [False, True])
def test_the_forward_sums_the_squared_probabilities_it_normalises(
    model, temperature, vocab_chunk, remove_padding
):
    ids, mask, positions = experience(PROMPTS, RESPONSES)
    vocab_limit = 50  # the tokenizer's length: the softmax runs over these ids only
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -R - 1 : -1]
        probs = torch.softmax(logits[..., :vocab_limit].float() / temperature, dim=-1)  # [N, R, V]
        want = (probs**2).sum(-1)
        stats = response_token_stats(
            model, ids, mask, positions, R, temperature=temperature, vocab_chunk=vocab_chunk,
            remove_padding=remove_padding, vocab_limit=vocab_limit, compute_sum_pi_squared=True,
        )  # fmt: skip
    valid = mask[:, -R:].bool()
    assert stats.sum_pi_squared is not None and stats.sum_pi_squared.dtype == torch.float32
    torch.testing.assert_close(stats.sum_pi_squared[valid], want[valid], atol=1e-6, rtol=1e-5)
    assert stats.entropy is None
    # pi(y)^2 <= sum pi^2 <= 1: with the logprobs of the same forward, w = 1 - 2 pi + sum pi^2 >= (1 - pi)^2.
    chosen = stats.logprobs.exp()[valid]
    assert torch.all(chosen**2 <= stats.sum_pi_squared[valid] + 1e-6)
    assert torch.all(stats.sum_pi_squared[valid] <= 1)


def test_only_the_optimal_token_baselines_ask_the_forward_for_it():
    from relm.algorithms import ADV_ESTIMATORS

    asked = {name for name in ADV_ESTIMATORS if estimator_needs(name).sum_pi_squared}
    assert asked == {"optimal_token_baseline", "tir_optimal_token_baseline"}
    assert not estimator_needs("optimal_token_baseline").critic


def hand_case() -> dict[str, torch.Tensor]:
    """Group 0: two responses; row 1 is the only longest. Group 1: one response (keeps its return)."""
    return {
        "token_rewards": torch.tensor(
            [[0.0, 1.0, 0.0], [0.0, 0.0, 2.0], [3.0, 0.0, 0.0]], dtype=torch.float64
        ),
        "response_mask": torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]]),
        "group_ids": torch.tensor([0, 0, 1]),
        # w = 1 - 2 pi + sum pi^2: row 0 pi = 0.1, sum 0.2 -> w = 1; rows 1, 2 pi = 0.5, sum 0.5 -> w = 0.5.
        "old_logprobs": torch.log(torch.tensor([[0.1] * 3, [0.5] * 3, [0.5] * 3], dtype=torch.float64)),
        "sum_pi_squared": torch.tensor([[0.2] * 3, [0.5] * 3, [0.5] * 3], dtype=torch.float64),
    }


def test_optimal_token_baseline_by_hand():
    # Row 0: G = [1, 1, 0], W = [1, 2, -]; row 1: G = [2, 2, 2], W = [0.5, 1, 1.5].
    # B_0 = (1*1 + 2*0.5) / 1.5 = 4/3, B_1 = (1*2 + 2*1) / 3 = 4/3, B_2 = 2*1.5 / 1.5 = 2, which the zero tail
    # drops: row 1 is its group's only longest response past column 2 (the second longest's length).
    advantages, returns = compute_advantages("optimal_token_baseline", **hand_case())
    expected = [[-1 / 3, -1 / 3, 0.0], [2 / 3, 2 / 3, 2.0], [3.0, 0.0, 0.0]]
    assert advantages.tolist() == [pytest.approx(row) for row in expected]
    assert returns.tolist() == [[1.0, 1.0, 0.0], [2.0, 2.0, 2.0], [3.0, 0.0, 0.0]]
    # Importance weights rho scale each w by rho^2: row 0's doubled weighs 4x, B_0 = (4 + 1) / 4.5.
    weights = torch.ones(3, 3, dtype=torch.float64)
    weights[0] = 2.0
    advantages, _ = compute_advantages("optimal_token_baseline", **hand_case(), rollout_is_weights=weights)
    assert float(advantages[0, 0]) == pytest.approx(1 - 5 / 4.5)


def test_without_the_zero_tail_the_longest_response_is_its_own_baseline():
    from relm.algorithms import compute_optimal_token_baseline

    advantages, _ = compute_optimal_token_baseline(**hand_case(), handle_zero_tail=False)
    assert float(advantages[1, 2]) == pytest.approx(0.0, abs=1e-7)  # 2 - 2 * 1.5 / (1.5 + 1e-8)


def multi_turn_case() -> dict[str, torch.Tensor]:
    """Two responses of two valid tokens each; row 0's second turn starts after a tool result (masked)."""
    return {
        "token_rewards": torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]]),
        "response_mask": torch.tensor([[1, 0, 1], [1, 1, 0]]),
        "group_ids": torch.tensor([7, 7]),
        "old_logprobs": torch.log(torch.full((2, 3), 0.5)),
        "sum_pi_squared": torch.full((2, 3), 1.0),  # w = 1 everywhere
    }


def test_tir_compares_the_kth_valid_tokens_where_the_other_compares_columns():
    # Row 0: G = [1, 1, 1], W = [1, 1, 2]; row 1: G = [2, 2, 0], W = [1, 2, 2].
    # By column: B = [(1 + 2) / 2, 2*2 / 2, 1*2 / 2] = [1.5, 2, 1].
    advantages, _ = compute_advantages("optimal_token_baseline", **multi_turn_case())
    assert advantages.tolist() == [pytest.approx([-0.5, 0.0, 0.0]), pytest.approx([0.5, 0.0, 0.0])]
    # By valid token: row 0's tokens 1, 2 are at columns 0, 2; B = [(1 + 2) / 2, (1*2 + 2*2) / 4] = [1.5, 1.5].
    advantages, returns = compute_advantages("tir_optimal_token_baseline", **multi_turn_case())
    assert advantages.tolist() == [pytest.approx([-0.5, 0.0, -0.5]), pytest.approx([0.5, 0.5, 0.0])]
    assert returns.tolist() == [[1.0, 0.0, 1.0], [2.0, 2.0, 0.0]]  # 0 outside the mask, as every estimator's


def test_tir_leaves_empty_responses_out_of_their_group():
    case = multi_turn_case()
    case = {
        "token_rewards": torch.cat([case["token_rewards"], torch.zeros(1, 3)]),
        "response_mask": torch.cat([case["response_mask"], torch.zeros(1, 3, dtype=torch.long)]),
        "group_ids": torch.tensor([7, 7, 7]),
        "old_logprobs": torch.log(torch.full((3, 3), 0.5)),
        "sum_pi_squared": torch.full((3, 3), 1.0),
    }
    advantages, _ = compute_advantages("tir_optimal_token_baseline", **case)
    assert advantages.tolist() == [
        pytest.approx([-0.5, 0.0, -0.5]), pytest.approx([0.5, 0.5, 0.0]), [0.0, 0.0, 0.0]
    ]  # fmt: skip


def test_the_estimators_refuse_without_their_inputs():
    case = hand_case()
    del case["sum_pi_squared"]
    with pytest.raises(ValueError, match="needs `sum_pi_squared`, which is None"):
        compute_advantages("tir_optimal_token_baseline", **case)
