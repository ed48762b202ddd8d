"""relm's rollout correction (importance weights, rejection, gap metrics, bypass-mode loss) against verl 0.9.1's
`rollout_corr_helper` and `compute_policy_loss_bypass_mode`, and relm's parsing of the threshold keys against
verl's parsers.

Batches have right padding, empty responses and holes; the engine's logprobs differ from the trainer's by
log-ratios up to +-1.5 (a tenth of the tokens by up to +-30, past the +-20 safety clamp), so truncation,
IcePop's zeroing and every rejection option bind somewhere.
"""

from __future__ import annotations

import pytest
import torch

from relm.algorithms.losses import AggScale, LossParams, compute_policy_loss
from relm.algorithms.rollout_correction import bypass_policy_loss, correct
from relm.config.rollout_correction import RS_OPTIONS, parse_rollout_correction
from relm.config.schema import RolloutCorrectionConfig
from relm.errors import UserError

pytestmark = pytest.mark.verl

NUM_CASES = 40

IS_SETTINGS = [
    (None, 2.0, False),
    ("token", 2.0, False),
    ("token", "0.5_1.5", False),
    ("token", 1.5, True),
    ("sequence", 2.0, False),
    ("sequence", "0.2_5.0", True),
    ("sequence", 10.0, True),
]
RS_SETTINGS = [(None, None)]
RS_SETTINGS += [(option, "0.5_1.8" if option.endswith("k1") else 0.3) for option in RS_OPTIONS]
RS_SETTINGS += [
    ("seq_mean_k1", 1.5),
    ("token_k1,seq_max_k2", "0.6_1.6,2.5"),
    ("token_k3,seq_sum_k2,seq_mean_k3", 0.8),
]


def random_batch(seed: int) -> dict:
    """float64 logprobs of the trainer and the engine over a mask with padding, empty rows and holes."""
    gen = torch.Generator().manual_seed(seed)
    num_rows = int(torch.randint(1, 7, (1,), generator=gen))
    width = int(torch.randint(1, 9, (1,), generator=gen))
    lengths = torch.randint(0, width + 1, (num_rows,), generator=gen)
    mask = (torch.arange(width) < lengths[:, None]).long()  # [N, R]
    if seed % 3 == 0:
        mask = mask * (torch.rand(num_rows, width, generator=gen) > 0.25).long()
    if not mask.any():
        mask[0, 0] = 1  # verl refuses a batch without a valid token
    old = -torch.rand(num_rows, width, generator=gen, dtype=torch.float64) * 4
    gap = (torch.rand(num_rows, width, generator=gen, dtype=torch.float64) - 0.5) * 3
    wild = torch.rand(num_rows, width, generator=gen) < 0.1
    gap = torch.where(wild, gap * 20, gap)
    return {
        "mask": mask,
        "old": old,
        "rollout": old - gap,
        "current": old + (torch.rand(num_rows, width, generator=gen, dtype=torch.float64) - 0.5),
        "advantages": torch.randn(num_rows, width, generator=gen, dtype=torch.float64),
    }


def section(
    rollout_is, is_threshold, normalize, rollout_rs, rs_threshold, **extra
) -> RolloutCorrectionConfig:
    return RolloutCorrectionConfig(
        rollout_is=rollout_is, rollout_is_threshold=is_threshold, rollout_is_batch_normalize=normalize,
        rollout_rs=rollout_rs, rollout_rs_threshold=rs_threshold, **extra,
    )  # fmt: skip


def close(relm_value, verl_value, what: str, atol: float = 1e-8) -> None:
    # verl's masked means divide by count + 1e-8: relative differences of 1e-8 / count.
    torch.testing.assert_close(
        torch.as_tensor(relm_value, dtype=torch.float64), torch.as_tensor(verl_value, dtype=torch.float64),
        rtol=1e-6, atol=atol, msg=what,
    )  # fmt: skip


def metrics_agree(relm_metrics: dict, verl_metrics: dict, what: str) -> None:
    assert sorted(relm_metrics) == sorted(verl_metrics), what
    for key, value in relm_metrics.items():
        # A std is sqrt(E[x^2] - E[x]^2): verl's 1e-8 in the denominators leaves ~1e-8 x^2 in that difference,
        # so where the true spread is 0 (every weight truncated to 2) verl reports sqrt(4e-8 / n) ~ 1e-4.
        close(float(value), verl_metrics[key], f"{what} {key}", atol=1e-3 if key.endswith("_std") else 1e-8)


@pytest.mark.parametrize("is_setting", IS_SETTINGS, ids=str)
@pytest.mark.parametrize("rs_setting", RS_SETTINGS, ids=str)
def test_weights_mask_and_metrics_match_verl(verl, is_setting, rs_setting):
    spec = parse_rollout_correction(section(*is_setting, *rs_setting))
    for seed in range(NUM_CASES):
        batch = random_batch(seed)
        mask = batch["mask"]
        ours = correct(batch["old"], batch["rollout"], mask, spec)
        what = f"{is_setting} {rs_setting} seed {seed}"
        try:
            weights, kept, metrics = verl.rollout_corr.compute_rollout_correction_and_rejection_mask(
                old_log_prob=batch["old"], rollout_log_prob=batch["rollout"], response_mask=mask.double(),
                rollout_is=is_setting[0], rollout_is_threshold=is_setting[1],
                rollout_is_batch_normalize=is_setting[2], rollout_rs=rs_setting[0], rollout_rs_threshold=rs_setting[1],
            )  # fmt: skip
        except ZeroDivisionError:
            # verl's effective sample size divides by zero when IcePop zeroes every weight; relm reports 0.
            assert float(ours.metrics["rollout_corr/rollout_is_eff_sample_size"]) == 0.0, what
            assert not ours.weights.any(), what
            continue
        torch.testing.assert_close(ours.response_mask.double(), kept, msg=what + " mask")
        if weights is None:
            assert ours.weights is None, what
        else:
            assert ours.weights is not None, what
            # Only the valid tokens' weights reach the loss; verl's sequence weights sit on padding too.
            close(ours.weights * mask, weights.batch["rollout_is_weights"] * mask, what + " weights")
        metrics_agree(ours.metrics, metrics, what)


def test_the_random_batches_reach_every_bound(verl):
    # Without this the comparisons above could pass on batches where nothing is truncated or rejected.
    truncated = zeroed = rejected = 0.0
    for seed in range(NUM_CASES):
        batch = random_batch(seed)
        spec = parse_rollout_correction(section("token", "0.5_1.5", False, "seq_max_k2", 0.3))
        metrics = correct(batch["old"], batch["rollout"], batch["mask"], spec).metrics
        zeroed += float(metrics["rollout_corr/rollout_is_oob_ratio"])
        rejected += float(metrics["rollout_corr/rollout_rs_seq_masked_fraction"])
        spec = parse_rollout_correction(section("token", 2.0, False, None, None))
        metrics = correct(batch["old"], batch["rollout"], batch["mask"], spec).metrics
        truncated += float(metrics["rollout_corr/rollout_is_ratio_fraction_high"])
    assert truncated > 1.0 and zeroed > 1.0 and rejected > 1.0


@pytest.mark.parametrize("loss_type", ["ppo_clip", "reinforce"])
@pytest.mark.parametrize(
    "is_setting,rs_setting",
    [((None, 2.0, False), (None, None)), (("token", 2.0, False), ("token_k1", "0.5_1.8")),
     (("sequence", 5.0, True), ("seq_mean_k3", 0.3)), (("token", "0.5_1.5", False), (None, None))],
    ids=str,
)  # fmt: skip
@pytest.mark.parametrize("agg_mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_bypass_mode_loss_gradient_and_metrics_match_verl(verl, loss_type, is_setting, rs_setting, agg_mode):
    spec = parse_rollout_correction(section(*is_setting, *rs_setting, bypass_mode=True, loss_type=loss_type))
    verl_section = verl.RolloutCorrectionConfig(
        rollout_is=is_setting[0], rollout_is_threshold=is_setting[1], rollout_is_batch_normalize=is_setting[2],
        rollout_rs=rs_setting[0], rollout_rs_threshold=rs_setting[1], bypass_mode=True, loss_type=loss_type,
    )  # fmt: skip
    for seed in range(NUM_CASES // 2):
        batch = random_batch(seed)
        mask = batch["mask"]
        scale = AggScale.of(mask)
        config = verl.ActorConfig(
            strategy="fsdp", clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0,
            ppo_micro_batch_size_per_gpu=1, rollout_n=1,
            policy_loss=verl.PolicyLossConfig(loss_mode="bypass_mode", rollout_correction=verl_section),
        )  # fmt: skip
        config.global_batch_info.update(
            {"dp_size": 1, "batch_num_tokens": scale.num_tokens, "global_batch_size": scale.num_seqs}
        )
        ours_lp = batch["current"].clone().requires_grad_(True)
        loss, metrics = bypass_policy_loss(
            "vanilla", spec, rollout_logprobs=batch["rollout"], logprobs=ours_lp, advantages=batch["advantages"],
            response_mask=mask, clip_ratio_low=0.2, clip_ratio_high=0.28, loss_agg_mode=agg_mode, agg_scale=scale,
        )  # fmt: skip
        (grad,) = torch.autograd.grad(loss, ours_lp)
        # verl's loss name `bypass_mode`, as relm's registry runs it, is the same function
        named_lp = batch["current"].clone().requires_grad_(True)
        named_loss, named_metrics = compute_policy_loss(
            "bypass_mode", old_logprobs=batch["rollout"], logprobs=named_lp, advantages=batch["advantages"],
            response_mask=mask, clip_ratio_low=0.2, clip_ratio_high=0.28, loss_agg_mode=agg_mode, agg_scale=scale,
            params=LossParams(correction=spec),
        )  # fmt: skip
        torch.testing.assert_close(named_loss, loss)
        torch.testing.assert_close(torch.autograd.grad(named_loss, named_lp)[0], grad)
        assert sorted(named_metrics) == sorted(metrics)
        verl_lp = batch["current"].clone().requires_grad_(True)
        what = f"{loss_type} {is_setting} {rs_setting} {agg_mode} seed {seed}"
        try:
            verl_loss, verl_metrics = verl.core_algos.compute_policy_loss_bypass_mode(
                old_log_prob=batch["rollout"], log_prob=verl_lp, advantages=batch["advantages"],
                response_mask=mask.double(), loss_agg_mode=agg_mode, config=config,
            )  # fmt: skip
        except ZeroDivisionError:  # IcePop zeroed every weight (see test_weights_mask_and_metrics_match_verl)
            assert float(metrics["rollout_corr/rollout_is_eff_sample_size"]) == 0.0, what
            continue
        (verl_grad,) = torch.autograd.grad(verl_loss, verl_lp)
        close(loss.detach(), verl_loss.detach(), what + " loss")
        close(grad, verl_grad, what + " gradient")
        verl_metrics = {key.removeprefix("actor/"): value for key, value in verl_metrics.items()}
        metrics_agree(metrics, verl_metrics, what)


@pytest.mark.parametrize("loss_mode", ["vanilla", "gspo"])
def test_decoupled_weights_multiply_the_policy_loss_as_verls(verl, loss_mode):
    spec = parse_rollout_correction(section("token", 2.0, False, None, None))
    for seed in range(NUM_CASES):
        batch = random_batch(seed)
        mask = batch["mask"]
        weights = correct(batch["old"], batch["rollout"], mask, spec).weights
        results = []
        for side in ("relm", "verl"):
            logprobs = batch["current"].clone().requires_grad_(True)
            if side == "relm":
                loss, _ = compute_policy_loss(
                    loss_mode, old_logprobs=batch["old"], logprobs=logprobs, advantages=batch["advantages"],
                    response_mask=mask, clip_ratio_low=0.2, clip_ratio_high=0.28, rollout_is_weights=weights,
                )  # fmt: skip
            else:
                config = verl.ActorConfig(
                    strategy="fsdp", clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28,
                    ppo_micro_batch_size_per_gpu=1, rollout_n=1,
                )  # fmt: skip
                loss, _ = verl.core_algos.get_policy_loss_fn(loss_mode)(
                    old_log_prob=batch["old"], log_prob=logprobs, advantages=batch["advantages"],
                    response_mask=mask.double(), loss_agg_mode="token-mean", config=config, rollout_is_weights=weights,
                )  # fmt: skip
            (grad,) = torch.autograd.grad(loss, logprobs)
            results.append((loss.detach(), grad))
        close(results[0][0], results[1][0], f"{loss_mode} seed {seed} loss")
        close(results[0][1], results[1][1], f"{loss_mode} seed {seed} gradient")


IS_THRESHOLDS = [2.0, 3, "2.5", "0.5_5.0", "1_1", "0.0", "-1", "5_0.5", "abc", "0_2"]
RS_CASES = [
    ("token_k1", 2.0), ("token_k1", "0.5_1.5"), ("seq_sum_k2", 0.5), ("seq_sum_k2", "0.1_0.5"),
    ("token_k1,seq_max_k3", "0.6_1.6,2.5"), ("token_k1,seq_max_k3", "1.5"), ("token_k1,seq_max_k3", "1,2,3"),
    ("seq_mean_k3", None), ("seq_mean_k1", "2_1"), ("token_k2", "-0.5"), ("token_k5", 1.0), ("token_k1,token_k1", 2),
]  # fmt: skip


@pytest.mark.parametrize("threshold", IS_THRESHOLDS, ids=str)
def test_is_threshold_parsing_matches_verl(verl, threshold):
    try:
        expected = verl.rollout_corr._parse_rollout_is_threshold(threshold)
    except (TypeError, ValueError):
        expected = None
    if expected is None:
        with pytest.raises(UserError, match="rollout_is_threshold"):
            parse_rollout_correction(section("token", threshold, False, None, None))
        return
    spec = parse_rollout_correction(section("token", threshold, False, None, None))
    assert (spec.is_upper, spec.is_lower) == expected


@pytest.mark.parametrize("options,threshold", RS_CASES, ids=str)
def test_rs_threshold_parsing_matches_verl(verl, options, threshold):
    names = list(dict.fromkeys(part.strip() for part in options.split(",")))
    try:
        if any(name not in verl.rollout_corr.SUPPORTED_ROLLOUT_RS_OPTIONS for name in names):
            raise ValueError("unknown option")
        expected = verl.rollout_corr._parse_rollout_rs_thresholds(names, threshold)
    except (TypeError, ValueError):
        expected = None
    if expected is None:
        with pytest.raises(UserError, match="rollout_rs"):
            parse_rollout_correction(section(None, 2.0, False, options, threshold))
        return
    spec = parse_rollout_correction(section(None, 2.0, False, options, threshold))
    assert {b.option: {"lower": b.lower, "upper": b.upper} for b in spec.rejection} == expected
