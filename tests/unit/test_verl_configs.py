"""verl's configs as verl ships them: every release's default PPO config loads, Hydra's command-line forms
work, keys verl renamed act under relm's names, and optional parts that are missing fall back.

The default configs are read from verl's wheels (`make verl-wheels` downloads them into .cache/verl;
`make test` does so first, so CI never skips), never from a copy kept in this repository.
"""

from __future__ import annotations

import logging
import os
import sys
import zipfile
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from relm.config import verl_keys
from relm.config.loader import _schema_keys, load_config, load_config_with_warnings
from relm.config.schema import RelmConfig
from relm.config.verl_renames import MAX_RESP_LEN_KEYS, RENAMED
from relm.errors import UserError

WHEELS = Path(os.environ.get("RELM_VERL_WHEELS", Path(__file__).resolve().parents[2] / ".cache" / "verl"))
RELEASES = ("0.4.1", "0.5.0", "0.6.1", "0.7.0", "0.9.1")
REAL = "data.train_files=/data/train.parquet"
OPTIM = "actor_rollout_ref.actor.optim"


def _wheel(release: str) -> Path:
    found = sorted(WHEELS.glob(f"verl-{release}-*.whl"))
    if not found:
        pytest.skip(f"verl {release}'s wheel is not in {WHEELS}; `make verl-wheels` downloads it")
    return found[0]


def _config_dir(release: str, tmp_path: Path) -> Path:
    with zipfile.ZipFile(_wheel(release)) as wheel:
        members = [name for name in wheel.namelist() if name.startswith("verl/trainer/config/")]
        wheel.extractall(tmp_path, members)
    return tmp_path / "verl" / "trainer" / "config"


def _default_file(config_dir: Path) -> Path:
    """The flattened default (0.5 on) or, before it existed, ppo_trainer.yaml itself (flat in 0.4)."""
    generated = config_dir / "_generated_ppo_trainer.yaml"
    return generated if generated.is_file() else config_dir / "ppo_trainer.yaml"


def _leaves(node, prefix: str = ""):
    for key in node:
        dotted = f"{prefix}{key}"
        if key == verl_keys.HYDRA_TARGET_KEY:
            continue
        if OmegaConf.is_missing(node, key) or OmegaConf.is_interpolation(node, key):
            yield dotted
        elif OmegaConf.is_dict(node[key]) and len(node[key]):
            yield from _leaves(node[key], dotted + ".")
        else:
            yield dotted


@pytest.mark.parametrize("release", RELEASES)
def test_every_leaf_of_verls_default_config_is_read_or_accepted(release: str, tmp_path: Path):
    default = _default_file(_config_dir(release, tmp_path))
    schema = set(_schema_keys(RelmConfig, ""))
    leaves = list(_leaves(OmegaConf.load(default)))
    assert len(leaves) > 250  # the file was read, not an empty stand-in
    renamed = {new for new, _ in RENAMED} | set(MAX_RESP_LEN_KEYS)
    rejected = [
        key
        for key in leaves
        if key not in schema
        and key not in renamed
        and not any(key.startswith(f"{name}.") for name in schema)  # a dict-valued key's entries
        and verl_keys.match_accepted(key) is None
    ]
    assert rejected == []
    cfg, warnings = load_config_with_warnings(["--config", str(default), REAL])
    assert cfg.actor_rollout_ref.actor.optim.warmup_style == "constant"
    assert cfg.reward_model.reward_manager == "naive" and cfg.custom_reward_function.name == "compute_score"
    assert all("\n" not in line for line in warnings)


@pytest.mark.parametrize("release", RELEASES)
def test_verls_own_config_folder_composes_with_config_path_and_name(release: str, tmp_path: Path):
    config_dir = _config_dir(release, tmp_path)
    cfg = load_config(
        ["--config-path", str(config_dir), "--config-name", "ppo_trainer", REAL, "data.max_prompt_length=77"]
    )
    assert cfg.data.max_prompt_length == 77 and cfg.actor_rollout_ref.rollout.prompt_length == 77
    assert cfg.actor_rollout_ref.actor.ppo_epochs == 1 and cfg.algorithm.adv_estimator == "gae"


def test_hydra_override_forms(tmp_path: Path):
    cfg = load_config(
        [
            REAL,
            "+data.max_prompt_length=100",  # add
            "++data.max_response_length=50",  # add or override
            "~data.shuffle",  # delete: the schema's default comes back
            "data.shuffle=false",
            "~data.shuffle=false",
            "trainer.logger=['console','jsonl']",
            "trainer.experiment_name=run-${data.max_prompt_length}",
            "data.train_files=~/data/x.parquet",  # Hydra's grammar takes `~` only quoted; a path needs it
        ]
    )
    assert (cfg.data.max_prompt_length, cfg.data.max_response_length, cfg.data.shuffle) == (100, 50, True)
    assert cfg.trainer.logger == ["console", "jsonl"] and cfg.trainer.experiment_name == "run-100"
    assert cfg.data.train_files == [str(Path("~/data/x.parquet").expanduser())]  # kept a path, then expanded


def test_config_path_composes_a_defaults_list_over_relms_defaults(tmp_path: Path):
    (tmp_path / "actor").mkdir()
    (tmp_path / "actor" / "small.yaml").write_text("ppo_mini_batch_size: 8\nppo_epochs: 2\n")
    (tmp_path / "my_trainer.yaml").write_text(
        "hydra:\n  searchpath:\n    - file://verl/trainer/config\n"
        "defaults:\n  - ppo_trainer\n  - actor@actor_rollout_ref.actor: small\n  - _self_\n"
        "data:\n  train_batch_size: 16\n  gen_batch_size: ${data.train_batch_size}\n"
        "reward_model:\n  reward_manager: dapo\n"
    )
    cfg, warnings = load_config_with_warnings(
        ["--config-path", str(tmp_path), "--config-name=my_trainer.yaml", REAL, "data.train_batch_size=32"]
    )
    assert (
        cfg.actor_rollout_ref.actor.ppo_epochs == 2 and cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 8
    )
    assert cfg.data.train_batch_size == 32 and cfg.reward_model.reward_manager == "dapo"
    assert cfg.actor_rollout_ref.actor.optim.lr == 1e-6  # from relm's defaults, standing in for ppo_trainer
    assert any("`data.gen_batch_size`" in line for line in warnings)


def test_verls_package_config_name_without_its_folder_means_relms_defaults():
    cfg, warnings = load_config_with_warnings(["--config-path=config", "--config-name=ppo_trainer", REAL])
    assert cfg.algorithm.adv_estimator == "gae"
    assert warnings[0].startswith("`config/ppo_trainer.yaml`: verl's default PPO config; relm's defaults")


def test_renamed_keys_act_and_the_later_layer_wins(tmp_path: Path):
    cfg = load_config([REAL, f"{OPTIM}.lr_scheduler_type=cosine", "critic.optim.clip_grad=0.5"])
    assert cfg.actor_rollout_ref.actor.optim.warmup_style == "cosine" and cfg.critic.grad_clip == 0.5
    config = tmp_path / "run.yaml"
    config.write_text(
        "actor_rollout_ref:\n  actor:\n    optim:\n      warmup_style: null\n      lr_scheduler_type: cosine\n"
    )
    assert load_config(["--config", str(config), REAL]).actor_rollout_ref.actor.optim.warmup_style == "cosine"
    later_old = load_config(["--config", str(config), REAL, f"{OPTIM}.warmup_style=constant"])
    assert later_old.actor_rollout_ref.actor.optim.warmup_style == "constant"


def test_dapo_reward_kwargs_switch_on_relms_overlong_shaping(caplog: pytest.LogCaptureFixture):
    kwargs = "+reward_model.reward_kwargs"
    argv = [
        REAL,
        "data.max_response_length=64",
        "reward_model.reward_manager=dapo",
        f"{kwargs}.overlong_buffer_cfg.enable=True",
        f"{kwargs}.overlong_buffer_cfg.len=16",
        f"{kwargs}.overlong_buffer_cfg.penalty_factor=0.5",
        f"{kwargs}.overlong_buffer_cfg.log=False",
        f"{kwargs}.max_resp_len=64",
        "reward_model.use_reward_loop=True",
    ]
    with caplog.at_level(logging.WARNING, logger="relm"):
        cfg = load_config(argv)
    overlong = cfg.reward_model.overlong_buffer
    assert (overlong.enable, overlong.len, overlong.penalty_factor) == (True, 16, 0.5)
    assert [r.message for r in caplog.records if "use_reward_loop" in r.message] == [
        "`reward_model.use_reward_loop`: verl key not used by relm (relm scores rewards in its own reward "
        "workers (`reward_model.num_workers`), not verl's reward loop)"
    ]
    # verl 0.9's own section, as its fully-async DAPO scripts write it.
    new = load_config([REAL, "data.max_response_length=64", "reward.reward_manager.name=dapo",
                       "+reward.reward_kwargs.overlong_buffer_cfg.enable=True",
                       "+reward.reward_kwargs.overlong_buffer_cfg.len=8"])  # fmt: skip
    assert new.reward_model.reward_manager == "dapo" and new.reward_model.overlong_buffer.len == 8
    with pytest.raises(
        UserError, match=r"^`reward_model.reward_kwargs.max_resp_len=32` differs from `data.max_"
    ):
        load_config([*argv[:-2], f"{kwargs}.max_resp_len=32"])
    with pytest.raises(UserError, match=r"^unknown key `reward_model.reward_kwargs.speed`"):
        load_config([REAL, "+reward_model.reward_kwargs.speed=1"])


def test_missing_engine_and_logger_packages_fall_back_with_one_line_each(monkeypatch: pytest.MonkeyPatch):
    for module in ("vllm", "wandb", "tensorboard"):
        monkeypatch.setitem(sys.modules, module, None)  # makes the package look absent, installed or not
    cfg, warnings = load_config_with_warnings(
        [
            REAL,
            "actor_rollout_ref.rollout.name=vllm",
            "trainer.logger=[console,wandb,tensorboard,swanlab,mlflow]",
        ]
    )
    assert cfg.actor_rollout_ref.rollout.name == "native" and cfg.trainer.logger == ["console"]
    notes = [line for line in warnings if "rollout.name" in line or "trainer.logger" in line]
    assert notes == [
        "`actor_rollout_ref.rollout.name=vllm`: vLLM is not installed; generating with relm's native engine "
        "(`make setup-vllm` or `pip install -e .[vllm]` for vLLM)",
        "`trainer.logger` names `wandb` but the `wandb` package is not installed; not logging there "
        "(`pip install wandb` to log there)",
        "`trainer.logger` names `tensorboard` but the `tensorboard` package is not installed; not logging there "
        "(`pip install tensorboard` to log there)",
        "`trainer.logger` names `swanlab`, which relm does not provide yet; not logging there",
        "`trainer.logger` names `mlflow`, which relm does not provide yet; not logging there",
    ]
    sglang = load_config_with_warnings([REAL, "actor_rollout_ref.rollout.name=sglang"])
    assert sglang[0].actor_rollout_ref.rollout.name == "native"
    assert "`actor_rollout_ref.rollout.name=sglang`: relm has no sglang engine" in sglang[1][-1]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ("model_engine=megatorn", "`model_engine=megatorn`: not one of verl's engines; choose one of: dp,"),
        (f"{OPTIM}.optimizer=Muon", f"`{OPTIM}.optimizer=Muon`: relm trains with AdamW only"),
        (
            "actor_rollout_ref.model.lora.rank=8",
            "`actor_rollout_ref.model.lora.rank=8`: Megatron's LoRA section",
        ),
    ],
)
def test_verl_09_features_relm_lacks_stop_with_one_line(argv: str, message: str):
    with pytest.raises(UserError) as err:
        load_config([REAL, argv])
    assert str(err.value).startswith(message)


ENGINE_RELEASE = "0.9.1"


ENGINE_FILES = [
    (ENGINE_RELEASE, f"_generated_ppo_{engine}_trainer.yaml") for engine in ("veomni", "torchtitan")
] + [
    (release, "ppo_megatron_trainer.yaml" if release == "0.4.1" else "_generated_ppo_megatron_trainer.yaml")
    for release in RELEASES
]
"""Each release's Megatron config (flat in 0.4, flattened `_generated_` from 0.5), and 0.9.1's other engines."""


@pytest.mark.parametrize(("release", "file"), ENGINE_FILES)
def test_every_leaf_of_verls_engine_configs_is_read_or_accepted(release: str, file: str, tmp_path: Path):
    config_dir = _config_dir(release, tmp_path)
    engine = file.removeprefix("_generated_").removeprefix("ppo_").removesuffix("_trainer.yaml")
    schema = set(_schema_keys(RelmConfig, ""))
    renamed = {new for new, _ in RENAMED} | set(MAX_RESP_LEN_KEYS)
    leaves = list(_leaves(OmegaConf.load(config_dir / file)))
    assert any(f".{engine}." in key for key in leaves)  # the engine's own section was read
    rejected = [
        key
        for key in leaves
        if key not in schema
        and key not in renamed
        and not any(key.startswith(f"{name}.") for name in schema)
        and verl_keys.match_accepted(key) is None
    ]
    assert rejected == []
    cfg, warnings = load_config_with_warnings(["--config", str(config_dir / file), REAL])  # and it loads
    assert cfg.actor_rollout_ref.actor.strategy == "fsdp" and cfg.critic.strategy == "fsdp"
    assert len([line for line in warnings if f"not {engine}'s;" in line]) == 1


@pytest.mark.parametrize("engine", ["megatron", "veomni", "torchtitan"])
def test_model_engine_group_composes_verls_tree_and_names_the_layout_in_one_line(engine: str, tmp_path: Path):
    """verl 0.9's `model_engine=X` is a config-group selection: Hydra composes the engine's sections."""
    config_dir = _config_dir(ENGINE_RELEASE, tmp_path)
    layout = {
        "megatron": ["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4",
                     "actor_rollout_ref.actor.megatron.context_parallel_size=2"],
        "veomni": ["actor_rollout_ref.actor.veomni.ulysses_parallel_size=2"],
        "torchtitan": ["actor_rollout_ref.actor.torchtitan.pipeline_parallel_size=2"],
    }[engine]  # fmt: skip
    cfg, warnings = load_config_with_warnings(
        [
            "--config-path",
            str(config_dir),
            "--config-name",
            "ppo_trainer",
            f"model_engine={engine}",
            REAL,
            *layout,
        ]
    )
    assert cfg.actor_rollout_ref.actor.strategy == "fsdp" and cfg.critic.strategy == "fsdp"
    lines = [line for line in warnings if "parallel" in line and f".{engine}." in line]
    assert len(lines) == 1 and lines[0].startswith(
        f"`model_engine={engine}`, `actor_rollout_ref.actor.strategy={engine}`, `actor_rollout_ref.ref.strategy={engine}`"
    )
    assert all(f"`{item}`" in lines[0] for item in layout)
    if engine == "megatron":  # the reference's layout is the actor's by interpolation: named once
        assert "ref.megatron.tensor_model_parallel_size" not in " ".join(warnings)


def test_engine_config_names_without_verls_folder_stand_for_relms_defaults():
    cfg, warnings = load_config_with_warnings(
        ["--config-path=config", "--config-name=ppo_megatron_trainer", REAL,
         "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
         "actor_rollout_ref.actor.megatron.sequence_parallel=true"]
    )  # fmt: skip
    assert cfg.actor_rollout_ref.actor.strategy == "fsdp"
    assert warnings[0].startswith("`config/ppo_megatron_trainer.yaml`: verl's megatron PPO config")
    assert warnings[1] == (
        "`model_engine=megatron`: relm trains on its FSDP2 path (each data-parallel rank holds a shard, "
        "`fsdp_config.fsdp_size`), not megatron's; parallel-layout keys not used: "
        "`actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2`, "
        "`actor_rollout_ref.actor.megatron.sequence_parallel=true`"
    )


def test_group_selection_with_package_composes_from_verls_folder(tmp_path: Path):
    config_dir = _config_dir(ENGINE_RELEASE, tmp_path)
    cfg, warnings = load_config_with_warnings(
        ["--config-path", str(config_dir), "--config-name", "ppo_trainer", REAL,
         "actor@actor_rollout_ref.actor=veomni_actor", "actor_rollout_ref.actor.ppo_epochs=3"]
    )  # fmt: skip
    assert cfg.actor_rollout_ref.actor.ppo_epochs == 3 and cfg.actor_rollout_ref.actor.strategy == "fsdp"
    assert any(
        line.startswith("`actor_rollout_ref.actor.strategy=veomni`: relm trains on its FSDP2 path")
        for line in warnings
    )
    assert any("`actor_rollout_ref.actor.veomni.param_offload`" in line for line in warnings)
    with pytest.raises(UserError, match=r"Hydra cannot compose it"):
        load_config(
            [
                "--config-path",
                str(config_dir),
                "--config-name",
                "ppo_trainer",
                REAL,
                "actor@actor_rollout_ref.actor=nope",
            ]
        )


def test_a_group_selection_without_a_config_folder_uses_the_installed_verls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """verl's scripts pass `--config-path=config` (verl's package folder); relm looks in the installed verl's."""
    from relm.config import hydra_compose

    selection = "actor@actor_rollout_ref.actor=megatron_actor"
    monkeypatch.setattr(hydra_compose, "verl_config_dir", lambda: None)
    with pytest.raises(UserError) as err:
        load_config(["--config-path=config", "--config-name=ppo_trainer", REAL, selection])
    assert str(err.value).startswith(
        f"`{selection}`: a config-group selection is resolved in verl's config folder"
    )
    installed = _config_dir(ENGINE_RELEASE, tmp_path)
    monkeypatch.setattr(hydra_compose, "verl_config_dir", lambda: installed)
    cfg, warnings = load_config_with_warnings([REAL, selection])  # verl's main_ppo: ppo_trainer by default
    assert cfg.actor_rollout_ref.actor.strategy == "fsdp"
    assert any(
        line.startswith("`actor_rollout_ref.actor.param_offload`") is False and "actor.megatron." in line
        for line in warnings
    )
    assert any(
        line.startswith("`actor_rollout_ref.actor.strategy=megatron`: relm trains on its FSDP2 path")
        for line in warnings
    )


def test_megatrons_nested_model_overrides_are_the_hugging_face_configs():
    base = ["--config-path=config", "--config-name=ppo_megatron_trainer", REAL]
    cfg = load_config(
        [*base, "+actor_rollout_ref.model.override_config.model_config.max_position_embeddings=99",
         "+actor_rollout_ref.model.override_config.moe_config.freeze_moe_router=false"]
    )  # fmt: skip
    assert cfg.actor_rollout_ref.model.override_config == {"max_position_embeddings": 99}
    with pytest.raises(UserError, match=r"moe_config.freeze_moe_router=true`: freezing the MoE router"):
        load_config([*base, "+actor_rollout_ref.model.override_config.moe_config.freeze_moe_router=true"])
