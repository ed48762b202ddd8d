"""Config loading (file + dotted overrides), the demo preset, verl compatibility and validation."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from relm.config import docs_gen, verl_keys
from relm.config.loader import DEMO_PRESET, _schema_keys, load_config, load_config_with_warnings
from relm.config.schema import RelmConfig
from relm.config.validate import CONFIG_OK_MESSAGE, validate_config
from relm.errors import UserError

# Any value of data.train_files turns the demo preset off; the loader never opens the file.
REAL = "data.train_files=/data/train.parquet"
ACT, RO, MODEL = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.model"
DEMO_BATCH = OmegaConf.load(DEMO_PRESET).data.train_batch_size
# Fixed sizes under the validation tests, so their messages do not move when the demo preset is tuned.
SIZES = (
    f"data.train_batch_size=16 data.max_response_length=16 {RO}.n=4 {ACT}.ppo_mini_batch_size=8 "
    f"{ACT}.ppo_micro_batch_size_per_gpu=16"
).split()


def get(cfg: object, dotted: str) -> object:
    for name in dotted.split("."):
        cfg = getattr(cfg, name)
    return cfg


def values(cfg: object, keys: str) -> tuple[object, ...]:
    return tuple(get(cfg, key) for key in keys.split())


def test_no_arguments_runs_the_demo_preset_under_the_defaults():
    cfg = load_config([])
    assert cfg.data.train_files is None
    preset = OmegaConf.to_container(OmegaConf.load(DEMO_PRESET))
    # Every value the preset names is what the loaded config holds.
    stack = [("", preset)]
    while stack:
        prefix, node = stack.pop()
        for key, value in node.items():
            if isinstance(value, dict):
                stack.append((f"{prefix}{key}.", value))
            else:
                assert get(cfg, prefix + key) == value, prefix + key
    assert cfg.data.max_prompt_length >= 20  # the demo prompt with its chat template
    assert cfg.actor_rollout_ref.model.path == "zoo:tiny/qwen2"  # schema default, untouched by the preset
    validate_config(cfg)


def test_user_values_sit_above_the_demo_preset():
    cfg = load_config(["trainer.total_training_steps=3", "data.max_response_length=8"])
    assert values(cfg, "trainer.total_training_steps data.max_response_length data.train_batch_size") == (
        3,
        8,
        DEMO_BATCH,
    )


@pytest.mark.parametrize("in_file", [False, True])
def test_train_files_anywhere_turns_the_demo_preset_off(tmp_path: Path, in_file: bool):
    config = tmp_path / "run.yaml"
    config.write_text("data:\n  train_files: /data/train.parquet\n")
    cfg = load_config(["--config", str(config)] if in_file else [REAL])
    assert cfg.data.train_files == ["/data/train.parquet"]
    assert values(cfg, f"data.max_prompt_length data.train_batch_size {RO}.n") == (512, 1024, 1)
    # The default's interpolations resolved, with the experiment named for the data and the model
    # (/data/train.parquet, zoo:tiny/qwen2), not the demo's name.
    assert cfg.trainer.default_local_dir == "checkpoints/relm/data-qwen2"


def test_a_later_null_train_files_brings_the_demo_preset_back():
    assert load_config([REAL, "data.train_files=null"]).data.train_batch_size == DEMO_BATCH


def test_overrides_win_over_the_file_in_order(tmp_path: Path):
    config = tmp_path / "run.yaml"
    config.write_text("data:\n  train_batch_size: 32\n  max_prompt_length: 64\ntrainer:\n  project_name: p\n")
    cfg = load_config([f"--config={config}", REAL, "data.train_batch_size=64", "data.train_batch_size=128"])
    assert values(cfg, "data.train_batch_size data.max_prompt_length trainer.project_name") == (128, 64, "p")


@pytest.mark.parametrize(
    ("override", "key", "expected"),
    [
        (f"{ACT}.optim.lr=1e-3", f"{ACT}.optim.lr", 0.001),
        (f"{RO}.top_p=1", f"{RO}.top_p", 1.0),
        ("trainer.logger=['console','jsonl']", "trainer.logger", ["console", "jsonl"]),
        ("trainer.logger=[console]", "trainer.logger", ["console"]),
        ("trainer.logger=console", "trainer.logger", ["console"]),
        ("data.val_files=/x.parquet", "data.val_files", ["/x.parquet"]),
        ("data.val_files=['/a.parquet', '/b.parquet']", "data.val_files", ["/a.parquet", "/b.parquet"]),
        ("data.val_batch_size=null", "data.val_batch_size", None),
        ("data.shuffle=false", "data.shuffle", False),
        ("+trainer.val_before_train=False", "trainer.val_before_train", False),
        ("++data.shuffle=False", "data.shuffle", False),
        ("trainer.experiment_name=123", "trainer.experiment_name", "123"),
        ("trainer.project_name='0.5b'", "trainer.project_name", "0.5b"),
        (f"{MODEL}.override_config={{attn_implementation: eager}}", f"{MODEL}.override_config",
         {"attn_implementation": "eager"}),
        (f"{ACT}.optim.betas=[0.8,0.95]", f"{ACT}.optim.betas", (0.8, 0.95)),
        ("trainer.default_local_dir=runs/${trainer.project_name}", "trainer.default_local_dir", "runs/relm"),
        ("seed=7", "data.seed", 7),
    ],
)  # fmt: skip
def test_override_values_are_parsed_as_yaml_and_typed(override: str, key: str, expected: object):
    value = get(load_config([REAL, override]), key)
    assert value == expected and type(value) is type(expected)


def test_interpolations_resolve_across_file_and_overrides(tmp_path: Path):
    config = tmp_path / "run.yaml"
    config.write_text(
        "trainer:\n  experiment_name: exp1\n  default_local_dir: /runs/${trainer.experiment_name}\n"
        "actor_rollout_ref:\n  rollout:\n    response_length: ${oc.select:data.max_response_length,512}\n"
    )
    argv = ["--config", str(config), REAL, "trainer.experiment_name=exp2", "data.max_response_length=99"]
    assert values(load_config(argv), f"trainer.default_local_dir {RO}.response_length") == ("/runs/exp2", 99)


def test_derived_keys_are_filled_from_their_sources():
    cfg = load_config(
        [REAL, "seed=3", f"{ACT}.clip_ratio=0.3", f"{ACT}.clip_ratio_high=0.28", f"{ACT}.ppo_epochs=2",
         f"{ACT}.ppo_micro_batch_size_per_gpu=4", "critic.ppo_micro_batch_size_per_gpu=2"]
    )  # fmt: skip
    assert values(cfg, f"{RO}.prompt_length {RO}.response_length") == (512, 512)
    assert values(cfg, f"{ACT}.clip_ratio_low {ACT}.clip_ratio_high") == (0.3, 0.28)
    assert values(cfg, "critic.ppo_mini_batch_size critic.ppo_epochs") == (256, 2)
    assert values(cfg, "critic.ppo_micro_batch_size_per_gpu critic.forward_micro_batch_size_per_gpu") == (
        2,
        2,
    )
    log_prob = "log_prob_micro_batch_size_per_gpu"
    assert values(cfg, f"actor_rollout_ref.ref.{log_prob} {RO}.{log_prob} data.seed") == (4, 4, 3)
    assert load_config([REAL, "seed=3", "data.seed=5"]).data.seed == 5


def test_deprecated_global_micro_batch_size_is_divided_by_the_gpus_with_a_warning():
    argv = [REAL, "trainer.n_gpus_per_node=4", "trainer.nnodes=2", f"{ACT}.ppo_micro_batch_size=64"]
    cfg, warnings = load_config_with_warnings(argv)
    assert values(cfg, f"{ACT}.ppo_micro_batch_size_per_gpu {ACT}.ppo_micro_batch_size") == (
        8,
        None,
    )  # 64 / 8
    assert cfg.critic.ppo_micro_batch_size_per_gpu == 8
    assert warnings == [
        f"`{ACT}.ppo_micro_batch_size` is deprecated: converted to `{ACT}.ppo_micro_batch_size_per_gpu=8` "
        "(64 / 8 GPUs); set that key instead"
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ("data.max_prompt_lenght=5",
         "unknown key `data.max_prompt_lenght`; did you mean `data.max_prompt_length`?"),
        ("actor_rollout_ref.actr.optim.lr=1",
         f"unknown key `actor_rollout_ref.actr.optim.lr`; did you mean `{ACT}.optim.lr`?"),
        ("zzz.qqq=1", "unknown key `zzz.qqq`; docs/configuration.md lists"),
        ("data.train_batch_size=1.5", "`data.train_batch_size` must be an integer, got 1.5 (a float)"),
        ("data.train_batch_size=true", "`data.train_batch_size` must be an integer, got true (a boolean)"),
        ("data.shuffle=maybe", "`data.shuffle` must be true or false, got 'maybe' (a string)"),
        (f"{ACT}.optim.lr=fast", f"`{ACT}.optim.lr` must be a number, got 'fast'"),
        ("data.prompt_key=null", "`data.prompt_key` must be a string, got null"),
        ("data.val_batch_size=1.5", "`data.val_batch_size` must be an integer or null, got 1.5"),
        ("trainer.logger=[console,3.5]", "`trainer.logger` must be a list of strings (or a single one)"),
        (f"{ACT}.optim.betas=[0.9]", f"`{ACT}.optim.betas` must be a list of 2 numbers, got [0.9]"),
        (f"{MODEL}.override_config=eager", f"`{MODEL}.override_config` must be a mapping"),
        (f"{ACT}.optim=3", f"`{ACT}.optim` is a section, not a value; set its keys, e.g. `{ACT}.optim.lr="),
        (f"{ACT}.optim=[1]", f"`{ACT}.optim=[1]`: does not fit the config's shape"),
        ("trainer.logger.name=console", "`trainer.logger.name=console`: does not fit the config's shape"),
        ("data.train_batch_size", "`data.train_batch_size`: an override must look like `section.key=value`"),
        ("~data.shuffle=false", "`~data.shuffle=false`: `data.shuffle` is True, not False"),
        ("~data.no_such_key", "`~data.no_such_key`: there is no key `data.no_such_key` to delete"),
        ("data.train_batch_size=1,2", "`data.train_batch_size=1,2`: a sweep (several values) needs Hydra's"),
        ("data..shuffle=1", "`data..shuffle=1`: malformed key"),
        ("trainer.logger=[console", "`trainer.logger=[console`: cannot parse the value (no viable alternative"),
        ("trainer.project_name=${nowhere.key}", "`trainer.project_name`: cannot resolve its value"),
        ("--verbose", "`--verbose`: unknown option"),
        ("--config", "`--config` needs a value"),
        ("--config-path=conf", "`--config-path conf` needs `--config-name NAME`"),
        ("--config-name=my_megatron_trainer", "`--config-name my_megatron_trainer`: the folder is not there"),
    ],
)  # fmt: skip
def test_load_errors_name_the_culprit_first(argv: str, message: str):
    with pytest.raises(UserError) as err:
        load_config(argv.split())
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def test_config_file_errors_name_the_file(tmp_path: Path):
    missing, broken, listed = tmp_path / "missing.yaml", tmp_path / "broken.yaml", tmp_path / "list.yaml"
    broken.write_text("data:\n  train_batch_size: [1, 2\n")
    listed.write_text("- 1\n- 2\n")
    with pytest.raises(UserError, match=r"^`.*missing\.yaml`: config file not found$"):
        load_config(["--config", str(missing)])
    with pytest.raises(UserError, match=r"^`.*broken\.yaml`: not a readable YAML config \(.*line 3"):
        load_config(["--config", str(broken)])
    with pytest.raises(UserError, match=r"^`.*list\.yaml`: the top level must be a mapping"):
        load_config(["--config", str(listed)])


def test_ignored_verl_keys_warn_once_each_and_change_nothing(caplog: pytest.LogCaptureFixture):
    argv = [REAL, f"{ACT}.fsdp_config.param_offload=True", "ray_init.num_cpus=4",
            f"{RO}.multi_turn.use_inference_chat_template=true", f"{RO}.agent.num_workers=2",
            "algorithm._target_=verl.trainer.config.AlgoConfig"]  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="relm"):
        cfg = load_config(argv)
    assert cfg == load_config([REAL])
    assert [record.getMessage() for record in caplog.records] == [
        f"`{ACT}.fsdp_config.param_offload`: verl key not used by relm (on one GPU the memory plan decides what "
        "waits in CPU memory; when sharded, `fsdp_config.offload_policy` (unset: relm decides))",
        f"`{RO}.multi_turn.use_inference_chat_template`: verl key not used by relm (relm never re-tokenizes a "
        "conversation: the ids trained on are the ids sampled plus the tool ids)",
        f"`{RO}.agent.num_workers`: verl key not used by relm (relm's multi-turn rollouts run in-process under "
        "`rollout.multi_turn.*`, without agent loop workers)",
        "`ray_init.num_cpus`: verl key not used by relm "
        "(relm runs without Ray (processes start with torchrun))",
    ]


def test_a_verl_style_file_with_targets_and_interpolations_loads(tmp_path: Path):
    config = tmp_path / "verl.yaml"
    config.write_text(
        "actor_rollout_ref:\n"
        "  actor:\n    _target_: verl.workers.config.FSDPActorConfig\n    use_dynamic_bsz: true\n"
        "    checkpoint:\n      save_contents: [model, optimizer]\n      load_contents: ${.save_contents}\n"
        "  rollout:\n    name: ???\n"
        "  ref:\n    log_prob_use_dynamic_bsz: ${oc.select:actor_rollout_ref.actor.use_dynamic_bsz,false}\n"
        "    ulysses_sequence_parallel_size: ${does.not.exist}\n"  # ignored keys are never resolved
        "global_profiler:\n  _target_: verl.utils.profiler.ProfilerConfig\n  tool: null\n"
        "data:\n  train_files: [/a.parquet]\n"
    )
    cfg, warnings = load_config_with_warnings(["--config", str(config)])
    assert cfg.actor_rollout_ref.actor.use_dynamic_bsz is True
    assert cfg.actor_rollout_ref.rollout.name == "native"  # verl's `???` placeholder keeps relm's default
    assert [line.split(":")[0] for line in warnings] == [
        f"`{ACT}.checkpoint.save_contents`, `{ACT}.checkpoint.load_contents`",
        "`actor_rollout_ref.ref.log_prob_use_dynamic_bsz`",
        "`actor_rollout_ref.ref.ulysses_sequence_parallel_size`",
        "`global_profiler.tool`",
    ]


# verl's example scripts (examples/ppo_trainer/run_deepseek7b_llm.sh, run_qwen2-7b_seq_balance.sh and a
# GRPO run) with the two values relm cannot honour here replaced: rollout.name=vllm (tensor-parallel, and vLLM
# need not be installed) and the wandb logger.
VERL_GAE = """
algorithm.adv_estimator=gae data.train_files=/home/u/data/gsm8k/train.parquet
data.val_files=/home/u/data/gsm8k/test.parquet data.train_batch_size=1024 data.max_prompt_length=512
data.max_response_length=512 data.filter_overlong_prompts=True data.truncation=error
actor_rollout_ref.model.path=deepseek-ai/deepseek-llm-7b-chat actor_rollout_ref.actor.optim.lr=1e-6
actor_rollout_ref.model.use_remove_padding=True actor_rollout_ref.actor.ppo_mini_batch_size=256
actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16
actor_rollout_ref.actor.fsdp_config.param_offload=False
actor_rollout_ref.actor.fsdp_config.optimizer_offload=False actor_rollout_ref.actor.use_kl_loss=False
actor_rollout_ref.model.enable_gradient_checkpointing=True
actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32
actor_rollout_ref.rollout.tensor_model_parallel_size=4
actor_rollout_ref.rollout.name=hf actor_rollout_ref.rollout.gpu_memory_utilization=0.4 critic.optim.lr=1e-5
critic.model.use_remove_padding=False critic.model.path=deepseek-ai/deepseek-llm-7b-chat
critic.model.enable_gradient_checkpointing=True critic.ppo_micro_batch_size_per_gpu=32
critic.model.fsdp_config.param_offload=False critic.model.fsdp_config.optimizer_offload=False
algorithm.use_kl_in_reward=False trainer.critic_warmup=0 trainer.logger=['console']
trainer.project_name='verl_example_gsm8k' trainer.experiment_name='deepseek_llm_7b_function_rm'
trainer.n_gpus_per_node=8 trainer.nnodes=1 trainer.total_training_steps=2 trainer.use_legacy_worker_impl=False
trainer.total_epochs=15
"""
VERL_SEQ_BALANCE = """
data.train_files=['/home/u/data/gsm8k/train.parquet','hdfs://h/math/train.parquet']
data.val_files=['/home/u/data/gsm8k/test.parquet','hdfs://h/math/test.parquet'] data.train_batch_size=4096
data.val_batch_size=1312 data.max_prompt_length=4096 data.max_response_length=4096
actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct actor_rollout_ref.actor.optim.lr=1e-6
actor_rollout_ref.model.use_remove_padding=True actor_rollout_ref.model.enable_gradient_checkpointing=True
actor_rollout_ref.actor.ppo_mini_batch_size=512 actor_rollout_ref.actor.ppo_micro_batch_size=128
actor_rollout_ref.actor.use_dynamic_bsz=True actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384
actor_rollout_ref.actor.fsdp_config.param_offload=False actor_rollout_ref.actor.fsdp_config.grad_offload=False
actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
actor_rollout_ref.rollout.log_prob_micro_batch_size=256 actor_rollout_ref.rollout.tensor_model_parallel_size=2
actor_rollout_ref.rollout.name=hf actor_rollout_ref.rollout.gpu_memory_utilization=0.5
actor_rollout_ref.ref.log_prob_micro_batch_size=256 actor_rollout_ref.ref.fsdp_config.param_offload=True
critic.optim.lr=1e-5 critic.model.use_remove_padding=True critic.model.path=Qwen/Qwen2.5-Math-PRM-7B
critic.model.enable_gradient_checkpointing=True critic.ppo_micro_batch_size=256
critic.model.fsdp_config.param_offload=False critic.model.fsdp_config.grad_offload=False
critic.model.fsdp_config.optimizer_offload=False algorithm.kl_ctrl.kl_coef=0.001 trainer.critic_warmup=0
trainer.logger=['console','jsonl'] trainer.project_name='verl_example_gsm8k'
trainer.experiment_name='qwen2-7b_function_rm_bsz8k_p4k_r4k_seq_packing' trainer.n_gpus_per_node=8
+trainer.val_before_train=False trainer.nnodes=1 trainer.save_freq=-1 trainer.test_freq=5
trainer.total_epochs=15
"""
VERL_GRPO = """
algorithm.adv_estimator=grpo data.train_files=/d/train.parquet data.val_files=/d/test.parquet
data.train_batch_size=1024 data.max_prompt_length=1024 data.max_response_length=1024
data.filter_overlong_prompts=True data.truncation=error actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct
actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.model.use_remove_padding=True
actor_rollout_ref.actor.ppo_mini_batch_size=256 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40
actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_coef=0.001
actor_rollout_ref.actor.kl_loss_type=low_var_kl actor_rollout_ref.actor.entropy_coeff=0
actor_rollout_ref.model.enable_gradient_checkpointing=True
actor_rollout_ref.actor.fsdp_config.param_offload=False
actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40
actor_rollout_ref.rollout.tensor_model_parallel_size=2
actor_rollout_ref.rollout.name=hf actor_rollout_ref.rollout.gpu_memory_utilization=0.6
actor_rollout_ref.rollout.n=5
actor_rollout_ref.rollout.enable_chunked_prefill=True actor_rollout_ref.rollout.max_num_batched_tokens=8192
actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=40
actor_rollout_ref.ref.fsdp_config.param_offload=True
actor_rollout_ref.actor.use_torch_compile=False actor_rollout_ref.actor.ulysses_sequence_parallel_size=1
algorithm.use_kl_in_reward=False trainer.critic_warmup=0 trainer.logger=['console']
trainer.project_name=verl_grpo
trainer.experiment_name=qwen2_7b trainer.n_gpus_per_node=8 trainer.nnodes=1 trainer.save_freq=20
trainer.test_freq=5 ray_init.num_cpus=32 trainer.total_epochs=15
"""


@pytest.mark.parametrize(
    "command", [VERL_GAE, VERL_SEQ_BALANCE, VERL_GRPO], ids=["gae", "seq_balance", "grpo"]
)
def test_verl_example_command_lines_load_with_only_warnings(command: str):
    cfg, warnings = load_config_with_warnings(command.split())
    validate_config(cfg, max_position_embeddings=32768)
    assert warnings and all("verl key" in line or "is deprecated" in line for line in warnings)
    assert values(cfg, f"trainer.n_gpus_per_node {RO}.name") == (8, "hf")


def test_verl_seq_balance_command_converts_its_global_micro_batch_sizes():
    cfg, _ = load_config_with_warnings(VERL_SEQ_BALANCE.split())
    assert cfg.data.train_files == ["/home/u/data/gsm8k/train.parquet", "hdfs://h/math/train.parquet"]
    log_prob = "log_prob_micro_batch_size_per_gpu"
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 16  # 128 / 8 GPUs
    assert values(cfg, f"{RO}.{log_prob} actor_rollout_ref.ref.{log_prob}") == (32, 32)
    assert values(cfg, "critic.ppo_micro_batch_size_per_gpu trainer.val_before_train") == (32, False)


# Each case breaks one rule of the demo preset (batch 16, mini 8, micro 16, n 4, one GPU, GAE).
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ("data.max_prompt_length=0", "`data.max_prompt_length` must be a positive integer, got 0"),
        ("data.max_response_length=-1", "`data.max_response_length` must be a positive integer"),
        ("data.train_batch_size=0", "`data.train_batch_size` must be a positive integer"),
        ("data.val_batch_size=0", "`data.val_batch_size` must be a positive integer"),
        (f"{ACT}.ppo_mini_batch_size=0", f"`{ACT}.ppo_mini_batch_size` must be a positive integer"),
        (f"{ACT}.ppo_micro_batch_size_per_gpu=0", f"`{ACT}.ppo_micro_batch_size_per_gpu` must be a positive"),
        (f"{ACT}.ppo_epochs=0", f"`{ACT}.ppo_epochs` must be a positive integer"),
        (f"{RO}.n=0", f"`{RO}.n` must be a positive integer"),
        ("critic.ppo_epochs=0", "`critic.ppo_epochs` must be a positive integer"),
        ("trainer.total_epochs=0", "`trainer.total_epochs` must be a positive integer"),
        ("trainer.total_training_steps=0", "`trainer.total_training_steps` must be a positive integer"),
        (f"{ACT}.optim.lr=0", f"`{ACT}.optim.lr` must be greater than 0, got 0.0"),
        ("critic.optim.lr=-1e-5", "`critic.optim.lr` must be greater than 0"),
        (f"{ACT}.clip_ratio=0", f"`{ACT}.clip_ratio` must be greater than 0"),
        (f"{ACT}.clip_ratio_low=-0.1", f"`{ACT}.clip_ratio_low` must be 0 or more"),
        (f"{ACT}.optim.weight_decay=-0.1", f"`{ACT}.optim.weight_decay` must be 0 or more"),
        ("algorithm.kl_ctrl.kl_coef=-1", "`algorithm.kl_ctrl.kl_coef` must be 0 or more"),
        (f"{RO}.temperature=-0.5", f"`{RO}.temperature` must be 0 or more"),
        (f"{RO}.top_p=1.5", f"`{RO}.top_p` must be between 0 and 1, got 1.5"),
        (f"{RO}.val_kwargs.top_p=-0.1", f"`{RO}.val_kwargs.top_p` must be between 0 and 1"),
        (f"{RO}.gpu_memory_utilization=1.2", f"`{RO}.gpu_memory_utilization` must be between 0 and 1"),
        (f"{RO}.gpu_memory_utilization=0", f"`{RO}.gpu_memory_utilization` must be above 0"),
        ("algorithm.gamma=1.01", "`algorithm.gamma` must be between 0 and 1"),
        (f"{ACT}.optim.min_lr_ratio=2", f"`{ACT}.optim.min_lr_ratio` must be between 0 and 1"),
        (f"{RO}.top_k=-2", f"`{RO}.top_k` must be -1 (off) or a count of 0 or more"),
        (f"{RO}.val_kwargs.top_k=-3", f"`{RO}.val_kwargs.top_k` must be -1 (off)"),
        (f"{ACT}.clip_ratio_c=1.0", f"`{ACT}.clip_ratio_c` must be greater than 1"),
        ("algorithm.kl_ctrl.type=adaptive algorithm.kl_ctrl.target_kl=0", "`algorithm.kl_ctrl` (adaptive)"),
        ("algorithm.adv_estimator=ppo",
         "`algorithm.adv_estimator=ppo` is not supported; choose one of: gae, grpo, rloo, "
         "reinforce_plus_plus, reinforce_plus_plus_baseline, remax, opo"),
        (f"{ACT}.loss_agg_mode=mean", f"`{ACT}.loss_agg_mode=mean` is not supported; choose one of: token-"),
        (f"{ACT}.policy_loss.loss_mode=ppo2", f"`{ACT}.policy_loss.loss_mode=ppo2` is not supported"),
        (f"{ACT}.kl_loss_type=full",
         f"`{ACT}.kl_loss_type=full` is not supported; choose one of: kl, abs, mse, low_var_kl, k1, k2, k3"),
        ("algorithm.kl_penalty=js", "`algorithm.kl_penalty=js` is not supported"),
        ("algorithm.kl_ctrl.type=pid", "`algorithm.kl_ctrl.type=pid` is not supported; choose one of: fixed"),
        ("critic.optim.warmup_style=linear", "`critic.optim.warmup_style=linear` is not supported"),
        (f"{RO}.name=tgi", f"`{RO}.name=tgi` is not supported; choose one of: native, hf, vllm"),
        (f"{RO}.timeout_s=0", f"`{RO}.timeout_s` must be greater than 0 (null: no limit), got 0"),
        (f"{RO}.max_model_len=20", f"`{RO}.max_model_len=20` is shorter than a prompt plus its response"),
        (f"{RO}.max_num_seqs=0", f"`{RO}.max_num_seqs` must be a positive integer, got 0"),
        (f"{ACT}.strategy=deepspeed", f"`{ACT}.strategy=deepspeed` is not supported"),
        (f"{MODEL}.dtype=fp8", f"`{MODEL}.dtype=fp8` is not supported"),
        ("data.truncation=cut", "`data.truncation=cut` is not supported"),
        ("reward.reward_manager.name=remote", "`reward_model.reward_manager=remote` is not supported"),
        ("algorithm.filter_groups.enable=true actor_rollout_ref.rollout.n=1 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", "`algorithm.filter_groups.enable=true` needs groups"),
        ("reward_model.overlong_buffer.enable=true", "`reward_model.overlong_buffer.len=0` must be between"),
        ("algorithm.filter_groups.enable=true algorithm.filter_groups.metric=null",
         "`algorithm.filter_groups.enable=true` needs `algorithm.filter_groups.metric`"),
        ("trainer.device=tpu", "`trainer.device=tpu` is not supported; choose one of: auto, cpu, cuda"),
        ("trainer.resume_mode=latest", "`trainer.resume_mode=latest` is not supported"),
        ("trainer.logger=[console,foo]", "`trainer.logger=foo` is not supported; choose one of: console"),
        ("trainer.n_gpus_per_node=3", "`data.train_batch_size=16` x `rollout.n=4` = 64 responses do not"),
        (f"algorithm.adv_estimator=grpo_passk {RO}.n=1", f"`{RO}.n=1`: `grpo_passk` rewards the best of"),
        (f"{ACT}.ppo_mini_batch_size=32", f"`{ACT}.ppo_mini_batch_size=32` exceeds `data.train_batch_size"),
        ("data.train_batch_size=12", f"`{ACT}.ppo_mini_batch_size=8` must divide `data.train_batch_size=12`"),
        (f"{ACT}.ppo_micro_batch_size_per_gpu=5",
         f"`{ACT}.ppo_micro_batch_size_per_gpu=5` x 1 GPUs must divide the 32 responses of a mini-batch"),
        ("critic.ppo_micro_batch_size_per_gpu=5", "`critic.ppo_micro_batch_size_per_gpu=5` x 1 GPUs must"),
        ("critic.ppo_mini_batch_size=32", "`critic.ppo_mini_batch_size=32` exceeds `data.train_batch_size"),
        ("reward_model.enable=true", "`reward_model.enable=true` needs `reward_model.model.path="),
        ("data.custom_cls.path=my_dataset.py", "`data.custom_cls.path=my_dataset.py` needs `data.custom_cls.name=CLASS`"),
        ("trainer.resume_mode=resume_path", "`trainer.resume_mode=resume_path` needs `trainer.resume_from"),
        (f"{RO}.response_length=8", f"`{RO}.response_length=8` differs from `data.max_response_length=16`"),
    ],
)  # fmt: skip
def test_each_validation_rule_names_the_key(overrides: str, message: str):
    cfg = load_config(SIZES + overrides.split())
    with pytest.raises(UserError) as err:
        validate_config(cfg)
    assert str(err.value).startswith(message)


@pytest.mark.parametrize(
    "overrides",
    [
        f"{RO}.top_k=0",
        f"{RO}.gpu_memory_utilization=1",
        f"{RO}.temperature=0",
        f"{ACT}.use_dynamic_bsz=true critic.use_dynamic_bsz=true {ACT}.ppo_micro_batch_size_per_gpu=5",
        "algorithm.adv_estimator=grpo critic.ppo_micro_batch_size_per_gpu=5",  # no critic without GAE
        "trainer.resume_mode=resume_path trainer.resume_from_path=outputs/demo/global_step_10",
        f"trainer.n_gpus_per_node=2 {ACT}.ppo_micro_batch_size_per_gpu=8",
        f"{RO}.response_length=16",
        f"{ACT}.strategy=fsdp2 {ACT}.kl_loss_type=k3",
    ],
)
def test_values_at_the_edge_of_each_rule_pass(overrides: str):
    validate_config(load_config(SIZES + overrides.split()))


def test_context_length_is_checked_against_the_model_limit():
    cfg = load_config(["data.max_prompt_length=20", "data.max_response_length=12"])
    validate_config(cfg, max_position_embeddings=32)
    with pytest.raises(UserError) as err:
        validate_config(cfg, max_position_embeddings=31)
    assert str(err.value) == (
        "`data.max_prompt_length=20` + `data.max_response_length=12` = 32 exceeds the model's "
        "max_position_embeddings=31; shorten one of them"
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (f"{ACT}.ppo_micro_batch_size=64 {ACT}.ppo_micro_batch_size_per_gpu=8",
         f"`{ACT}.ppo_micro_batch_size` and `{ACT}.ppo_micro_batch_size_per_gpu` are both set"),
        ("trainer.n_gpus_per_node=8 critic.ppo_micro_batch_size=12",
         "`critic.ppo_micro_batch_size=12` (deprecated, counted over all GPUs) must be a positive multiple "
         "of the 8 GPUs"),
        ("trainer.n_gpus_per_node=0", "`trainer.n_gpus_per_node` x `trainer.nnodes` must be at least 1"),
    ],
)  # fmt: skip
def test_deprecated_sizes_that_cannot_be_converted_are_errors(overrides: str, message: str):
    with pytest.raises(UserError) as err:
        load_config(overrides.split())
    assert str(err.value).startswith(message)


def test_config_ok_message_is_the_one_verl_prints():
    assert CONFIG_OK_MESSAGE == "All configuration checks passed successfully!"


# The dotted keys of verl's default PPO config: ppo_trainer.yaml of verl 0.3-0.4 and the flattened
# _generated_ppo_trainer.yaml of 0.5 (names only; Hydra `_target_` keys left out).
_PROFILER = "tool enable all_ranks ranks save_path tool_config"
_FSDP = "param_offload optimizer_offload offload_policy reshard_after_forward fsdp_size forward_prefetch"
VERL_DEFAULT_KEYS = {
    "data": "tokenizer use_shm train_files val_files prompt_key reward_fn_key max_prompt_length "
    "max_response_length train_batch_size val_batch_size return_raw_input_ids return_raw_chat "
    "return_full_prompt shuffle dataloader_num_workers validation_shuffle filter_overlong_prompts "
    "filter_overlong_prompts_workers truncation image_key video_key trust_remote_code "
    "return_multi_modal_inputs apply_chat_template_kwargs",
    "data.custom_cls": "path name",
    "data.sampler": "class_path class_name",
    "data.datagen": "path name",
    "actor_rollout_ref": "hybrid_engine nccl_timeout",
    MODEL: "path custom_chat_template use_shm external_lib override_config enable_gradient_checkpointing "
    "enable_activation_offload use_remove_padding lora_rank lora_alpha target_modules exclude_modules "
    "use_liger use_fused_kernels trust_remote_code return_last_hidden_state use_fused_loss",
    f"{MODEL}.fused_kernel_options": "impl_backend",
    ACT: "strategy ppo_mini_batch_size ppo_micro_batch_size ppo_micro_batch_size_per_gpu use_dynamic_bsz "
    "ppo_max_token_len_per_gpu clip_ratio clip_ratio_low clip_ratio_high clip_ratio_c loss_agg_mode "
    "entropy_coeff use_kl_loss use_torch_compile kl_loss_coef kl_loss_type ppo_epochs shuffle "
    "use_fused_kernels grad_clip ulysses_sequence_parallel_size entropy_from_logits_with_chunking "
    "entropy_checkpointing use_remove_padding",
    f"{ACT}.policy_loss": "loss_mode clip_cov_ratio clip_cov_lb clip_cov_ub kl_cov_ratio ppo_kl_coef",
    f"{ACT}.checkpoint": "contents save_contents load_contents async_save",
    f"{ACT}.optim": "lr lr_warmup_steps lr_warmup_steps_ratio min_lr_ratio num_cycles warmup_style "
    "total_training_steps weight_decay",
    f"{ACT}.profiler": _PROFILER,
    f"{ACT}.profiler.tool_config.torch": "step_start step_end",
    f"{ACT}.fsdp_config": f"{_FSDP} grad_offload",
    f"{ACT}.fsdp_config.wrap_policy": "min_num_params",
    "actor_rollout_ref.ref": "strategy use_torch_compile log_prob_micro_batch_size "
    "log_prob_micro_batch_size_per_gpu log_prob_use_dynamic_bsz log_prob_max_token_len_per_gpu model "
    "ulysses_sequence_parallel_size entropy_from_logits_with_chunking entropy_checkpointing",
    "actor_rollout_ref.ref.profiler": _PROFILER,
    "actor_rollout_ref.ref.fsdp_config": "param_offload reshard_after_forward forward_prefetch",
    "actor_rollout_ref.ref.fsdp_config.wrap_policy": "min_num_params",
    RO: "name mode chat_scheduler temperature top_k top_p use_fire_sampling prompt_length response_length "
    "dtype gpu_memory_utilization ignore_eos enforce_eager cudagraph_capture_sizes free_cache_engine "
    "load_format layered_summon tensor_model_parallel_size max_num_batched_tokens max_model_len max_num_seqs "
    "log_prob_micro_batch_size log_prob_micro_batch_size_per_gpu log_prob_use_dynamic_bsz "
    "log_prob_max_token_len_per_gpu disable_log_stats enable_chunked_prefill do_sample n over_sample_rate "
    "multi_stage_wake_up calculate_log_probs update_weights_bucket_megabytes skip_rollout skip_dump_dir",
    f"{RO}.engine_kwargs": "swap_space",
    f"{RO}.engine_kwargs.vllm": "swap_space",
    f"{RO}.engine_kwargs.sglang": "attention_backend",
    f"{RO}.val_kwargs": "top_k top_p temperature n do_sample",
    f"{RO}.multi_turn": "enable max_turns max_assistant_turns max_user_turns tool_config_path "
    "max_parallel_calls max_tool_response_length tool_response_truncate_side interaction_config_path "
    "use_inference_chat_template tokenization_sanity_check_mode format",
    f"{RO}.agent": "num_workers agent_loop_config_path",
    f"{RO}.agent.custom_async_server": "path name",
    f"{RO}.trace": "backend token2text",
    f"{RO}.profiler": _PROFILER,
    "critic": "rollout_n strategy enable ppo_mini_batch_size ppo_micro_batch_size "
    "ppo_micro_batch_size_per_gpu forward_micro_batch_size forward_micro_batch_size_per_gpu use_dynamic_bsz "
    "ppo_max_token_len_per_gpu "
    "forward_max_token_len_per_gpu ulysses_sequence_parallel_size ppo_epochs shuffle grad_clip "
    "cliprange_value loss_agg_mode",
    "critic.optim": "lr lr_warmup_steps lr_warmup_steps_ratio min_lr_ratio warmup_style total_training_steps "
    "weight_decay",
    "critic.model": "path tokenizer_path override_config external_lib trust_remote_code use_shm "
    "enable_gradient_checkpointing enable_activation_offload use_remove_padding lora_rank lora_alpha "
    "target_modules",
    "critic.model.fsdp_config": f"{_FSDP} grad_offload",
    "critic.model.fsdp_config.wrap_policy": "min_num_params",
    "critic.checkpoint": "contents save_contents load_contents async_save",
    "critic.profiler": _PROFILER,
    "reward_model": "enable strategy micro_batch_size micro_batch_size_per_gpu max_length "
    "ulysses_sequence_parallel_size use_dynamic_bsz forward_max_token_len_per_gpu reward_manager "
    "launch_reward_fn_async",
    "reward_model.model": "input_tokenizer path external_lib trust_remote_code use_shm use_remove_padding "
    "use_fused_kernels",
    "reward_model.model.fsdp_config": "param_offload reshard_after_forward fsdp_size forward_prefetch",
    "reward_model.sandbox_fusion": "url max_concurrent memory_limit_mb",
    "reward_model.profiler": _PROFILER,
    "custom_reward_function": "path name",
    "algorithm": "gamma lam adv_estimator norm_adv_by_std_in_grpo use_kl_in_reward kl_penalty use_pf_ppo",
    "algorithm.kl_ctrl": "type kl_coef horizon target_kl",
    "algorithm.pf_ppo": "reweight_method weight_pow",
    "trainer": "balance_batch total_epochs total_training_steps project_name experiment_name logger "
    "log_val_generations rollout_data_dir validation_data_dir nnodes n_gpus_per_node save_freq "
    "esi_redundant_time resume_mode resume_from_path val_before_train val_only test_freq critic_warmup "
    "default_hdfs_dir del_local_ckpt_after_load default_local_dir max_actor_ckpt_to_keep "
    "max_critic_ckpt_to_keep ray_wait_register_center_timeout device use_legacy_worker_impl",
    "global_profiler": "tool steps profile_continuous_steps save_path",
    "global_profiler.global_tool_config.torch_memory": "trace_alloc_max_entries stack_depth context stacks",
    "ray_init": "num_cpus",
    "ray_kwargs": "timeline_json_file",
    "ray_kwargs.ray_init": "num_cpus",
}


def test_every_verl_default_key_is_read_or_accepted():
    implemented = set(_schema_keys(RelmConfig, ""))
    verl = [f"{section}.{name}" for section, names in VERL_DEFAULT_KEYS.items() for name in names.split()]
    # A key under a dict-valued field (rollout.engine_kwargs.vllm.swap_space) is read through that field.
    read = [
        key for key in verl if key in implemented or any(key.startswith(f"{leaf}.") for leaf in implemented)
    ]
    assert [key for key in verl if key not in read and verl_keys.match_accepted(key) is None] == []
    assert all(verl_keys.match_accepted(key) for key in verl_keys.UNSUPPORTED_WHEN_ENABLED)


def test_docs_configuration_md_is_up_to_date():
    text = docs_gen.DOC_PATH.read_text()
    assert docs_gen.update_document(text) == text, "run `python -m relm.config.docs_gen`"
    assert "| `data.max_prompt_length` | `int` | `512` |" in text
    assert "| `ray_init.*` | relm runs without Ray" in text


def test_a_null_filter_metric_is_accepted_while_filtering_is_off():
    """verl 0.9's generated configs write `filter_groups.metric: null` beside `enable: false`."""
    validate_config(load_config(SIZES + ["algorithm.filter_groups.metric=null"]))


OPTIM = "actor_rollout_ref.actor.optim"


@pytest.mark.parametrize(
    ("floor", "ratio"),
    [(f"{OPTIM}.min_lr=2e-7", 0.2), (f"{OPTIM}.min_lr=1e-6", 1.0), (f"{OPTIM}.min_lr=0.0", 0.0),
     (f"+{OPTIM}.lr_min=5e-7", 0.5), ("critic.optim.min_lr=1e-7", None)],
)  # fmt: skip
def test_an_absolute_lr_floor_becomes_the_ratio_to_lr(floor: str, ratio: float | None):
    """Megatron's `optim.min_lr` (VeOmni's `lr_min`) is what the schedule decays to: `lr * min_lr_ratio`."""
    cfg = load_config(SIZES + [f"{OPTIM}.lr=1e-6", "critic.optim.lr=1e-6", floor])
    if ratio is None:
        assert cfg.critic.optim.min_lr_ratio == pytest.approx(0.1)
    else:
        assert cfg.actor_rollout_ref.actor.optim.min_lr_ratio == pytest.approx(ratio)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([f"{OPTIM}.min_lr=2e-6"], f"`{OPTIM}.min_lr=2e-06` must lie between 0 and `{OPTIM}.lr=1e-06`"),
        ([f"{OPTIM}.min_lr=1e-7", f"{OPTIM}.min_lr_ratio=0.5"], "give two floors"),
    ],
)
def test_an_absolute_lr_floor_above_lr_or_beside_another_floor_stops(overrides: list[str], message: str):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
        load_config(SIZES + [f"{OPTIM}.lr=1e-6", *overrides])


def test_verl_09s_reward_model_section_sets_the_model_and_its_lengths():
    """`reward.reward_model.model_path` is where verl 0.9 reads the reward model (its legacy key moves there)."""
    cfg = load_config(
        SIZES + ["reward.reward_model.enable=True", "reward.reward_model.model_path=org/rm",
                 "reward.reward_model.rollout.name=vllm", "reward.reward_model.rollout.prompt_length=300"]
    )  # fmt: skip
    rm = cfg.reward_model
    assert (rm.enable, rm.model.path, rm.rollout.prompt_length) == (True, "org/rm", 300)
    # `rollout.name` there is the server verl runs the model on; relm's judge engine is its own key
    assert rm.rollout.name == "native"


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "rloo_vectorized", "opo", "gdpo"])
def test_a_group_estimator_with_one_response_a_prompt_trains_as_in_verl_and_says_so(estimator):
    """verl's rollout_correction scripts run grpo and rloo at its default n=1: a group of one gets baseline 0."""
    from relm.config.translate import translate

    cfg = load_config([f"algorithm.adv_estimator={estimator}", f"{RO}.n=1"])
    (line,) = [w for w in translate(cfg)[1] if "compares responses" in w]
    assert line.startswith(f"`{RO}.n=1`: `{estimator}` compares responses to the same prompt")
    assert ("0 (verl's vectorised RLOO)" in line) == (estimator == "rloo_vectorized")
    assert not [
        w for w in translate(load_config([f"algorithm.adv_estimator={estimator}"]))[1] if "compares" in w
    ]


def test_a_key_added_to_data_with_plus_is_accepted_as_verl_does_and_named_once():
    cfg, warnings = load_config_with_warnings(
        ["+data.min_response_length=4096", "++data.filters.max_digits=3", "data.max_response_length=32"]
    )
    assert cfg.data.plus_keys == {"min_response_length": 4096, "filters": {"max_digits": 3}}
    assert cfg.data.max_response_length == 32
    lines = [line for line in warnings if "added with `+`" in line]
    assert lines == [
        "`data.min_response_length`, `data.filters.max_digits`: added with `+`, not used by relm's built-in "
        "dataset (only a `data.custom_cls` dataset class reads extra `data.*` keys, in its `config`, as in verl)"
    ]
    assert load_config(["data.max_response_length=32"]).data.plus_keys == {}


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("data.min_response_length=4096", "data.min_response_length"),  # no `+`: a typo, as in verl
        ("+actor_rollout_ref.actor.min_response_length=4", "actor_rollout_ref.actor.min_response_length"),
        ("+trainer.foo=1", "trainer.foo"),
    ],
)
def test_unknown_keys_without_plus_or_outside_data_still_stop(override: str, key: str):
    with pytest.raises(UserError, match=rf"^unknown key `{key}`; "):
        load_config([override])


def test_a_custom_dataset_class_gets_the_plus_keys_in_its_config_and_no_warning(tmp_path: Path):
    from relm.config.translate import translate

    cfg, warnings = load_config_with_warnings([
        f"data.custom_cls.path={tmp_path / 'mine.py'}", "data.custom_cls.name=Mine",
        "+data.min_response_length=4096", "+data.custom_cls.note=kept", "data.prompt_key=question",
    ])  # fmt: skip
    assert not [line for line in warnings if "added with `+`" in line]
    config = translate(cfg)[0].data.verl_config
    assert config is not None
    assert config["min_response_length"] == 4096 and config["prompt_key"] == "question"
    assert config["custom_cls"] == {"path": str(tmp_path / "mine.py"), "name": "Mine", "note": "kept"}
