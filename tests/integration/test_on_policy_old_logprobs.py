"""On-policy runs (one epoch, one mini-batch a step) skip the old-logprob forward and take the update's first
forward instead; the update's numbers must be those of the path that runs the forward.

Both paths run the same two steps from the same seed on the tiny model, with a critic (GAE), a reference and
the KL loss, so the value, reference and KL paths are compared too. On CPU in fp32 the separate forward and
the update's forward differ only by rounding: the metrics and the updated weights agree to ~1e-6.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import relm.trainer.ppo as ppo
from relm.config.loader import load_config
from relm.config.translate import translate
from relm.models.loading import resolve_model_dir
from relm.trainer.components import build_components
from relm.trainer.old_logprobs import ON_POLICY_MESSAGE, old_logprob_source
from tests.integration.conftest import TINY_OVERRIDES, RunResult

pytestmark = pytest.mark.integration

ON_POLICY = (
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # = data.train_batch_size
    "actor_rollout_ref.actor.ppo_epochs=1",
    "actor_rollout_ref.actor.use_kl_loss=true",
    "actor_rollout_ref.actor.entropy_coeff=0.01",
    "algorithm.adv_estimator=gae",
)


def one_step(tmp_path: Path, name: str) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    cfg = load_config([*TINY_OVERRIDES, *ON_POLICY, f"trainer.default_local_dir={tmp_path / name}"])
    c = build_components(translate(cfg)[0], resolve_model_dir(cfg.actor_rollout_ref.model.path))
    ppo.ppo_step(c, c.loader.next_batch(), step=1)
    metrics = ppo.ppo_step(c, c.loader.next_batch(), step=2)  # the reference is no longer the actor: KL > 0
    weights = {key: value.detach().clone() for key, value in c.actor.module.state_dict().items()}
    return metrics, weights


def test_the_update_of_the_skipped_forward_equals_the_one_with_it(tmp_path: Path, monkeypatch) -> None:
    cfg = load_config([*TINY_OVERRIDES, *ON_POLICY])
    assert old_logprob_source(translate(cfg)[0]) == "update"
    skipped, skipped_weights = one_step(tmp_path, "skipped")
    monkeypatch.setattr(ppo, "old_logprob_source", lambda spec: "actor")  # the path with the forward
    forward, forward_weights = one_step(tmp_path, "forward")

    assert "timing_s/old_log_prob" not in skipped and "timing_s/old_log_prob" in forward
    assert skipped["actor/ppo_kl"] == 0.0 and skipped["actor/pg_clipfrac"] == 0.0  # ratio exactly 1
    assert forward["actor/kl_loss"] > 1e-4
    compared = [
        name
        for name in forward
        if name.split("/")[0] in ("actor", "critic", "rollout", "rollout_corr") and name != "actor/lr"
    ]
    assert {"actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm", "critic/vf_loss"} <= set(
        compared
    )
    assert {"rollout/logprob_diff_max", "rollout_corr/kl", "rollout_corr/training_ppl"} <= set(compared)
    for name in compared:
        assert skipped[name] == pytest.approx(forward[name], rel=1e-5, abs=1e-6), name
    for key, value in forward_weights.items():
        torch.testing.assert_close(skipped_weights[key], value, rtol=0, atol=1e-6, msg=key)


def test_the_run_says_once_where_its_old_logprobs_come_from(train) -> None:
    result: RunResult = train(*ON_POLICY)
    assert result.exit_code == 0 and len(result.metrics) == 2
    assert sum(ON_POLICY_MESSAGE in line for line in result.stderr.splitlines()) == 1
    assert all("timing_s/old_log_prob" not in step for step in result.metrics)


@pytest.mark.parametrize(
    "override",
    ["actor_rollout_ref.actor.ppo_epochs=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
     "algorithm.use_kl_in_reward=true", "algorithm.rollout_correction.rollout_is=token"],
)  # fmt: skip
def test_the_forward_runs_when_something_reads_old_logprobs_before_or_after_the_first_pass(override) -> None:
    cfg = load_config([*TINY_OVERRIDES, *ON_POLICY, override])
    assert old_logprob_source(translate(cfg)[0]) == "actor"
    bypass = load_config([*TINY_OVERRIDES, *ON_POLICY, "algorithm.rollout_correction.bypass_mode=true"])
    assert old_logprob_source(translate(bypass)[0]) == "engine"
