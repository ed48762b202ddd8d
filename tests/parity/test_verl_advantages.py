"""relm's advantage estimators against verl 0.9.1's on random batches.

Each case has groups of 1 to 4 responses (size-1 groups and groups whose scores are all equal included),
right padding of random length, empty responses, and masks with holes (a multi-turn response's
observation tokens). Rewards are 0 outside the mask, as the trainer writes them, except for responses the
rollout correction rejects: their mask is dropped and their score stays, which verl's group statistics
count. Values are compared on the valid tokens: outside them relm writes 0 and verl whatever its arithmetic left there.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from relm.algorithms.advantages import _group_normalised, compute_advantages

pytestmark = pytest.mark.verl

NUM_CASES = 300


def random_case(seed: int) -> dict:
    """One batch: token rewards, values, mask, group ids and greedy baselines, float64."""
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, 5, (int(torch.randint(1, 6, (1,), generator=gen)),), generator=gen)
    group_ids = torch.repeat_interleave(torch.arange(len(sizes)), sizes)
    group_ids = group_ids[torch.randperm(len(group_ids), generator=gen)]  # a group's rows are not adjacent
    num_rows = len(group_ids)
    width = int(torch.randint(2, 9, (1,), generator=gen))
    lengths = torch.randint(0, width + 1, (num_rows,), generator=gen)
    mask = (torch.arange(width) < lengths[:, None]).long()  # [N, R] right padding, empty rows
    if seed % 3 == 0:  # holes: observation tokens inside a response
        mask = mask * (torch.rand(num_rows, width, generator=gen) > 0.25).long()
    if int(mask.sum()) < 2:  # verl's whitening raises below two tokens (tested on its own below)
        mask[0, :] = 1
        mask[-1, :] = 1
    valid = mask.bool()
    # Outcome scores on the last valid token, shared by a whole group where the group is all-equal.
    scores = torch.randint(0, 3, (num_rows,), generator=gen).double()
    if seed % 4 == 0:
        scores = torch.randn(num_rows, generator=gen, dtype=torch.float64)
    equal_groups = torch.rand(len(sizes), generator=gen) < 0.3
    scores = torch.where(equal_groups[group_ids], 1.0, scores)
    positions = torch.arange(width).expand(num_rows, width)
    last = torch.where(valid, positions, -1).amax(dim=1)
    token_rewards = torch.zeros(num_rows, width, dtype=torch.float64)
    rows = torch.nonzero(last >= 0).squeeze(1)
    token_rewards[rows, last[rows]] = scores[rows]
    if seed % 5 == 0:  # dense rewards too (a KL penalty on every token)
        token_rewards = token_rewards + torch.where(
            valid, 0.1 * torch.randn(num_rows, width, generator=gen), 0.0
        )
    if (
        seed % 7 == 3
    ):  # rejected by the rollout correction: the mask drops whole responses, their rewards stay
        rejected = torch.rand(num_rows, generator=gen) < 0.3
        rejected[0] = rejected[-1] = False  # verl's whitening needs two tokens left
        loss_mask = torch.where(rejected[:, None], 0, mask)
    else:
        loss_mask = mask
    return {
        "token_rewards": token_rewards,
        "values": torch.randn(num_rows, width, generator=gen, dtype=torch.float64),
        "mask": loss_mask,
        "sampled_mask": mask,
        "group_ids": group_ids,
        "baselines": torch.randn(num_rows, generator=gen, dtype=torch.float64),
        "gamma": float(torch.empty(1).uniform_(0.8, 1.0, generator=gen)),
        "lam": float(torch.empty(1).uniform_(0.8, 1.0, generator=gen)),
    }


def relm_estimate(name: str, case: dict, norm_by_std: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    return compute_advantages(
        name,
        token_rewards=case["token_rewards"],
        response_mask=case["mask"],
        sampled_mask=case.get("sampled_mask"),
        values=case["values"],
        group_ids=case["group_ids"],
        gamma=case["gamma"],
        lam=case["lam"],
        norm_adv_by_std_in_grpo=norm_by_std,
        baseline_scores=case["baselines"],
    )


def verl_estimate(verl, name: str, case: dict, norm_by_std: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    core = verl.core_algos
    rewards, mask = case["token_rewards"].clone(), case["mask"].double()
    index = case["group_ids"].numpy().astype(np.int64)
    config = core.AlgoConfig(gamma=case["gamma"], lam=case["lam"], norm_adv_by_std_in_grpo=norm_by_std)
    if name == "gae":
        return core.compute_gae_advantage_return(rewards, case["values"], mask, case["gamma"], case["lam"])
    if name == "grpo":
        return core.compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=norm_by_std)
    if name == "rloo":
        return core.compute_rloo_outcome_advantage(rewards, mask, index, config=config)
    if name == "opo":
        return core.compute_opo_outcome_advantage(rewards, mask, index, config=config)
    if name == "reinforce_plus_plus":
        return core.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, config=config)
    if name == "reinforce_plus_plus_baseline":
        return core.compute_reinforce_plus_plus_baseline_outcome_advantage(
            rewards, mask, index, config=config
        )
    if name == "grpo_vectorized":
        return core.compute_grpo_vectorized_outcome_advantage(
            rewards, mask, index, norm_adv_by_std_in_grpo=norm_by_std
        )
    if name == "rloo_vectorized":
        return core.compute_rloo_vectorized_outcome_advantage(rewards, mask, index, config=config)
    if name == "gpg":
        return core.compute_gpg_outcome_advantage(rewards, mask, index, config=config)
    if name == "grpo_passk":
        return core.compute_grpo_passk_outcome_advantage(rewards, mask, index, config=config)
    if name == "remax":
        return core.compute_remax_outcome_advantage(rewards, case["baselines"], mask, config=config)
    raise AssertionError(name)


ESTIMATORS = [
    "gae", "grpo", "rloo", "opo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax",
    "grpo_vectorized", "rloo_vectorized", "gpg", "grpo_passk",
]  # fmt: skip


WHITENED = ("gae", "reinforce_plus_plus", "reinforce_plus_plus_baseline")
# verl's masked mean divides by the count + 1e-8, so a batch whose values are all equal centres to about
# value * 1e-8 / count instead of 0, and whitening multiplies that by 1 / sqrt(1e-8): up to ~1e-4 where
# relm gives exactly 0. Whitened values are O(1), so this bound still catches any real difference.
WHITENED_ATOL = 2e-4


FLOAT32 = ("grpo_vectorized",)
# verl computes its vectorised GRPO in float32, with the variance as E[x^2] - E[x]^2: an all-equal group's
# variance comes out as float32 rounding noise (std ~1e-4 over eps 1e-6) only if the scores differ, which
# they do not there; elsewhere the two agree to float32 precision on O(1) advantages.
FLOAT32_ATOL = 1e-4


def assert_equal_on_valid_tokens(relm_value, verl_value, mask, what, atol=1e-7):
    valid = mask.bool()
    torch.testing.assert_close(
        torch.where(valid, relm_value, 0.0), torch.where(valid, verl_value.double(), 0.0), rtol=1e-6, atol=atol,
        msg=what,
    )  # fmt: skip


@pytest.mark.parametrize("name", ESTIMATORS)
def test_estimator_matches_verl_on_random_batches(verl, name):
    compared = 0
    for seed in range(NUM_CASES):
        case = random_case(seed)
        if name == "grpo_passk" and torch.unique(case["group_ids"], return_counts=True)[1].min() < 2:
            # Pass@k has no second best in a group of one: both refuse.
            with pytest.raises(ValueError):
                verl_estimate(verl, name, case)
            with pytest.raises(ValueError, match="at least 2 responses"):
                relm_estimate(name, case)
            continue
        compared += 1
        relm_adv, relm_ret = relm_estimate(name, case)
        verl_adv, verl_ret = verl_estimate(verl, name, case)
        what = lambda m, s=seed: f"{name} seed {s}: {m}"  # noqa: E731
        atol = WHITENED_ATOL if name in WHITENED else FLOAT32_ATOL if name in FLOAT32 else 1e-7
        assert_equal_on_valid_tokens(relm_adv, verl_adv, case["mask"], what, atol=atol)
        # Returns are the unwhitened targets, except where an estimator returns its advantages.
        returns_atol = WHITENED_ATOL if name == "reinforce_plus_plus_baseline" else atol
        assert_equal_on_valid_tokens(relm_ret, verl_ret, case["mask"], what, atol=returns_atol)
        assert torch.all(relm_adv[~case["mask"].bool()] == 0)  # relm's padding is clean
    assert compared >= NUM_CASES // 10


def test_grpo_without_std_matches_verl(verl):  # Dr. GRPO's `norm_adv_by_std_in_grpo=false`
    for seed in range(NUM_CASES):
        case = random_case(seed)
        relm_adv, _ = relm_estimate("grpo", case, norm_by_std=False)
        verl_adv, _ = verl_estimate(verl, "grpo", case, norm_by_std=False)
        assert_equal_on_valid_tokens(relm_adv, verl_adv, case["mask"], f"grpo seed {seed}")


def test_size_one_and_all_equal_groups_by_hand_agree_with_verl(verl):
    # Group 0 holds one response (its raw score is its advantage), group 1 two equal ones (advantage 0).
    case = {
        "token_rewards": torch.tensor([[0.0, 2.0], [1.0, 0.0], [1.0, 0.0]], dtype=torch.float64),
        "values": torch.zeros(3, 2, dtype=torch.float64),
        "mask": torch.tensor([[1, 1], [1, 0], [1, 0]]),
        "group_ids": torch.tensor([0, 1, 1]),
        "baselines": torch.zeros(3, dtype=torch.float64),
        "gamma": 1.0,
        "lam": 1.0,
    }
    for name in ("grpo", "rloo", "opo"):
        relm_adv, _ = relm_estimate(name, case)
        verl_adv, _ = verl_estimate(verl, name, case)
        assert_equal_on_valid_tokens(relm_adv, verl_adv, case["mask"], name)
        assert relm_adv[0].tolist() == pytest.approx([2.0, 2.0]) and relm_adv[1:].abs().sum() == 0


def test_whitening_below_two_tokens_gives_zeros_where_verl_raises(verl):
    # A deliberate difference (docs/algorithms.md): one valid token has no variance; verl raises, relm
    # returns zero advantages so the step has no signal instead of stopping the run.
    case = random_case(1)
    case["mask"] = torch.zeros_like(case["mask"])
    case["mask"][0, 0] = 1
    case["token_rewards"] = torch.where(case["mask"].bool(), 1.0, 0.0).double()
    for name in ("gae", "reinforce_plus_plus", "reinforce_plus_plus_baseline"):
        with pytest.raises(ValueError, match="sum of the mask is one"):
            verl_estimate(verl, name, case)
        advantages, _ = relm_estimate(name, case)
        assert torch.all(advantages == 0)


def test_opo_group_of_empty_responses_is_zero_where_verl_gives_nan(verl):
    # A deliberate difference: verl's length-weighted baseline of a group whose responses are all empty
    # is 0/0, and NaN * mask stays NaN in every row of the group.
    case = random_case(2)
    case["group_ids"] = torch.zeros(len(case["group_ids"]), dtype=torch.long)
    case["mask"] = torch.zeros_like(case["mask"])
    case["token_rewards"] = torch.zeros_like(case["token_rewards"])
    verl_adv, _ = verl_estimate(verl, "opo", case)
    relm_adv, _ = relm_estimate("opo", case)
    assert torch.isnan(verl_adv).all() and torch.all(relm_adv == 0)


def gdpo_case(seed: int) -> tuple[dict, torch.Tensor, torch.Tensor | None, bool]:
    """A random case with 1-3 named rewards per response (float32, as verl reads them), weights or none."""
    case = random_case(seed)
    gen = torch.Generator().manual_seed(10_000 + seed)
    num_keys = int(torch.randint(1, 4, (1,), generator=gen))
    components = torch.randint(0, 3, (num_keys, len(case["group_ids"])), generator=gen).float()
    if seed % 2:
        components = torch.randn(components.shape, generator=gen)
    weights = None if seed % 3 == 0 else torch.rand(num_keys, generator=gen) * 2
    return case, components, weights, seed % 4 != 1


def verl_gdpo(verl, case: dict, components: torch.Tensor, weights, norm_by_std: bool) -> torch.Tensor:
    """verl's GDPO as its trainer calls it: the rewards by key in `non_tensor_batch`, each put on the last token
    the response's attention mask covers (here the last valid one, so holes do not hide it)."""
    mask = case["mask"]
    num_rows, width = mask.shape
    keys = [f"reward_{k}" for k in range(len(components))]
    ends = torch.where(mask.bool(), torch.arange(width), -1).amax(dim=1) + 1  # [N] attention length
    prompt_len = 3
    attention = torch.cat([torch.ones(num_rows, prompt_len), (torch.arange(width) < ends[:, None])], 1).long()
    config = verl.core_algos.AlgoConfig(
        norm_adv_by_std_in_grpo=norm_by_std, gdpo_reward_keys=keys,
        gdpo_reward_weights=None if weights is None else weights.tolist(),
    )  # fmt: skip
    advantages, _ = verl.core_algos.compute_gdpo_outcome_advantage(
        case["token_rewards"].float(), mask.float(), case["group_ids"].numpy().astype(np.int64),
        norm_adv_by_std_in_grpo=norm_by_std, config=config,
        non_tensor_batch={key: components[k].numpy() for k, key in enumerate(keys)},
        batch={"prompts": torch.zeros(num_rows, prompt_len), "attention_mask": attention},
    )  # fmt: skip
    return advantages


def test_gdpo_matches_verl_on_random_batches(verl):
    for seed in range(NUM_CASES):
        case, components, weights, norm_by_std = gdpo_case(seed)
        relm_adv, relm_ret = compute_advantages(
            "gdpo", token_rewards=case["token_rewards"], response_mask=case["mask"], group_ids=case["group_ids"],
            norm_adv_by_std_in_grpo=norm_by_std, score_components=components, score_weights=weights,
        )  # fmt: skip
        verl_adv = verl_gdpo(verl, case, components, weights, norm_by_std)
        what = lambda m, s=seed: f"gdpo seed {s}: {m}"  # noqa: E731
        summed = sum(
            float(w) * _group_normalised(c.double(), case["group_ids"], norm_by_std, 1e-6)
            for w, c in zip(
                torch.ones(len(components)) if weights is None else weights, components, strict=True
            )
        )
        # Both work in float32 (verl casts the rewards), rounding the O(1) normalised rewards by ~1e-7 each
        # (~1e-6 over 3 weighted ones); whitening divides that by sqrt(var + 1e-8). Where the rewards nearly
        # cancel (two unweighted ones over a group of two: +-1/sqrt(2) each, less eps terms) var is tiny and
        # the noise grows to ~1e-3; elsewhere verl's count + 1e-8 (WHITENED_ATOL) dominates.
        valid = case["mask"].bool()
        spread = float(summed.unsqueeze(-1).expand_as(valid)[valid].var(correction=0))
        atol = max(WHITENED_ATOL, 1e-6 / (spread + 1e-8) ** 0.5)
        assert_equal_on_valid_tokens(relm_adv.double(), verl_adv, case["mask"], what, atol=atol)
        assert torch.equal(relm_ret, relm_adv)
        assert torch.all(relm_adv[~case["mask"].bool()] == 0)


def test_every_estimator_of_verls_registry_is_compared(verl):
    from relm.algorithms import ADV_ESTIMATORS

    assert set(verl.core_algos.ADV_ESTIMATOR_REGISTRY) == {*ESTIMATORS, "gdpo", *OPTIMAL_TOKEN_BASELINES}
    assert set(ADV_ESTIMATORS) >= set(verl.core_algos.ADV_ESTIMATOR_REGISTRY)


OPTIMAL_TOKEN_BASELINES = {
    "optimal_token_baseline": "compute_optimal_token_baseline_advantage",
    "tir_optimal_token_baseline": "compute_multi_turn_optimal_token_baseline_advantage",
}


def old_policy_inputs(case: dict, seed: int) -> dict[str, torch.Tensor | None]:
    """The optimal token baselines' inputs for a random case: old logprobs and sum of squared probabilities of one
    random policy over a small vocabulary (so pi(y)^2 <= sum pi^2 <= 1 holds as in a run), and importance weights
    in half the cases (`rollout_is`), truncated at 2 as verl's default threshold does."""
    gen = torch.Generator().manual_seed(20_000 + seed)
    num_rows, width = case["mask"].shape
    logits = 3 * torch.randn(num_rows, width, 5, generator=gen, dtype=torch.float64)
    tokens = torch.randint(0, 5, (num_rows, width), generator=gen)
    old_logprobs = torch.log_softmax(logits, -1).gather(-1, tokens[..., None]).squeeze(-1)
    weights = torch.rand(num_rows, width, generator=gen, dtype=torch.float64) * 2 if seed % 2 else None
    return {
        "old_logprobs": old_logprobs,
        "sum_pi_squared": (torch.softmax(logits, -1) ** 2).sum(-1),
        "rollout_is_weights": weights,
    }


@pytest.mark.parametrize("name", sorted(OPTIMAL_TOKEN_BASELINES))
@pytest.mark.parametrize("handle_zero_tail", [True, False])  # verl's trainer leaves the default (True)
def test_optimal_token_baselines_match_verl_on_random_batches(verl, name, handle_zero_tail):
    from relm.algorithms.optimal_token_baseline import (
        compute_optimal_token_baseline,
        compute_tir_optimal_token_baseline,
    )

    relm_fn = (
        compute_optimal_token_baseline
        if name == "optimal_token_baseline"
        else compute_tir_optimal_token_baseline
    )
    verl_fn = getattr(verl.core_algos, OPTIMAL_TOKEN_BASELINES[name])
    for seed in range(NUM_CASES):
        case = random_case(seed)
        inputs = old_policy_inputs(case, seed)
        verl_inputs = {**inputs, "old_log_probs": inputs["old_logprobs"]}
        del verl_inputs["old_logprobs"]
        verl_adv, verl_ret = verl_fn(
            case["token_rewards"].clone(), case["mask"].double(), case["group_ids"].numpy().astype(np.int64),
            handle_zero_tail=handle_zero_tail, config=verl.core_algos.AlgoConfig(), **verl_inputs,
        )  # fmt: skip
        relm_adv, relm_ret = relm_fn(
            case["token_rewards"],
            case["mask"],
            case["group_ids"],
            handle_zero_tail=handle_zero_tail,
            **inputs,
        )
        what = lambda m, s=seed: f"{name} seed {s}: {m}"  # noqa: E731
        # The advantages are compared everywhere, padding included (verl zeroes them there as relm does); the
        # returns on the valid tokens: verl's keep the later rewards' sum at a masked token inside a response.
        torch.testing.assert_close(relm_adv, verl_adv, rtol=1e-9, atol=1e-12, msg=what)
        assert_equal_on_valid_tokens(relm_ret, verl_ret, case["mask"], what, atol=1e-12)
        assert torch.all(relm_ret[~case["mask"].bool()] == 0)
        if handle_zero_tail is False:  # and the trainer's path, which passes verl's default
            trainer_adv, _ = compute_advantages(
                name, token_rewards=case["token_rewards"], response_mask=case["mask"], group_ids=case["group_ids"],
                sampled_mask=case["sampled_mask"], **inputs,
            )  # fmt: skip
            verl_default, _ = verl_fn(
                case["token_rewards"].clone(), case["mask"].double(), case["group_ids"].numpy().astype(np.int64),
                config=verl.core_algos.AlgoConfig(), **verl_inputs,
            )  # fmt: skip
            torch.testing.assert_close(trainer_adv, verl_default, rtol=1e-9, atol=1e-12, msg=what)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sum_pi_squared_matches_verls(verl, dtype):
    from relm.learner.vocab_chunks import _token_sum_pi_squared

    gen = torch.Generator().manual_seed(0)
    for scale in (0.1, 1.0, 10.0, 30.0):
        logits = (scale * torch.randn(6, 9, 1000, generator=gen)).to(dtype)
        for temperature in (1.0, 0.6):
            what = f"scale {scale}, T {temperature}"
            exact = (torch.softmax(logits.double() / temperature, -1) ** 2).sum(-1)
            # verl's forward divides fp32 logits by the temperature and takes the sum from them, as relm's chunks do.
            want = verl.torch_functional.calculate_sum_pi_squared_from_logits(logits.float() / temperature)
            got = _token_sum_pi_squared(logits, temperature)
            # verl subtracts two fp32 log-sums of size ~max logit (relative error ~2.5e-5 at scale 30); relm shifts
            # by the largest logit first and stays within ~3e-6 of the float64 value at every scale.
            torch.testing.assert_close(got, want, rtol=5e-5, atol=0, msg=what)
            verl_error = float(((want.double() - exact) / exact).abs().max())
            relm_error = float(((got.double() - exact) / exact).abs().max())
            assert relm_error < 5e-6 and relm_error <= verl_error * 1.5, (what, relm_error, verl_error)
