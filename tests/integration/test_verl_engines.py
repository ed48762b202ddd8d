"""A Megatron command line as verl's scripts write it trains one step on relm's FSDP2 path with one line
naming the parallel layout relm does not use; an Ascend NPU command line stops with one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from relm.data.demo_task import write_demo_parquet

pytestmark = pytest.mark.integration

MEGATRON = "actor_rollout_ref.actor.megatron"
TINY = [
    "actor_rollout_ref.model.path=zoo:tiny/qwen2",
    "critic.model.path=zoo:tiny/qwen2",
    "algorithm.adv_estimator=gae",
    "data.train_batch_size=2",
    "data.max_prompt_length=32",
    "data.max_response_length=8",
    "actor_rollout_ref.rollout.n=1",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "critic.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
    "trainer.total_training_steps=1",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "trainer.save_freq=-1",
    "trainer.logger=[console]",
    "trainer.n_gpus_per_node=1",
]


def _main_ppo(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RELM_DEBUG": ""}
    return subprocess.run(
        [sys.executable, "-m", "relm.trainer.main_ppo", *argv],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


def test_a_megatron_command_line_trains_one_step_with_one_layout_line(tmp_path: Path):
    train, val = write_demo_parquet(tmp_path / "data", num_train=8, num_val=2)
    run_dir = tmp_path / "run"
    proc = _main_ppo(
        [
            "--config-path=config", "--config-name=ppo_megatron_trainer",  # verl's package folder: not here
            f"data.train_files={train}", f"data.val_files={val}", *TINY, f"trainer.default_local_dir={run_dir}",
            f"{MEGATRON}.tensor_model_parallel_size=2", f"{MEGATRON}.pipeline_model_parallel_size=2",
            f"{MEGATRON}.context_parallel_size=1", f"{MEGATRON}.param_offload=True",
            "critic.megatron.tensor_model_parallel_size=2", "actor_rollout_ref.actor.optim.optimizer=adam",
            "actor_rollout_ref.actor.strategy=megatron", "critic.strategy=megatron",
        ],
        tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in steps] == [1] and "actor/pg_loss" in steps[0]
    layout = [line for line in proc.stderr.splitlines() if "parallel-layout keys not used" in line]
    assert len(layout) == 1, proc.stderr[-3000:]
    for key in (
        f"{MEGATRON}.tensor_model_parallel_size=2",
        f"{MEGATRON}.pipeline_model_parallel_size=2",
        "critic.megatron.tensor_model_parallel_size=2",
    ):
        assert f"`{key}`" in layout[0]
    assert "context_parallel_size" not in layout[0]  # 1 splits nothing
    assert "tensor_model_parallel_size" not in proc.stderr.replace(layout[0], "")  # named once


def test_an_ascend_npu_command_line_stops_with_one_line(tmp_path: Path):
    train, _ = write_demo_parquet(tmp_path / "data", num_train=8, num_val=2)
    proc = _main_ppo(
        [f"data.train_files={train}", *TINY, "model_engine=mindspeed", "trainer.device=npu"], tmp_path
    )
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and errors == [
        "error: `trainer.device=npu`: Ascend NPUs are not supported; relm runs on CUDA GPUs or the CPU "
        "(trainer.device=auto)"
    ], proc.stderr[-2000:]


CUSTOM_CLASS = '''
from torch.utils.data import Dataset


class LetterLines(Dataset):
    """verl's interface: reads `question|answer` lines, which relm's own readers do not take."""

    def __init__(self, data_files, tokenizer, config, processor=None, max_samples=-1):
        self.prompt_key = config.get("prompt_key", "prompt")
        self.rows = []
        for path in data_files:
            for line in open(path).read().splitlines():
                question, answer = line.split("|")
                self.rows.append((question, answer))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        question, answer = self.rows[index]
        return {
            "raw_prompt": [{"role": "user", "content": question}],
            "data_source": "custom_letters",
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"index": index},
        }


class NoVerlArguments(Dataset):
    def __init__(self, path):
        self.path = path
'''

REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    assert data_source == "custom_letters"
    return float(ground_truth in solution_str)
"""


def test_data_custom_cls_reads_the_prompts_through_the_users_dataset_class(tmp_path: Path):
    (tmp_path / "letters.py").write_text(CUSTOM_CLASS)
    (tmp_path / "reward.py").write_text(REWARD)
    (tmp_path / "train.txt").write_text("".join(f"Say the letter {c}.|{c}\n" for c in "abcd"))
    run_dir = tmp_path / "run"
    base = [
        f"data.train_files={tmp_path / 'train.txt'}", *TINY, f"trainer.default_local_dir={run_dir}",
        f"custom_reward_function.path={tmp_path / 'reward.py'}", "data.custom_cls.path=letters.py",
    ]  # fmt: skip
    proc = _main_ppo([*base, "data.custom_cls.name=LetterLines", "data.max_prompt_length=64"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in steps] == [1] and "critic/score/mean" in steps[0]
    for name, message in (
        ("Missing", "`data.custom_cls.name=Missing`: letters.py defines no class of that name"),
        ("NoVerlArguments", "`data.custom_cls.name=NoVerlArguments`: its __init__ must take verl's"),
    ):
        proc = _main_ppo([*base, f"data.custom_cls.name={name}"], tmp_path)
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert proc.returncode == 2 and len(errors) == 1 and errors[0].startswith(f"error: {message}"), (
            proc.stderr[-2000:]
        )
    proc = _main_ppo(
        [*base[:-1], "data.custom_cls.path=nowhere.py", "data.custom_cls.name=LetterLines"], tmp_path
    )
    assert proc.returncode == 2 and "error: `data.custom_cls.path=nowhere.py`: no such file" in proc.stderr
