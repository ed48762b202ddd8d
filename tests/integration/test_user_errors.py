"""Every user mistake ends the run with exit code 2 and ONE `error:` line naming the culprit, no traceback.

Each case builds its broken input (a config value, a parquet file, a model folder, a reward file) in
tmp_path and runs the real entry point; the mistakes are all found before or at the first step.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from transformers import BertConfig

from relm.models.zoo import materialize_zoo

pytestmark = pytest.mark.integration


@dataclass
class Ctx:
    """What a case needs to build its broken input."""

    tmp_path: Path
    write_parquet: Callable[..., Path]
    write_reward: Callable[..., Path]
    verl_rows: Callable[..., list[dict]]

    def data(self, path: Path) -> list[str]:
        """Train on `path`, prompts capped to fit the tiny model (user data turns the demo preset off)."""
        return [f"data.train_files={path}", "data.max_prompt_length=24"]

    def good_data(self) -> list[str]:
        """A valid user parquet (so the demo preset and its log line stay out of the way)."""
        return self.data(self.write_parquet())

    def reward(self, body: str) -> list[str]:
        return [*self.good_data(), f"custom_reward_function.path={self.write_reward(body)}"]

    def model_copy(self, drop: tuple[str, ...] = ()) -> Path:
        """A copy of the tiny zoo model folder without the files named in `drop`."""
        folder = self.tmp_path / "model"
        shutil.copytree(materialize_zoo("zoo:tiny/qwen2"), folder)
        for name in drop:
            (folder / name).unlink()
        return folder


def returning(expression: str) -> str:
    """Source of a verl-signature `compute_score` that returns `expression`."""
    signature = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):"
    return f"{signature}\n    return {expression}\n"


CaseInput = tuple[list[str], list[str]]
"""A case's broken input as overrides, and the substrings its error line must contain."""
Case = Callable[[Ctx], CaseInput]


def unknown_key(ctx: Ctx) -> CaseInput:
    return ["data.max_prompt_lenght=5"], ["data.max_prompt_lenght", "did you mean", "data.max_prompt_length"]


def wrong_type(ctx: Ctx) -> CaseInput:
    return ["data.train_batch_size=four"], ["data.train_batch_size", "integer", "four"]


def out_of_range(ctx: Ctx) -> CaseInput:
    return ["actor_rollout_ref.rollout.top_p=1.5"], ["actor_rollout_ref.rollout.top_p", "1.5"]


def batch_not_dividing(ctx: Ctx) -> CaseInput:
    return ["actor_rollout_ref.actor.ppo_mini_batch_size=3"], ["ppo_mini_batch_size=3", "train_batch_size=4"]


def unknown_estimator(ctx: Ctx) -> CaseInput:
    return ["algorithm.adv_estimator=ppo2"], ["algorithm.adv_estimator", "ppo2", "gae"]


def longer_than_positions(ctx: Ctx) -> CaseInput:
    # The tiny model has 256 positions.
    return ["data.max_prompt_length=200", "data.max_response_length=100"], ["max_position_embeddings", "256"]


def missing_data_file(ctx: Ctx) -> CaseInput:
    return ctx.data(ctx.tmp_path / "nope.parquet"), ["data.train_files", "nope.parquet"]


def not_parquet(ctx: Ctx) -> CaseInput:
    path = ctx.tmp_path / "prompts.parquet"
    path.write_text("question,answer\n1+1,2\n")
    return ctx.data(path), ["prompts.parquet", "not a readable parquet"]


def truncated_parquet(ctx: Ctx) -> CaseInput:
    path = ctx.write_parquet(name="cut.parquet")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return ctx.data(path), ["cut.parquet", "parquet"]


def missing_prompt_column(ctx: Ctx) -> CaseInput:
    rows = [{"data_source": "relm/letters", "question": "a"} for _ in range(8)]
    return ctx.data(ctx.write_parquet(rows)), ["'prompt'", "question", "data.prompt_key"]


def empty_prompt_list(ctx: Ctx) -> CaseInput:
    rows = ctx.verl_rows(8)
    rows[3]["prompt"] = []
    return ctx.data(ctx.write_parquet(rows)), ["row 3", "'prompt'", "non-empty list"]


def no_rows(ctx: Ctx) -> CaseInput:
    path = ctx.tmp_path / "empty.parquet"
    pq.write_table(pa.Table.from_pylist(ctx.verl_rows(1)).slice(0, 0), path)
    return ctx.data(path), ["empty.parquet", "no rows"]


def non_string_content(ctx: Ctx) -> CaseInput:
    rows = ctx.verl_rows(8, content=lambda index: index)  # ints, not text
    return ctx.data(ctx.write_parquet(rows)), ["row 0", "content", "int", "strings"]


def every_prompt_too_long(ctx: Ctx) -> CaseInput:
    # The ChatML wrapper alone is 19 tokens of the character tokenizer.
    return [*ctx.good_data(), "data.max_prompt_length=10"], ["data.max_prompt_length", "at least 20"]


def missing_model_folder(ctx: Ctx) -> CaseInput:
    return [f"actor_rollout_ref.model.path={ctx.tmp_path / 'no_model'}"], ["no_model", "does not exist"]


def folder_without_config(ctx: Ctx) -> CaseInput:
    folder = ctx.model_copy(drop=("config.json",))
    return [f"actor_rollout_ref.model.path={folder}"], [str(folder), "config.json"]


def encoder_only_model(ctx: Ctx) -> CaseInput:
    # A real BERT folder holds its tokenizer too; the character tokenizer stands in for it.
    folder = ctx.model_copy(drop=("config.json", "model.safetensors", "generation_config.json"))
    BertConfig(
        vocab_size=128, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
    ).save_pretrained(folder)
    return [*ctx.good_data(), f"actor_rollout_ref.model.path={folder}"], [str(folder), "encoder-only"]


def tokenizer_missing(ctx: Ctx) -> CaseInput:
    folder = ctx.model_copy(drop=("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"))
    return [f"actor_rollout_ref.model.path={folder}"], ["tokenizer", str(folder)]


def reward_file_missing(ctx: Ctx) -> CaseInput:
    overrides = [*ctx.good_data(), f"custom_reward_function.path={ctx.tmp_path / 'nowhere.py'}"]
    return overrides, ["custom_reward_function.path", "nowhere.py"]


def reward_function_missing(ctx: Ctx) -> CaseInput:
    overrides = ctx.reward(returning("1.0").replace("def compute_score", "def score"))
    return overrides, ["custom_reward_function.name", "reward.py", "'compute_score'", "functions: score"]


def reward_function_raises(ctx: Ctx) -> CaseInput:
    body = """
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            if ground_truth == "o":
                raise ValueError("cannot score o")
            return 1.0
    """
    # Unshuffled, the first batch is rows 0-3, lettered a, e, o, s: row 2 breaks the function, and the
    # error names it by its ground truth and extra_info.index.
    culprits = ["compute_score", "ValueError: cannot score o", "relm/letters", "'o' and extra_info index 2"]
    # Two failed responses of eight pass the default share (0.25); a lower one ends the run.
    return [*ctx.reward(body), "data.shuffle=false", "reward_model.max_failure_share=0.1"], culprits


def reward_returns_none(ctx: Ctx) -> CaseInput:
    return ctx.reward(returning("None")), ["compute_score", "returned NoneType", "finite"]


def reward_returns_nan(ctx: Ctx) -> CaseInput:
    return ctx.reward(returning("float('nan')")), ["compute_score", "nan", "finite"]


def reward_returns_string(ctx: Ctx) -> CaseInput:
    return ctx.reward(returning("'good'")), ["compute_score", "returned str 'good'"]


def unknown_data_source(ctx: Ctx) -> CaseInput:
    rows = ctx.verl_rows(8, data_source="my/secret_task")
    return ctx.data(ctx.write_parquet(rows)), ["my/secret_task", "custom_reward_function.path"]


def unknown_logger(ctx: Ctx) -> CaseInput:
    return ["trainer.logger=[console,printer]"], ["trainer.logger", "printer", "jsonl"]


def bad_yaml(ctx: Ctx) -> CaseInput:
    path = ctx.tmp_path / "run.yaml"
    path.write_text("data:\n  train_batch_size: 4\n   max_prompt_length: [24\n")
    return ["--config", str(path)], ["run.yaml", "YAML"]


# --- more configuration mistakes -----------------------------------------------------------------


def zero_batch(ctx: Ctx) -> CaseInput:
    return ["data.train_batch_size=0"], ["data.train_batch_size", "0"]


def negative_lr(ctx: Ctx) -> CaseInput:
    return ["actor_rollout_ref.actor.optim.lr=-1e-6"], ["actor_rollout_ref.actor.optim.lr"]


def negative_temperature(ctx: Ctx) -> CaseInput:
    return ["actor_rollout_ref.rollout.temperature=-0.5"], ["actor_rollout_ref.rollout.temperature"]


def unknown_loss_mode(ctx: Ctx) -> CaseInput:
    key = "actor_rollout_ref.actor.policy_loss.loss_mode"
    return [f"{key}=ppo2"], [key, "ppo2", "vanilla"]


def unknown_agg_mode(ctx: Ctx) -> CaseInput:
    key = "actor_rollout_ref.actor.loss_agg_mode"
    return [f"{key}=mean"], [key, "token-mean"]


def unknown_kl_estimator(ctx: Ctx) -> CaseInput:
    key = "actor_rollout_ref.actor.kl_loss_type"
    return [f"{key}=k9"], [key, "low_var_kl"]


def unknown_engine(ctx: Ctx) -> CaseInput:
    key = "actor_rollout_ref.rollout.name"
    return [f"{key}=tgi"], [key, "tgi", "native"]


def override_without_value(ctx: Ctx) -> CaseInput:
    return ["data.train_batch_size"], ["data.train_batch_size", "="]


def config_file_missing(ctx: Ctx) -> CaseInput:
    return ["--config", str(ctx.tmp_path / "nowhere.yaml")], ["nowhere.yaml"]


def reward_model_enabled(ctx: Ctx) -> CaseInput:
    return ["reward_model.enable=true"], ["reward_model.enable"]


def mini_batch_larger_than_batch(ctx: Ctx) -> CaseInput:
    key = "actor_rollout_ref.actor.ppo_mini_batch_size"
    return ["data.train_batch_size=4", f"{key}=8"], [key, "data.train_batch_size"]


def grpo_without_groups(ctx: Ctx) -> CaseInput:
    return ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=1"], ["rollout.n"]


# --- more data, reward and checkpoint mistakes ---------------------------------------------------


def prompt_is_a_number(ctx: Ctx) -> CaseInput:
    # A string is a prompt (TRL's standard format); a number is neither text nor messages.
    rows = ctx.verl_rows(8)
    for row in rows:
        row["prompt"] = 5
    return ctx.data(ctx.write_parquet(rows)), ["row 0", "'prompt'"]


def reward_file_does_not_import(ctx: Ctx) -> CaseInput:
    overrides = ctx.reward("def compute_score(data_source, solution_str\n")
    return overrides, ["reward.py", "SyntaxError"]


def resume_path_missing(ctx: Ctx) -> CaseInput:
    missing = ctx.tmp_path / "global_step_9"
    return (
        ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={missing}"],
        ["trainer.resume_from_path", "global_step_9"],
    )


def checkpoint_of_another_model(ctx: Ctx) -> CaseInput:
    """A checkpoint saved by a llama-shaped run, resumed by a qwen2-shaped one."""
    from relm.trainer.main_ppo import main

    run_dir = ctx.tmp_path / "other"
    other = [
        "actor_rollout_ref.model.path=zoo:tiny/llama", "data.train_batch_size=4", "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "data.max_response_length=4", "trainer.total_training_steps=1",
        "trainer.save_freq=1", "trainer.logger=[]", "trainer.val_before_train=false", f"trainer.default_local_dir={run_dir}",
    ]  # fmt: skip
    assert main(other) == 0
    step = run_dir / "global_step_1"
    return ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={step}"], [
        "global_step_1",
        "another model",
    ]


CASES: list[Case] = [
    unknown_key,
    wrong_type,
    out_of_range,
    batch_not_dividing,
    unknown_estimator,
    longer_than_positions,
    missing_data_file,
    not_parquet,
    truncated_parquet,
    missing_prompt_column,
    empty_prompt_list,
    no_rows,
    non_string_content,
    every_prompt_too_long,
    missing_model_folder,
    folder_without_config,
    encoder_only_model,
    tokenizer_missing,
    reward_file_missing,
    reward_function_missing,
    reward_function_raises,
    reward_returns_none,
    reward_returns_nan,
    reward_returns_string,
    unknown_data_source,
    unknown_logger,
    bad_yaml,
    zero_batch,
    negative_lr,
    negative_temperature,
    unknown_loss_mode,
    unknown_agg_mode,
    unknown_kl_estimator,
    unknown_engine,
    override_without_value,
    config_file_missing,
    reward_model_enabled,
    mini_batch_larger_than_batch,
    grpo_without_groups,
    prompt_is_a_number,
    reward_file_does_not_import,
    resume_path_missing,
    checkpoint_of_another_model,
]


@pytest.fixture
def ctx(tmp_path: Path, write_parquet, write_reward, verl_rows) -> Ctx:
    return Ctx(tmp_path, write_parquet, write_reward, verl_rows)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.__name__)
def test_user_mistake_gives_one_error_line_and_exit_2(train, ctx: Ctx, case: Case) -> None:
    overrides, culprits = case(ctx)

    result = train(*overrides)

    assert result.exit_code == 2, f"exit {result.exit_code}; stderr:\n{result.stderr}"
    # The report is ONE line, the last; before it stderr may hold the run's INFO progress lines (models
    # loaded, ...) and nothing else: no warning that buries the error, no traceback.
    *before, line = result.stderr_lines
    assert line.startswith("error: "), result.stderr
    noise = [other for other in before if not other.startswith("relm INFO: ")]
    assert not noise, f"stderr holds more than the error line and progress:\n{result.stderr}"
    assert "Traceback" not in result.stderr + result.stdout
    for culprit in culprits:
        assert culprit in line, f"{culprit!r} not named in: {line}"


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("when", ["config", "first_step"])
def test_failed_run_keeps_what_the_run_folder_held(train, ctx: Ctx, when: str) -> None:
    run_dir = ctx.tmp_path / "existing_run"
    (run_dir / "notes").mkdir(parents=True)
    (run_dir / "notes" / "plan.txt").write_text("do not lose me\n")
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "critic/score/mean": 0.5}\n')
    before = _snapshot(run_dir)
    if when == "config":
        overrides = ["algorithm.adv_estimator=ppo2"]
    else:
        overrides, _ = reward_function_raises(ctx)

    result = train(*overrides, run_dir=run_dir)

    assert result.exit_code == 2, result.stderr
    after = _snapshot(run_dir)
    if when == "config":
        assert after == before
    else:
        # A run that started may set the earlier metrics.jsonl aside under another name, never drop it.
        assert after["notes/plan.txt"] == before["notes/plan.txt"]
        assert before["metrics.jsonl"] in after.values()


def test_module_entry_point_exit_code_and_debug_traceback(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "relm.trainer.main_ppo", "data.max_prompt_lenght=5"]
    command += [f"trainer.default_local_dir={tmp_path / 'run'}"]
    env = {k: v for k, v in os.environ.items() if k != "RELM_DEBUG"}

    plain = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    debug = subprocess.run(
        command, capture_output=True, text=True, timeout=120, env={**env, "RELM_DEBUG": "1"}
    )

    assert plain.returncode == 2
    assert plain.stderr.strip().splitlines() == [plain.stderr.strip()]
    assert plain.stderr.startswith("error: ") and "data.max_prompt_length" in plain.stderr
    assert debug.returncode != 0
    assert "Traceback (most recent call last)" in debug.stderr
    assert "UserError" in debug.stderr and "data.max_prompt_length" in debug.stderr


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="the mistake needs a machine without a GPU"
)
def test_cuda_asked_without_a_gpu_is_named_before_loading(train) -> None:
    result = train("trainer.device=cuda")
    assert result.exit_code == 2
    assert result.stderr_lines == ["error: `trainer.device=cuda`: no CUDA device is visible; use cpu or auto"]
    assert "All configuration checks passed" not in result.stdout
