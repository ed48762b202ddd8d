"""Data parallel on CPU (gloo, 2 processes under torchrun) against the unchanged single-process path.

Both layouts: sharded (a CPU run's default) and replicated (`fsdp_size=1`). Tolerances (fp32, the tiny
zoo model, greedy-free sampling with the same seeds in every process): the gradients of every
parameter at every optimizer step agree to 1e-5 relative (L2 over all parameters) and 1e-6 absolute,
losses to 1e-6, old/ref logprobs, values and advantages of the batch exactly (they are computed on the
same rows by the same code, then gathered), weights and AdamW moments after the step to 1e-5 (AdamW's
first steps are about lr x sign(gradient), lr = 1e-3 here). Only the order of floating-point sums
differs: measured gaps, the same in both layouts, are at most 1.3e-6 relative / 3.9e-7 absolute
(gradients), 6e-8 (losses) and 7.0e-6 (weights: AdamW's first step on a gradient below its eps,
4.4e-9 against 4.3e-9, see docs/distributed.md). Checkpoints cross world sizes exactly (0 difference)
in both directions, and from the sharded layout into the replicated one.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from relm.config.validate import CONFIG_OK_MESSAGE
from relm.trainer.export import export_checkpoint
from tests import dist_parity

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]


def run_subprocess(command: list[str], timeout: int = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("RELM_DEBUG", None)
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


REPLICATED = [
    f"--set={key}=1"
    for key in (
        "actor_rollout_ref.actor.fsdp_config.fsdp_size",
        "actor_rollout_ref.ref.fsdp_config.fsdp_size",
        "critic.model.fsdp_config.fsdp_size",
    )
]
"""The replicated layout (every rank holds each model whole); without it a CPU run shards."""


def check_parity(report: dict[str, dict[str, float]]) -> None:
    assert set(report) == {"ppo", "grpo"}
    for algo, row in report.items():
        assert row["response_tokens_equal"] == 1.0
        for key, value in row.items():
            if key.startswith("batch "):
                assert value == 0.0, (algo, key)
            elif key.endswith(("/pg_loss", "/vf_loss", "/kl_loss", "/entropy", "/grad_norm")):
                assert value <= 1e-6, (algo, key, value)
            elif " grad step " in key:
                assert value <= (1e-5 if key.endswith("rel_l2") else 1e-6), (algo, key, value)
            elif "checkpoint" in key:
                assert value == (1.0 if key.endswith("step_equal") else 0.0), (algo, key, value)
            elif key.endswith(("_max_abs", "_rel_l2")):
                assert value <= 1e-5, (algo, key, value)
            elif key.endswith("step_equal"):
                assert value == 1.0, (algo, key)
        steps = [k for k in row if k.startswith("actor grad step") and k.endswith("rel_l2")]
        assert len(steps) == 4  # 2 mini-batches x 2 epochs (the demo preset's ppo_epochs)
        assert sum(k.startswith("actor checkpoint") for k in row) == 14  # both directions loaded
    assert "critic grad step 3 rel_l2" in report["ppo"] and "critic weights_max_abs" not in report["grpo"]


def test_two_gloo_processes_match_one_process_for_a_ppo_and_a_grpo_step(tmp_path: Path):
    one, two, replicated = tmp_path / "one", tmp_path / "two", tmp_path / "replicated"
    assert dist_parity.main(["run", str(one)]) == 0
    # Sharded (a CPU run's default) and replicated, each loading the one-process checkpoint, and the
    # one process loading theirs: checkpoints cross world sizes both ways in both layouts.
    for out, layout in ((two, []), (replicated, REPLICATED)):
        command = [*TORCHRUN, "tests/dist_parity.py", "run", str(out), "--load-from", str(one), *layout]
        done = run_subprocess(command)
        assert done.returncode == 0, done.stderr[-3000:]
        expected_line = "each holds the whole actor" if layout else "the actor and reference sharded over 2"
        assert expected_line in done.stderr, done.stderr[-3000:]
        assert dist_parity.main(["load", str(one), str(out)]) == 0
        report = dist_parity.compare(one, out)
        print(out.name, json.dumps(report, indent=1))  # the figures, for `pytest -s`
        check_parity(report)
    # A replicated run resumes the sharded run's checkpoint (2 ranks -> 2 ranks, another layout).
    crossed = tmp_path / "crossed"
    done = run_subprocess([*TORCHRUN, "tests/dist_parity.py", "load", str(crossed), str(two), *REPLICATED])
    assert done.returncode == 0, done.stderr[-3000:]
    for algo in ("ppo", "grpo"):
        saved = torch.load(two / f"{algo}.pt", weights_only=False)
        loaded = torch.load(crossed / f"{algo}-loaded.pt", weights_only=False)
        for model in ("actor", "critic") if algo == "ppo" else ("actor",):
            differences = dist_parity.compare_states(saved[model], loaded[model])
            assert differences.pop("step_equal") == 1.0 and set(differences.values()) == {0.0}, differences

    # The 2-process (sharded) checkpoint exports to a plain HF folder holding the step's weights exactly.
    folders = export_checkpoint(two / "ppo-run" / "global_step_1", tmp_path / "hf", critic=True)
    exported = AutoModelForCausalLM.from_pretrained(folders[0]).state_dict()
    trained = torch.load(two / "ppo.pt", weights_only=False)["actor"]["weights"]
    assert trained.keys() <= exported.keys()
    for name, weight in trained.items():
        assert exported[name].equal(weight), name
    assert (folders[1] / "value_head.safetensors").is_file() and (folders[1] / "tokenizer.json").is_file()


TINY = [
    "data.train_batch_size=4",
    "actor_rollout_ref.rollout.n=2",
    "data.max_response_length=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "trainer.device=cpu",
]


def steps(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_relm_train_under_torchrun_stops_on_ctrl_c_saves_shards_and_one_process_resumes(
    tmp_path: Path, train
):
    run_dir = tmp_path / "run"
    args = [*TINY, f"trainer.default_local_dir={run_dir}", "trainer.logger=[console,jsonl]"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "relm.cli", "train", "trainer.n_gpus_per_node=2", *args,
               "trainer.total_training_steps=40"]  # fmt: skip
    process = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 180
    while not ((run_dir / "metrics.jsonl").is_file() and steps(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    listening = listening_addresses(process.pid)
    process.send_signal(signal.SIGINT)  # as a Ctrl-C in the terminal reaches `relm train`
    stdout, stderr = process.communicate(timeout=180)
    assert process.returncode == 0, stderr[-3000:]
    # Nothing of the run listens beyond this machine (torchrun's TCP store listened on every interface).
    assert listening and {host for host, _ in listening} <= {"127.0.0.1", "::1"}, listening
    assert stdout.count(CONFIG_OK_MESSAGE) == 1  # rank 0 only
    assert "relm[rank 1]" not in stderr  # other ranks log errors only
    assert "starting 2 processes" in stderr and "stopped by SIGINT" in stderr
    logged = steps(run_dir)
    last = logged[-1]
    assert logged == list(range(1, last + 1)) and last < 40  # one line per step: only rank 0 writes
    assert (run_dir / "latest_checkpointed_iteration.txt").read_text() == str(last)
    shards = sorted(p.name for p in (run_dir / f"global_step_{last}" / "actor" / "dcp").iterdir())
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert (run_dir / f"global_step_{last}" / "critic" / "dcp" / ".metadata").is_file()

    resumed = train(*args, f"trainer.total_training_steps={last + 1}", run_dir=run_dir, tiny=False)
    assert resumed.exit_code == 0, resumed.stderr
    assert f"continuing at step {last + 1}" in resumed.stderr and steps(run_dir) == list(range(1, last + 2))


def listening_addresses(root: int) -> set[tuple[str, int]]:
    """The TCP addresses that `root` and its descendants listen on."""
    import psutil

    processes = [psutil.Process(root)]
    processes += processes[0].children(recursive=True)
    found = set()
    for proc in processes:
        with contextlib.suppress(psutil.Error):
            for conn in proc.net_connections(kind="tcp"):
                if conn.status == psutil.CONN_LISTEN:
                    found.add((conn.laddr.ip, conn.laddr.port))
    return found


def test_several_nodes_print_the_torchrun_command_for_each(train):
    result = train(
        "trainer.nnodes=2",
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
    )
    assert result.exit_code == 2
    assert result.stderr_lines[-1].startswith(
        "error: `trainer.nnodes=2`: relm starts processes on this machine"
    )
    command = next(line for line in result.stdout.splitlines() if "torch.distributed.run" in line)
    for part in ("--nproc_per_node=2", "--nnodes=2", "--rdzv_backend=c10d", "-m relm.trainer.main_ppo"):
        assert part in command
