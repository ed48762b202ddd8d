"""Components built from their specs alone (issue 28): the actor model and its optimizer from `TrainedModelSpec`
(the schedule spanning `optim.total_training_steps` when the user set it), the engine from `EngineSpec`, the
reward from `RewardSpec`."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from relm.config.loader import load_config
from relm.config.specs import RewardSpec
from relm.config.translate import translate
from relm.distributed.context import DistContext
from relm.memory.choices import user_choices
from relm.models.char_tokenizer import build_char_tokenizer
from relm.models.loading import resolve_model_dir
from relm.models.precision import pick_precision
from relm.rewards.manager import build_reward_manager
from relm.rewards.registry import default_compute_score
from relm.rollout.hf_engine import HFRolloutEngine
from relm.rollout.native.engine import NativeRolloutEngine
from relm.trainer import components
from relm.trainer.components import build_engine, build_trainee, compute_sizes, load_trained_model
from relm.trainer.main_ppo import main
from tests.tiny_models import tiny_lm

CPU = torch.device("cpu")
RATIO = "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.5"


def _multipliers(*overrides: str) -> list[float]:
    cfg = load_config(["trainer.device=cpu", "trainer.total_training_steps=40", RATIO, *overrides])
    spec, _ = translate(cfg)
    sizes = compute_sizes(spec, batches_per_epoch=4)
    precision = pick_precision("auto", CPU)
    trainee = build_trainee(
        spec.actor,
        nn.Linear(2, 2),
        sizes,
        user_choices(spec, precision),
        rows_per_step=spec.data.prompts_per_step * spec.engine.sampling.n,
        device=CPU,
        dist=DistContext(),
        layout=None,
    )
    return [trainee.scheduler.lr_lambdas[0](step) for step in range(0, 400, 10)]  # type: ignore[attr-defined]


def test_a_set_total_training_steps_wins_over_the_runs_length():
    run = _multipliers()
    assert _multipliers("actor_rollout_ref.actor.optim.total_training_steps=-1") == run  # verl's "unset"
    shorter = _multipliers("actor_rollout_ref.actor.optim.total_training_steps=4")
    assert shorter != run
    assert (
        max(shorter[1:]) == 1.0 and min(run[1:]) < 1.0
    )  # warmup over 2 of 4 steps ends; of 20 of 40 not yet


def test_the_actor_model_builds_from_its_spec_alone():
    cfg = load_config(["trainer.device=cpu", "actor_rollout_ref.model.lora_rank=4"])
    spec = translate(cfg)[0].actor
    model = load_trained_model(spec, resolve_model_dir(spec.source.path or ""), CPU, torch.float32)
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    other = dataclasses.replace(
        spec, source=dataclasses.replace(spec.source, lora=dataclasses.replace(spec.source.lora, rank=0))
    )
    assert all(
        p.requires_grad
        for p in load_trained_model(
            other, resolve_model_dir(spec.source.path or ""), CPU, torch.float32
        ).parameters()
    )


def test_the_engine_builds_from_its_spec_alone():
    spec = translate(load_config(["trainer.device=cpu", "actor_rollout_ref.rollout.max_num_seqs=3"]))[
        0
    ].engine
    settings = dict(model_dir="unused", pad_token_id=0, eos_token_ids=[1], device=CPU, seed=spec.seed)
    precision = pick_precision("auto", CPU)
    native = build_engine(spec, tiny_lm(), precision=precision, **settings)
    assert isinstance(native, NativeRolloutEngine) and native.max_num_seqs == 3
    hf = build_engine(dataclasses.replace(spec, name="hf"), tiny_lm(), precision=precision, **settings)
    assert isinstance(hf, HFRolloutEngine)


def test_the_reward_builds_from_its_spec_alone():
    keys = [
        "reward_model.num_workers=0",
        "reward_model.reward_manager=batch",
        "reward_model.failure_score=-1",
    ]
    spec = translate(load_config(keys))[0].reward
    manager = build_reward_manager(build_char_tokenizer(), default_compute_score, spec)
    assert manager.pool is None and manager.batched and manager.policy.failure_score == -1
    assert not build_reward_manager(
        build_char_tokenizer(), default_compute_score, replace_manager(spec)
    ).batched


def replace_manager(spec: RewardSpec) -> RewardSpec:
    return dataclasses.replace(spec, manager="naive")


def test_data_trust_remote_code_allows_the_run_tokenizers_code(monkeypatch):
    """verl's trainer loads the tokenizer that reads the data with `data.trust_remote_code`; relm's one
    tokenizer follows it (or the model's key)."""
    asked: list[bool] = []
    monkeypatch.setattr(
        components,
        "load_tokenizer",
        lambda path, trust_remote_code, path_key: asked.append(trust_remote_code),
    )
    for keys in ([], ["data.trust_remote_code=true"], ["actor_rollout_ref.model.trust_remote_code=true"]):
        components._load_run_tokenizer(translate(load_config(keys))[0], "unused")
    assert asked == [False, True, True]


def test_the_critics_external_lib_is_imported_before_the_run(capsys):
    """verl imports `critic.model.external_lib` when it builds the critic's model config; relm at start."""
    code = main(
        ["trainer.device=cpu", "algorithm.adv_estimator=gae", "critic.model.external_lib=relm_no_such_lib"]
    )
    err = capsys.readouterr().err
    assert code == 2 and "error: `critic.model.external_lib=relm_no_such_lib` cannot be imported" in err
