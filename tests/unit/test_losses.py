"""Loss aggregation, PPO / GSPO policy losses and the value loss against hand-worked numbers."""

from __future__ import annotations

import math

import pytest
import torch

from relm.algorithms.losses import (
    AGG_MODES,
    POLICY_LOSSES,
    AggScale,
    agg_loss,
    compute_entropy_loss,
    compute_policy_loss,
    compute_value_loss,
    register_policy_loss,
)


def t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def close(actual: torch.Tensor, expected: list | float, atol: float = 1e-5) -> None:
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


# --- agg_loss ----------------------------------------------------------------------------------

# Valid tokens 1, 2, 3 | 5, 6 (sum 17); padding 4, 7, 8.
LOSS_MAT = t([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]])
LOSS_MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 17 / 5),  # 3.4
        ("seq-mean-token-sum", (6 + 11) / 2),  # 8.5
        ("seq-mean-token-mean", (6 / 3 + 11 / 2) / 2),  # (2 + 5.5) / 2 = 3.75
        ("token-sum", 17.0),
        ("seq-mean-token-sum-norm", 17 / 2 / 4),  # the response mean 8.5 over the width R = 4: 2.125
    ],
)
def test_agg_loss_modes(mode, expected):
    close(agg_loss(LOSS_MAT, LOSS_MASK, mode), expected)


def test_seq_mean_token_sum_norm_divides_by_responses_and_width_as_verl_0_9_1():
    # verl 0.9.1's own example: ones(2, 4) gives 8 / 2 responses / 4 = 1.0 (relm gave 8 / 4 = 2.0 before).
    ones = torch.ones(2, 4)
    close(agg_loss(ones, ones, "seq-mean-token-sum-norm"), 1.0)
    close(agg_loss(ones, ones, "seq-mean-token-sum-norm", loss_scale_factor=8), 0.5)  # verl's constant


def test_agg_loss_empty_response_counts_only_with_a_minibatch_scale():
    # verl: on its own a batch's empty responses are left out of the response count; with the mini-batch's
    # size (its trainer passes ppo_mini_batch_size) they count, as AggScale.of counts every row.
    mask = torch.tensor([[1, 1, 1, 0], [0, 0, 0, 0]])
    close(agg_loss(LOSS_MAT, mask, "seq-mean-token-mean"), 2.0)
    close(agg_loss(LOSS_MAT, mask, "seq-mean-token-mean", AggScale.of(mask)), (2 + 0) / 2)
    close(agg_loss(LOSS_MAT, mask, "seq-mean-token-sum"), 6.0)
    close(agg_loss(LOSS_MAT, mask, "seq-mean-token-sum", AggScale.of(mask)), 3.0)


def test_agg_loss_of_no_valid_token_is_zero_not_nan():
    mask = torch.zeros(2, 4)
    for mode in AGG_MODES:
        close(agg_loss(LOSS_MAT, mask, mode), 0.0)


def test_agg_loss_unknown_mode_lists_the_valid_ones():
    with pytest.raises(ValueError, match="'seq-mean'.*token-mean"):
        agg_loss(LOSS_MAT, LOSS_MASK, "seq-mean")
    assert len(AGG_MODES) == 5


# --- vanilla PPO -------------------------------------------------------------------------------

# clip 0.2 on both sides, dual clip c = 3. Ratios are chosen directly: logprobs = log(ratio), old = 0.
#   row 0, A = +1:  r = 1.1 inside          -> max(-1.1, -1.1) = -1.1   (not clipped)
#                   r = 1.5 above 1.2       -> max(-1.5, -1.2) = -1.2   (clipped)
#                   r = 0.5 below 0.8       -> max(-0.5, -0.8) = -0.5   (not clipped: PPO only stops the
#                                                                        ratio moving *up* when A > 0)
#   row 1, A = -1:  r = 0.5 below 0.8       -> max( 0.5,  0.8) =  0.8   (clipped)
#                   r = 2.0 above 1.2       -> max( 2.0,  1.2) =  2.0, dual min(2.0, 3) = 2.0
#                   r = 4.0 above c         -> max( 4.0,  1.2) =  4.0, dual min(4.0, 3) = 3.0 (dual)
# token-mean = (-1.1 - 1.2 - 0.5 + 0.8 + 2.0 + 3.0) / 6 = 3.0 / 6 = 0.5
# pg_clipfrac = 2/6, pg_clipfrac_lower = 1/6,
# ppo_kl = mean(-log r) = -log(1.1 * 1.5 * 0.5 * 0.5 * 2 * 4) / 6 = -log(3.3) / 6
RATIOS = t([[1.1, 1.5, 0.5], [0.5, 2.0, 4.0]])
ADVS = t([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])


def ppo(logprobs, old, advantages, mask, mode="vanilla", low=0.2, high=0.2, agg="token-mean"):
    return compute_policy_loss(
        mode,
        old_logprobs=old,
        logprobs=logprobs,
        advantages=advantages,
        response_mask=mask,
        clip_ratio_low=low,
        clip_ratio_high=high,
        clip_ratio_c=3.0,
        loss_agg_mode=agg,
    )


def test_ppo_hand_worked_with_clip_and_dual_clip():
    logprobs = RATIOS.log().requires_grad_()
    loss, metrics = ppo(logprobs, torch.zeros(2, 3), ADVS, torch.ones(2, 3))
    close(loss, 0.5)
    close(metrics["pg_clipfrac"], 2 / 6)
    close(metrics["pg_clipfrac_lower"], 1 / 6)
    close(metrics["ppo_kl"], -math.log(3.3) / 6)
    assert set(metrics) == {"pg_clipfrac", "ppo_kl", "pg_clipfrac_lower"}
    assert all(v.dim() == 0 and not v.requires_grad for v in metrics.values())
    # d(-A r)/d log r = -A r, over 6 tokens; clipped and dual-clipped tokens get exactly 0.
    loss.backward()
    close(logprobs.grad, [[-1.1 / 6, 0.0, -0.5 / 6], [0.0, 2.0 / 6, 0.0]])


def test_ppo_clip_higher_is_asymmetric():
    # clip_ratio_high 0.28 (DAPO): with A = +1, r = 1.25 is inside [0.8, 1.28], r = 1.3 is not.
    logprobs = t([[math.log(1.25), math.log(1.3)]])
    loss, metrics = ppo(logprobs, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), high=0.28)
    close(loss, (-1.25 - 1.28) / 2)
    close(metrics["pg_clipfrac"], 0.5)


def test_ppo_padding_changes_nothing():
    base, _ = ppo(RATIOS.log(), torch.zeros(2, 3), ADVS, torch.ones(2, 3))
    pad = torch.tensor([[-math.inf], [5.0]])
    logprobs = torch.cat([RATIOS.log(), pad], dim=1).requires_grad_()
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]])
    loss, metrics = ppo(logprobs, torch.zeros(2, 4), torch.cat([ADVS, t([[7.0], [7.0]])], 1), mask)
    close(loss, base.item())
    close(metrics["ppo_kl"], -math.log(3.3) / 6)
    loss.backward()
    assert torch.isfinite(logprobs.grad).all() and not logprobs.grad[:, 3].any()


def test_ppo_rejects_dual_clip_bound_at_or_below_one():
    with pytest.raises(ValueError, match="clip_ratio_c"):
        compute_policy_loss(
            "vanilla",
            old_logprobs=torch.zeros(1, 1),
            logprobs=torch.zeros(1, 1),
            advantages=torch.ones(1, 1),
            response_mask=torch.ones(1, 1),
            clip_ratio_low=0.2,
            clip_ratio_high=0.2,
            clip_ratio_c=1.0,
        )


# --- GSPO --------------------------------------------------------------------------------------


def test_gspo_hand_worked():
    # Row 0, A = +1, token log-ratios 0.1, -0.1: geometric mean ratio exp(0) = 1 -> -1 per token,
    #   although vanilla PPO would see two token ratios 1.105 and 0.905.
    # Row 1, A = -1, log-ratios 0.2, 0.4 (then padding): exp(0.3) = 1.349859 > 1.2, so with A < 0
    #   the unclipped term wins: max(1.349859, 1.2) = 1.349859 per token.
    # seq-mean-token-mean = (-1 + 1.349859) / 2 = 0.174929.
    # Gradient per token = -A * s_i / len_i / N: row 0 -1 * 1 / 2 / 2 = -0.25;
    #   row 1 1.349859 / 2 / 2 = 0.337465; padding 0.
    old = t([[-1.0, -2.0, 0.0], [-1.0, -1.0, 0.0]])
    logprobs = (old + t([[0.1, -0.1, 0.0], [0.2, 0.4, 3.0]])).requires_grad_()
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    advantages = t([[1.0, 1.0, 0.0], [-1.0, -1.0, 0.0]])
    loss, metrics = ppo(logprobs, old, advantages, mask, mode="gspo", agg="seq-mean-token-mean")
    close(loss, 0.174929)
    close(metrics["pg_clipfrac"], 0.0)
    close(metrics["pg_clipfrac_lower"], 0.0)
    close(metrics["ppo_kl"], -(0.1 - 0.1 + 0.2 + 0.4) / 4)
    loss.backward()
    close(logprobs.grad, [[-0.25, -0.25, 0.0], [0.337465, 0.337465, 0.0]])


def test_gspo_clips_the_whole_sequence():
    # log-ratios 0.1, 0.3: sequence ratio exp(0.2) = 1.2214 > 1.2 with A = +1: both tokens clipped,
    # even the first whose own ratio exp(0.1) = 1.105 is inside the range.
    logprobs = t([[0.1, 0.3]]).requires_grad_()
    loss, metrics = ppo(logprobs, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), mode="gspo")
    close(loss, -1.2)
    close(metrics["pg_clipfrac"], 1.0)
    loss.backward()
    close(logprobs.grad, [[0.0, 0.0]])


@pytest.mark.parametrize("agg", AGG_MODES)
def test_gspo_equals_vanilla_when_token_ratios_within_a_sequence_are_equal(agg):
    # Same log-ratio on every token of a row makes the geometric mean the token ratio itself;
    # the offsets put one row inside the clip range and the others outside it on either side.
    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 4, generator=gen) * 3
    offsets = torch.tensor([[0.05], [0.4], [-0.5]])
    advantages = torch.tensor([[1.0], [1.0], [-0.7]]).expand(3, 4)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]])
    results = []
    for mode in ("vanilla", "gspo"):
        logprobs = (old + offsets).requires_grad_()
        loss, metrics = ppo(logprobs, old, advantages, mask, mode=mode, agg=agg)
        loss.backward()
        results.append((loss, logprobs.grad, metrics["pg_clipfrac"]))
    (loss_v, grad_v, frac_v), (loss_g, grad_g, frac_g) = results
    torch.testing.assert_close(loss_g, loss_v)
    torch.testing.assert_close(grad_g, grad_v)
    torch.testing.assert_close(frac_g, frac_v)
    assert 0 < frac_v < 1  # the case really exercises clipped and unclipped rows


def test_policy_loss_registry():
    with pytest.raises(ValueError, match="'ppo2'.*gspo.*vanilla"):
        ppo(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1), mode="ppo2")

    @register_policy_loss("test_reinforce")
    def reinforce(*, logprobs, advantages, response_mask, loss_agg_mode, **_):
        return agg_loss(-advantages * logprobs, response_mask, loss_agg_mode), {}

    try:
        loss, _ = ppo(
            t([[-1.0, -3.0]]), torch.zeros(1, 2), t([[2.0, 1.0]]), torch.ones(1, 2), "test_reinforce"
        )
        close(loss, (2.0 + 3.0) / 2)  # -(2 * -1) and -(1 * -3), token mean
        with pytest.raises(ValueError, match="already registered"):
            register_policy_loss("test_reinforce")(lambda **_: None)
    finally:
        POLICY_LOSSES.pop("test_reinforce", None)


# --- value and entropy losses ------------------------------------------------------------------


def test_value_loss_hand_worked():
    # cliprange 0.2; V_clip = V_old + clip(V - V_old, -0.2, 0.2).
    #   t0: V_old 1, V 1.5, G 2: V_clip 1.2; (1.5-2)^2 = 0.25, (1.2-2)^2 = 0.64 -> 0.64 (clipped)
    #   t1: V_old 1, V 1.5, G 1: V_clip 1.2; 0.25 vs 0.04 -> 0.25
    #   t2: V_old 0, V 0.1, G 1: inside; 0.81 vs 0.81 -> 0.81
    #   t3: padding.
    # loss = 0.5 * (0.64 + 0.25 + 0.81) / 3 = 0.283333; vf_clipfrac = 1/3.
    # dloss/dV = 0.5 * 2 (V - G) / 3 on unclipped tokens: t1 0.5/3, t2 -0.9/3; t0 and t3 0.
    values = t([[1.5, 1.5, 0.1, 50.0]]).requires_grad_()
    old_values, returns = t([[1.0, 1.0, 0.0, 0.0]]), t([[2.0, 1.0, 1.0, -50.0]])
    loss, metrics = compute_value_loss(values, old_values, returns, torch.tensor([[1, 1, 1, 0]]), 0.2)
    close(loss, 0.5 * 1.7 / 3)
    close(metrics["vf_clipfrac"], 1 / 3)
    assert set(metrics) == {"vf_clipfrac"} and not metrics["vf_clipfrac"].requires_grad
    loss.backward()
    close(values.grad, [[0.0, 0.5 / 3, -0.9 / 3, 0.0]])


def test_value_loss_agg_mode_is_honoured():
    # Squared errors 1 and 4 on one response of two tokens (no clipping at c = 10): token sum 5.
    values, returns = t([[1.0, 2.0]]), t([[0.0, 0.0]])
    loss, _ = compute_value_loss(values, values, returns, torch.ones(1, 2), 10.0, "seq-mean-token-sum")
    close(loss, 0.5 * 5)


def test_entropy_loss_is_the_aggregate():
    close(compute_entropy_loss(LOSS_MAT, LOSS_MASK, "token-mean"), 17 / 5)
    close(compute_entropy_loss(LOSS_MAT, LOSS_MASK, "seq-mean-token-mean"), 3.75)


def test_agg_loss_with_minibatch_scale_divides_by_the_minibatch_counts():
    from relm.algorithms.losses import AggScale

    loss = torch.tensor([[1.0, 2.0], [3.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    scale = AggScale(num_tokens=6.0, num_seqs=4.0)  # this micro-batch is half of a mini-batch
    # token-mean: (1 + 2 + 3) / 6 = 1.0
    assert agg_loss(loss, mask, "token-mean", scale).item() == pytest.approx(1.0)
    # seq-mean-token-sum: (3 + 3) / 4 = 1.5
    assert agg_loss(loss, mask, "seq-mean-token-sum", scale).item() == pytest.approx(1.5)
    # seq-mean-token-mean: (3/2 + 3/1) / 4 = 1.125
    assert agg_loss(loss, mask, "seq-mean-token-mean", scale).item() == pytest.approx(1.125)
    # seq-mean-token-sum-norm: the seq-mean-token-sum over R = 2: 1.5 / 2 = 0.75
    assert agg_loss(loss, mask, "seq-mean-token-sum-norm", scale).item() == pytest.approx(0.75)
    # token-sum needs no count: 6.0, scale or not
    assert agg_loss(loss, mask, "token-sum", scale).item() == pytest.approx(6.0)
    assert AggScale.of(mask) == AggScale(num_tokens=3.0, num_seqs=2.0)
