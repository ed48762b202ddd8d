"""Asynchronous training's parts that need no second process: the keys (refusals, the staleness bound in
whole steps), the staleness metrics, and the flat weight layout the channel sends."""

from __future__ import annotations

import pytest
import torch

from relm.config.async_training import check_async_training
from relm.config.loader import load_config
from relm.config.translate import translate
from relm.distributed.weight_channel import WeightLayout
from relm.errors import UserError
from relm.trainer.async_rollout import staleness_metrics
from relm.trainer.main_ppo import main


def _cfg(*overrides: str):
    return load_config(
        ["data.train_batch_size=32", "actor_rollout_ref.actor.ppo_mini_batch_size=4", *overrides]
    )


@pytest.mark.parametrize(
    ("threshold", "behind"), [(0.0, 0), (0.1, 0), (0.99, 0), (1.0, 1), (1.5, 1), (2.0, 2)]
)
def test_the_bound_is_the_threshold_in_whole_steps(threshold: float, behind: int):
    spec = translate(_cfg("async_training.enable=true", f"async_training.staleness_threshold={threshold}"))[0]
    assert spec.asynchronous.enabled
    assert spec.asynchronous.max_versions_behind == behind


def test_a_sync_period_of_one_step_is_accepted_and_another_refused():
    check_async_training(_cfg("async_training.enable=true", "async_training.trigger_parameter_sync_step=8"))
    check_async_training(
        _cfg(
            "async_training.enable=true",
            "async_training.trigger_parameter_sync_step=4",
            "async_training.require_batches=2",
        )
    )
    with pytest.raises(UserError, match=r"trigger_parameter_sync_step=4.*set it to 8 or leave it unset"):
        check_async_training(
            _cfg("async_training.enable=true", "async_training.trigger_parameter_sync_step=4")
        )


@pytest.mark.parametrize(
    ("override", "culprit"),
    [
        ("async_training.staleness_threshold=-1", "staleness_threshold=-1"),
        ("trainer.n_gpus_per_node=2", "n_gpus_per_node=2"),
        ("actor_rollout_ref.model.lora_rank=8", "lora_rank=8"),
        ("actor_rollout_ref.rollout.multi_turn.enable=true", "multi_turn.enable=true"),
    ],
)
def test_what_the_rollout_process_does_not_carry_is_refused(override: str, culprit: str):
    with pytest.raises(UserError, match=culprit):
        check_async_training(_cfg("async_training.enable=true", override))
    check_async_training(_cfg(override))  # without async_training.enable nothing here is refused


def test_partial_rollout_without_async_training_is_refused_in_one_line_with_exit_code_2(
    capsys: pytest.CaptureFixture[str], tmp_path
):
    code = main(
        [
            "async_training.enable=false",
            "async_training.partial_rollout=true",
            f"trainer.default_local_dir={tmp_path}",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("error: `async_training.partial_rollout=true`"), err
    assert "async_training.enable=true" in err[0]
    check_async_training(_cfg("async_training.enable=true", "async_training.partial_rollout=true"))


def test_staleness_metrics_count_versions_behind_the_trained_weights():
    metrics = staleness_metrics(torch.tensor([3, 3, 2, 1]), trained_version=3)
    assert metrics == {
        "fully_async/staleness/mean": 0.75,  # (0 + 0 + 1 + 2) / 4
        "fully_async/staleness/max": 2.0,
        "fully_async/count/stale_samples_processed": 2.0,
        "fully_async/count/current_param_version": 3.0,
    }


def test_the_flat_layout_round_trips_every_dtype_exactly():
    named = [
        ("a.weight", torch.randn(3, 4)),
        ("b.weight", torch.randn(5, dtype=torch.float64).to(torch.bfloat16)),
        ("c.bias", torch.randn(2, 2, dtype=torch.float16)),
    ]
    layout = WeightLayout.of(named)
    flat = layout.flatten(named)
    assert flat.dtype == torch.float32 and flat.numel() == layout.numel == 12 + 5 + 4
    for (name, want), (got_name, got) in zip(named, layout.unflatten(flat), strict=True):
        assert name == got_name and got.dtype == want.dtype and torch.equal(got, want)
    with pytest.raises(RuntimeError, match="b.weight"):
        layout.flatten([named[0], ("b.weight", torch.zeros(6)), named[2]])
