"""Sizes a user left at verl's defaults follow the chosen model, and a run on the user's data names its model.

verl's defaults (512 prompt + 512 response tokens) are meant for real models; a small or shrunk model with a
shorter context would otherwise meet them as an error the user did not cause ("512 + 512 exceeds 256"), one
run at a time. A length the user set is kept (and checked by `relm.config.validate`); only the ones left
alone are fitted, and the run says so in one line.
"""

from __future__ import annotations

from relm.config.schema import ActorConfig, CriticConfig, RelmConfig
from relm.config.validate import num_data_parallel_ranks
from relm.errors import UserError

PROMPT_KEY, RESPONSE_KEY = "data.max_prompt_length", "data.max_response_length"
MODEL_KEY = "actor_rollout_ref.model.path"


def require_named_model(cfg: RelmConfig, user_keys: set[str]) -> None:
    """A run on the user's data must name its model: the default is the demo's random tiny model.

    Raises:
        UserError: `data.train_files` or `data.val_files` is set and `actor_rollout_ref.model.path` is not.
    """
    if (cfg.data.train_files or cfg.data.val_files) and MODEL_KEY not in user_keys:
        key = "data.train_files" if cfg.data.train_files else "data.val_files"
        raise UserError(
            f"{MODEL_KEY}: no model named for {key}; set {MODEL_KEY}=<folder, Hub id or zoo:NAME> "
            "(zoo:tiny/qwen2 is the demo's random 2-layer model)"
        )


def fitted_lengths(cfg: RelmConfig, user_keys: set[str], max_positions: int | None) -> dict[str, int]:
    """New values for the prompt/response lengths the user left alone, when the two exceed the context.

    A length the user set stays; the other takes the rest of the context (never more than it had). With
    neither set, the context is split as the defaults split it (in proportion). Nothing is returned when
    they fit, when both were set (validation names the problem) or when nothing can be left for one.
    """
    data = cfg.data
    prompt, response = data.max_prompt_length, data.max_response_length
    if max_positions is None or prompt + response <= max_positions:
        return {}
    prompt_set, response_set = PROMPT_KEY in user_keys, RESPONSE_KEY in user_keys
    if prompt_set and response_set:
        return {}
    if prompt_set:
        fitted = {RESPONSE_KEY: min(response, max_positions - prompt)}
    elif response_set:
        fitted = {PROMPT_KEY: min(prompt, max_positions - response)}
    else:
        new_prompt = max_positions * prompt // (prompt + response)
        fitted = {PROMPT_KEY: new_prompt, RESPONSE_KEY: max_positions - new_prompt}
    return fitted if all(value > 0 for value in fitted.values()) else {}


def fitted_micro_batches(cfg: RelmConfig, user_keys: set[str]) -> dict[str, int]:
    """New `ppo_micro_batch_size_per_gpu` values for those the user left alone that do not split a GPU's share.

    The demo's micro-batch (32, one whole mini-batch of 4 prompts x 8 responses) fits one process; with
    `trainer.n_gpus_per_node=2` each rank holds 16 responses and 32 cannot split them. A size the user
    set stays (validation names the problem); one left alone becomes the largest divisor of the rank's
    share not above it, so the obvious command runs with the same mini-batches.
    """
    arr, ranks = cfg.actor_rollout_ref, num_data_parallel_ranks(cfg)
    sections: list[tuple[str, ActorConfig | CriticConfig]] = [("actor_rollout_ref.actor", arr.actor)]
    if cfg.algorithm.adv_estimator == "gae":  # only GAE trains a critic
        sections.append(("critic", cfg.critic))
    fitted = {}
    for name, section in sections:
        key, micro = f"{name}.ppo_micro_batch_size_per_gpu", section.ppo_micro_batch_size_per_gpu
        responses = (section.ppo_mini_batch_size or arr.actor.ppo_mini_batch_size) * arr.rollout.n
        if key in user_keys or micro is None or section.use_dynamic_bsz or responses % ranks:
            continue
        share = responses // ranks
        if share % micro:
            fitted[key] = max(size for size in range(1, min(micro, share) + 1) if share % size == 0)
    return fitted
