"""The run's trained models as `Trainee` records: sizes resolved once, and each forward cut by its own key."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from relm.config.loader import load_config
from relm.config.translate import translate
from relm.models.loading import resolve_model_dir
from relm.trainer.components import build_components, compute_sizes
from relm.trainer.ppo import annotate

SMALL = [
    "data.train_batch_size=4",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "data.max_response_length=6",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null",  # the demo preset sets 32
]


def test_sizes_fill_every_unset_size_from_the_actors():
    """The 16-response default is the only one; every unset per-GPU size, epoch count and mini-batch
    follows the actor's."""
    sizes = compute_sizes(
        translate(load_config([*SMALL, "actor_rollout_ref.actor.ppo_epochs=3"]))[0], batches_per_epoch=5
    )
    actor, critic = sizes.batching["actor"], sizes.batching["critic"]
    assert (actor.rows_per_minibatch, actor.rows_per_microbatch, actor.rows_per_forward) == (4, 4, 4)
    assert (critic.rows_per_minibatch, critic.rows_per_microbatch, critic.rows_per_forward) == (4, 4, 4)
    assert (actor.num_epochs, critic.num_epochs, sizes.rows_per_ref_forward) == (3, 3, 4)
    wide = compute_sizes(
        translate(load_config([*SMALL, "actor_rollout_ref.actor.ppo_mini_batch_size=16"]))[0], 5
    )
    assert wide.batching["actor"].rows_per_minibatch == 32
    assert wide.batching["actor"].rows_per_microbatch == 16  # min(16 prompts x n=2, 16)
    greedy = compute_sizes(
        translate(load_config(["actor_rollout_ref.rollout.temperature=0"]))[0], batches_per_epoch=5
    )
    assert greedy.logprob_temperature == 1.0
    epochs = compute_sizes(
        translate(load_config(["trainer.total_training_steps=null", "trainer.total_epochs=2"]))[0], 5
    )
    assert epochs.total_training_steps == 10


def forward_rows(module: torch.nn.Module) -> list[int]:
    """Rows of every forward `module` makes from now on."""
    rows: list[int] = []

    def hook(_module, args, kwargs):
        ids = args[0] if args else kwargs["input_ids"]
        rows.append(int(ids.shape[0]))

    module.register_forward_pre_hook(hook, with_kwargs=True)
    return rows


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_reference_and_value_forwards_follow_their_own_keys(tmp_path: Path, packed: bool):
    """`ref.log_prob_micro_batch_size_per_gpu` and `critic.forward_micro_batch_size_per_gpu` cut their
    forwards, not the rollout's old-logprob size."""
    from relm.trainer.collect import collect_experience

    cfg = load_config(
        [
            *SMALL,
            "algorithm.adv_estimator=gae",
            "actor_rollout_ref.actor.use_kl_loss=true",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
            "critic.forward_micro_batch_size_per_gpu=3",
            f"actor_rollout_ref.model.use_remove_padding={packed}",
            f"critic.model.use_remove_padding={packed}",
            f"trainer.default_local_dir={tmp_path}",
        ]
    )
    c = build_components(translate(cfg)[0], resolve_model_dir(cfg.actor_rollout_ref.model.path))
    assert c.critic is not None and c.ref is not None
    batch = collect_experience(c.experience_sources, c.loader.next_batch(), 1, {})
    assert len(batch) == 8
    seen = {
        "actor": forward_rows(c.actor.module),
        "reference": forward_rows(c.ref),
        "critic": forward_rows(c.critic.module),
    }
    annotate(c, batch)
    if packed:  # each forward is one packed row: count the forwards
        assert {name: len(rows) for name, rows in seen.items()} == {"actor": 1, "reference": 4, "critic": 3}
    else:
        assert seen == {"actor": [8], "reference": [2, 2, 2, 2], "critic": [3, 3, 2]}
