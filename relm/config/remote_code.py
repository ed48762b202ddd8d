"""Which config key allows each model's own code, and whether it is allowed.

A model folder may ship Python (its config.json's `auto_map`) that transformers runs on loading, so
loading it needs the user's `trust_remote_code=true`. The actor's key covers the folder it names, and
so the reference (a copy of the actor) and a critic that loads the same folder (`critic.model.path`
unset or equal): the user trusted that code once. A critic on another folder needs its own key, as
does the reward model (`reward_model.model.trust_remote_code`, read where it loads).
"""

from __future__ import annotations

from relm.config.schema import RelmConfig

ACTOR_KEY = "actor_rollout_ref.model.trust_remote_code"
CRITIC_KEY = "critic.model.trust_remote_code"
REWARD_MODEL_KEY = "reward_model.model.trust_remote_code"


def model_trust(cfg: RelmConfig, name: str) -> tuple[bool, str]:
    """(whether `name`'s model, "actor" or "critic", may run its folder's code, the key that allows it)."""
    actor = cfg.actor_rollout_ref.model
    if name == "actor":
        return actor.trust_remote_code, ACTOR_KEY
    critic = cfg.critic.model
    same_folder = critic.path is None or critic.path == actor.path
    return critic.trust_remote_code or (same_folder and actor.trust_remote_code), CRITIC_KEY
