"""relm's loss aggregation, policy losses (loss and gradient), value loss, KL estimators and KL
controllers against verl 0.9.1's on random batches.

Batches have right padding of random length, empty responses and masks with holes; padded positions hold
random finite numbers (verl multiplies by the mask, so it cannot take the `-inf` relm tolerates there).
Each aggregation is compared twice: on its own (verl given no global batch counts) and with the
mini-batch's counts (relm's `AggScale`, verl's `batch_num_tokens` / `global_batch_size`, as its trainer
passes them).
"""

from __future__ import annotations

import pytest
import torch

from relm.algorithms import POLICY_LOSSES
from relm.algorithms.kl import KL_KINDS, AdaptiveKLController, kl_estimate
from relm.algorithms.losses import (
    AGG_MODES,
    AggScale,
    LossParams,
    agg_loss,
    compute_policy_loss,
    compute_value_loss,
)

pytestmark = pytest.mark.verl

NUM_CASES = 150


def random_batch(seed: int) -> dict:
    """Logprobs, advantages, values and a mask with padding, empty rows and holes; float64."""
    gen = torch.Generator().manual_seed(seed)
    num_rows = int(torch.randint(1, 7, (1,), generator=gen))
    width = int(torch.randint(1, 9, (1,), generator=gen))
    lengths = torch.randint(0, width + 1, (num_rows,), generator=gen)
    mask = (torch.arange(width) < lengths[:, None]).long()  # [N, R]
    if seed % 3 == 0:
        mask = mask * (torch.rand(num_rows, width, generator=gen) > 0.25).long()
    if not mask.any():
        mask[0, 0] = 1  # verl's token-mean divides by zero without a valid token (tested on its own)
    old = -torch.rand(num_rows, width, generator=gen, dtype=torch.float64) * 4
    # Log-ratios up to +-1.5 put ratios far outside the clip range and past the dual clip c = 3.
    logprobs = old + (torch.rand(num_rows, width, generator=gen, dtype=torch.float64) - 0.5) * 3
    return {
        "mask": mask,
        "old_logprobs": old,
        "logprobs": logprobs,
        "ref_logprobs": old + torch.randn(num_rows, width, generator=gen, dtype=torch.float64),
        "advantages": torch.randn(num_rows, width, generator=gen, dtype=torch.float64),
        "values": torch.randn(num_rows, width, generator=gen, dtype=torch.float64),
        "old_values": torch.randn(num_rows, width, generator=gen, dtype=torch.float64),
        "returns": torch.randn(num_rows, width, generator=gen, dtype=torch.float64),
        "loss_mat": torch.randn(num_rows, width, generator=gen, dtype=torch.float64),
    }


def minibatch_counts(mask: torch.Tensor) -> tuple[AggScale, dict]:
    """The same mini-batch counts for relm and for verl (whose trainer counts every row)."""
    scale = AggScale.of(mask)
    return scale, {"dp_size": 1, "batch_num_tokens": scale.num_tokens, "global_batch_size": scale.num_seqs}


def close(relm_value, verl_value, what: str, atol: float = 1e-8) -> None:
    # verl's per-response token mean divides by count + 1e-8: relative differences of 1e-8 / count.
    torch.testing.assert_close(
        torch.as_tensor(relm_value, dtype=torch.float64), torch.as_tensor(verl_value, dtype=torch.float64),
        rtol=1e-6, atol=atol, msg=what,
    )  # fmt: skip


# --- agg_loss -------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", AGG_MODES)
def test_agg_loss_matches_verl(verl, mode):
    for seed in range(NUM_CASES):
        batch = random_batch(seed)
        loss_mat, mask = batch["loss_mat"], batch["mask"]
        scale, counts = minibatch_counts(mask)
        alone = verl.core_algos.agg_loss(loss_mat, mask.double(), mode)
        close(agg_loss(loss_mat, mask, mode), alone, f"{mode} seed {seed}")
        counted = verl.core_algos.agg_loss(loss_mat, mask.double(), mode, **counts)
        close(agg_loss(loss_mat, mask, mode, scale), counted, f"{mode} seed {seed} with counts")
        if mode == "seq-mean-token-sum-norm":
            factored = verl.core_algos.agg_loss(loss_mat, mask.double(), mode, **counts, loss_scale_factor=64)
            close(agg_loss(loss_mat, mask, mode, scale, loss_scale_factor=64), factored, f"seed {seed} x64")


def test_seq_mean_token_sum_norm_of_ones_is_one_in_both(verl):
    ones = torch.ones(2, 4)
    assert verl.core_algos.agg_loss(ones, ones, "seq-mean-token-sum-norm").item() == 1.0
    assert agg_loss(ones, ones, "seq-mean-token-sum-norm").item() == 1.0


def test_token_mean_of_no_valid_token_is_zero_where_verl_gives_nan(verl):
    # A deliberate difference (docs/algorithms.md): an all-padding micro-batch must not make the step NaN.
    loss_mat, mask = torch.ones(2, 3), torch.zeros(2, 3)
    assert torch.isnan(verl.core_algos.agg_loss(loss_mat, mask, "token-mean"))
    assert agg_loss(loss_mat, mask, "token-mean").item() == 0.0


# --- policy losses: loss, gradient and metrics --------------------------------------------------------


def verl_actor_config(
    verl, low: float, high: float, clip_ratio_c: float, counts: dict | None, params: LossParams | None = None
):
    """verl's `ActorConfig` with the clip ranges, the global counts and the settings `params` holds."""
    params = LossParams() if params is None else params
    config = verl.ActorConfig(
        strategy="fsdp", clip_ratio=low, clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=clip_ratio_c,
        ppo_micro_batch_size_per_gpu=1, rollout_n=1, tau_pos=params.tau_pos, tau_neg=params.tau_neg,
        policy_loss=verl.PolicyLossConfig(
            clip_cov_ratio=params.clip_cov_ratio, clip_cov_lb=params.clip_cov_lb, clip_cov_ub=params.clip_cov_ub,
            kl_cov_ratio=params.kl_cov_ratio, ppo_kl_coef=params.ppo_kl_coef, dro_beta=params.dro_beta,
        ),
    )  # fmt: skip
    if counts is not None:
        config.global_batch_info.update(counts)
    return config


def loss_params(seed: int) -> LossParams:
    """verl's defaults on even seeds; on odd ones other temperatures, a DRO weight and covariance shares
    large enough that Clip-Cov and KL-Cov act on many tokens of these small batches."""
    if seed % 2 == 0:
        return LossParams(dro_beta=0.1)  # DRO has no default
    return LossParams(
        tau_pos=2.0, tau_neg=3.5, clip_cov_ratio=0.3, clip_cov_lb=0.2, clip_cov_ub=3.0, kl_cov_ratio=0.25,
        ppo_kl_coef=1.0, dro_beta=1.5,
    )  # fmt: skip


def policy_losses_agree(verl, loss_mode: str, agg_mode: str, seed: int, with_counts: bool) -> None:
    batch = random_batch(seed)
    mask = batch["mask"]
    scale, counts = minibatch_counts(mask)
    low, high = (0.2, 0.28) if seed % 2 else (3e-4, 4e-4)  # DAPO's clip-higher; GSPO's tiny ranges
    params = loss_params(seed)
    results = []
    for side in ("relm", "verl"):
        logprobs = batch["logprobs"].clone().requires_grad_(True)
        torch.manual_seed(seed)  # Clip-Cov's draw: both sides start from the same generator state
        if side == "relm":
            loss, metrics = compute_policy_loss(
                loss_mode, old_logprobs=batch["old_logprobs"], logprobs=logprobs, advantages=batch["advantages"],
                response_mask=mask, clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=3.0,
                loss_agg_mode=agg_mode, agg_scale=scale if with_counts else None, params=params,
            )  # fmt: skip
            metrics = {key: float(value) for key, value in metrics.items()}
        else:
            loss_fn = verl.core_algos.get_policy_loss_fn(loss_mode)
            loss, metrics = loss_fn(
                old_log_prob=batch["old_logprobs"], log_prob=logprobs, advantages=batch["advantages"],
                response_mask=mask.double(), loss_agg_mode=agg_mode,
                config=verl_actor_config(verl, low, high, 3.0, counts if with_counts else None, params),
            )  # fmt: skip
            metrics = {key.removeprefix("actor/"): value for key, value in metrics.items()}
        (grad,) = torch.autograd.grad(loss, logprobs)
        results.append((loss.detach(), grad, metrics))
    (relm_loss, relm_grad, relm_metrics), (verl_loss, verl_grad, verl_metrics) = results
    what = f"{loss_mode} {agg_mode} seed {seed} counts={with_counts}"
    close(relm_loss, verl_loss, what + " loss")
    close(relm_grad, verl_grad, what + " gradient")
    assert relm_metrics.keys() == verl_metrics.keys()
    for key, value in relm_metrics.items():
        # bypass_mode's `rollout_corr/..._std`: verl's 1e-8 under a square root (test_verl_rollout_correction.py)
        close(value, verl_metrics[key], f"{what} {key}", atol=1e-3 if key.endswith("_std") else 1e-8)


POLICY_LOSS_MODES = [
    "vanilla", "gspo", "gpg", "cispo", "geo_mean", "dppo_tv", "dppo_kl", "sapo", "dro", "clip_cov", "kl_cov",
    "bypass_mode",
]  # fmt: skip
"""verl 0.9.1's registry; `bypass_mode` here with verl's default (no) correction, with each correction in
tests/parity/test_verl_rollout_correction.py."""


def test_every_policy_loss_of_verls_registry_is_compared(verl):
    assert sorted(verl.core_algos.POLICY_LOSS_REGISTRY) == sorted(POLICY_LOSS_MODES)
    assert set(POLICY_LOSS_MODES) <= set(POLICY_LOSSES)


@pytest.mark.parametrize("agg_mode", AGG_MODES)
@pytest.mark.parametrize("loss_mode", POLICY_LOSS_MODES)
def test_policy_loss_and_gradient_match_verl(verl, loss_mode, agg_mode):
    for seed in range(NUM_CASES // 3):
        policy_losses_agree(verl, loss_mode, agg_mode, seed, with_counts=False)
        policy_losses_agree(verl, loss_mode, agg_mode, seed, with_counts=True)


@pytest.mark.parametrize("loss_mode", ["cispo", "geo_mean", "dppo_tv", "dppo_kl"])
def test_the_random_batches_reach_the_clip_of_each_new_loss(verl, loss_mode):
    # Without this the comparison above could pass on batches where no clip or divergence bound binds.
    clipped = 0.0
    for seed in range(NUM_CASES // 3):
        batch = random_batch(seed)
        _, metrics = compute_policy_loss(
            loss_mode, old_logprobs=batch["old_logprobs"], logprobs=batch["logprobs"],
            advantages=batch["advantages"], response_mask=batch["mask"], clip_ratio_low=0.2, clip_ratio_high=0.28,
        )  # fmt: skip
        clipped += float(metrics["pg_clipfrac"])
    assert clipped > 1.0


def test_the_random_batches_reach_the_covariance_selections(verl):
    # Without this Clip-Cov and KL-Cov could agree with verl on batches where they pick no token.
    clip_cov_dropped = kl_cov_moved = 0.0
    for seed in range(1, NUM_CASES // 3, 2):  # the seeds with large covariance shares (loss_params)
        batch = random_batch(seed)
        common = dict(
            old_logprobs=batch["old_logprobs"], logprobs=batch["logprobs"], advantages=batch["advantages"],
            response_mask=batch["mask"], clip_ratio_low=0.2, clip_ratio_high=0.28,
        )  # fmt: skip
        _, metrics = compute_policy_loss("clip_cov", **common, params=loss_params(seed))
        clip_cov_dropped += float(metrics["pg_clipfrac"])
        penalised, _ = compute_policy_loss("kl_cov", **common, params=loss_params(seed))
        plain, _ = compute_policy_loss(
            "kl_cov", **common, params=LossParams(kl_cov_ratio=1e-9, ppo_kl_coef=0.0)
        )
        kl_cov_moved += float((penalised - plain).abs())
    assert clip_cov_dropped > 1.0 and kl_cov_moved > 1.0


def test_the_random_batches_reach_the_clip_and_the_dual_clip(verl):
    # Without this the vanilla comparison could pass on batches where no clip ever binds.
    clipped = dual = 0.0
    for seed in range(NUM_CASES // 3):
        batch = random_batch(seed)
        _, metrics = compute_policy_loss(
            "vanilla", old_logprobs=batch["old_logprobs"], logprobs=batch["logprobs"],
            advantages=batch["advantages"], response_mask=batch["mask"], clip_ratio_low=0.2, clip_ratio_high=0.28,
        )  # fmt: skip
        clipped += float(metrics["pg_clipfrac"])
        dual += float(metrics["pg_clipfrac_lower"])
    assert clipped > 1.0 and dual > 1.0


# --- value loss -----------------------------------------------------------------------------------


@pytest.mark.parametrize("agg_mode", AGG_MODES)
def test_value_loss_and_gradient_match_verl(verl, agg_mode):
    for seed in range(NUM_CASES):
        batch = random_batch(seed)
        mask = batch["mask"]
        scale, counts = minibatch_counts(mask)
        for with_counts in (False, True):
            values = batch["values"].clone().requires_grad_(True)
            loss, metrics = compute_value_loss(
                values, batch["old_values"], batch["returns"], mask, cliprange_value=0.5,
                loss_agg_mode=agg_mode, agg_scale=scale if with_counts else None,
            )  # fmt: skip
            (grad,) = torch.autograd.grad(loss, values)
            verl_values = batch["values"].clone().requires_grad_(True)
            verl_loss, verl_clipfrac = verl.core_algos.compute_value_loss(
                verl_values, batch["returns"], batch["old_values"], mask.double(), 0.5, agg_mode,
                **(counts if with_counts else {}),
            )  # fmt: skip
            (verl_grad,) = torch.autograd.grad(verl_loss, verl_values)
            what = f"value {agg_mode} seed {seed} counts={with_counts}"
            close(loss.detach(), verl_loss.detach(), what)
            close(grad, verl_grad, what + " gradient")
            close(metrics["vf_clipfrac"], verl_clipfrac, what + " clipfrac")


# --- KL -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KL_KINDS)
def test_kl_estimate_value_and_gradient_match_verl(verl, kind):
    for seed in range(NUM_CASES):
        batch = random_batch(seed)
        # Log-ratios up to +-25 reach the clamps of low_var_kl (20 before exp, 10 after).
        ref = batch["ref_logprobs"] * (1 + 6 * (seed % 2))
        grads = []
        for estimate in (kl_estimate, verl.core_algos.kl_penalty):
            logprobs = batch["logprobs"].clone().requires_grad_(True)
            value = estimate(logprobs, ref, kind)
            (grad,) = torch.autograd.grad(value.sum(), logprobs)
            grads.append((value.detach(), grad))
        close(grads[0][0], grads[1][0], f"{kind} seed {seed} value")
        close(grads[0][1], grads[1][1], f"{kind} seed {seed} gradient")


def test_kl_kinds_are_verls(verl):
    for kind in KL_KINDS:
        verl.core_algos.kl_penalty(torch.zeros(1), torch.zeros(1), kind)  # raises on a name verl lacks
    with pytest.raises(ValueError, match="unknown KL estimator 'full'"):
        kl_estimate(torch.zeros(1), torch.zeros(1), "full")  # verl's `full` needs whole distributions


def test_adaptive_kl_controller_follows_verl(verl):
    gen = torch.Generator().manual_seed(0)
    ours = AdaptiveKLController(init_kl_coef=0.2, target_kl=0.05, horizon=1000)
    theirs = verl.core_algos.AdaptiveKLController(init_kl_coef=0.2, target_kl=0.05, horizon=1000)
    for _ in range(200):
        current_kl, n_steps = float(torch.rand(1, generator=gen)) * 0.2, int(torch.randint(1, 512, (1,)))
        ours.update(current_kl, n_steps)
        theirs.update(current_kl, n_steps)
        assert ours.value == pytest.approx(theirs.value, rel=1e-12)
