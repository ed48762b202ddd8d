"""Two torchrun "nodes" on one machine (127.0.0.1, gloo, one CPU process each): train, stop, resume.

Each node is a process tree of its own that meets the other only through torchrun's c10d rendezvous
on a TCP port, as two machines would: `relm train trainer.nnodes=2` with `MASTER_ADDR` set (relm's
launcher) or torchrun started by hand on each node (the Slurm way). Both write into one run folder,
standing for the shared file system relm assumes (docs/distributed.md).

Exactness: the metrics of a run stopped by Ctrl-C on one node and resumed by hand-started torchrun
equal, key for key, those of an uninterrupted 2-node run and of a 2-process run on one node (the same
ranks, rows and collectives; only the stores the processes meet through differ). Timings and memory
are left out: they are measurements, not results.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from relm.config.validate import CONFIG_OK_MESSAGE

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
STEPS = 4
ARGS = [
    "data.train_batch_size=4",
    "actor_rollout_ref.rollout.n=2",
    "data.max_response_length=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "trainer.device=cpu",
    "trainer.logger=[console,jsonl]",
    "trainer.save_freq=2",
    f"trainer.total_training_steps={STEPS}",
]
TWO_NODES = ["trainer.nnodes=2", "trainer.n_gpus_per_node=1"]
MEASURED = ("timing_s/", "perf/throughput", "perf/cpu_max_rss_gb", "perf/max_host_memory_gb")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def node_env(port: int | None = None) -> dict[str, str]:
    """The environment of a "node"; with `port`, the head node's address as torchrun names it."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    for name in ("RELM_DEBUG", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    if port is not None:
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    return env


def start(command: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def relm_train_nodes(run_dir: Path, *extra: str) -> list[subprocess.Popen[str]]:
    """`relm train trainer.nnodes=2` on each of two "nodes", meeting at MASTER_ADDR:MASTER_PORT."""
    env = node_env(free_port())
    command = [
        sys.executable,
        "-m",
        "relm.cli",
        "train",
        *TWO_NODES,
        *ARGS,
        f"trainer.default_local_dir={run_dir}",
    ]
    return [start([*command, *extra], env) for _ in range(2)]


def torchrun_nodes(run_dir: Path) -> list[subprocess.Popen[str]]:
    """torchrun started by hand on each node, as `srun torchrun ... -m relm.cli train ...` does."""
    port = free_port()
    env = node_env(port)
    return [
        start(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nproc_per_node=1",
                "--nnodes=2",
                f"--node_rank={rank}",
                "--rdzv_backend=c10d",
                f"--rdzv_endpoint=127.0.0.1:{port}",
                "--rdzv_id=relm-test",
                "-m",
                "relm.cli",
                "train",
                *TWO_NODES,
                *ARGS,
                f"trainer.default_local_dir={run_dir}",
            ],  # fmt: skip
            env,
        )
        for rank in range(2)
    ]


def finish(nodes: list[subprocess.Popen[str]]) -> list[tuple[str, str]]:
    outputs = [node.communicate(timeout=240) for node in nodes]
    for node, (_, stderr) in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, stderr[-3000:]
    return outputs


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(MEASURED)} for line in lines]


def test_two_nodes_on_localhost_train_stop_on_ctrl_c_and_resume_exactly(tmp_path: Path):
    # Uninterrupted, through relm's launcher on both nodes.
    whole = tmp_path / "whole"
    outputs = finish(relm_train_nodes(whole))
    stdout = "".join(out for out, _ in outputs)
    stderr = "".join(err for _, err in outputs)
    assert stdout.count(CONFIG_OK_MESSAGE) == 1  # global rank 0 only, on whichever node it landed
    assert stderr.count("one of 2 meeting at 127.0.0.1") == 2, stderr[-3000:]
    expected = metrics(whole)
    assert [m["step"] for m in expected] == list(range(1, STEPS + 1))  # only rank 0 writes
    shards = sorted(p.name for p in (whole / f"global_step_{STEPS}" / "actor" / "dcp").iterdir())
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"]  # one rank of each node

    # Stopped by Ctrl-C on the second node: the ranks agree to stop after the same step and save.
    stopped = tmp_path / "stopped"
    nodes = relm_train_nodes(stopped)
    deadline = time.monotonic() + 180
    while not (stopped / "metrics.jsonl").is_file() and time.monotonic() < deadline:
        time.sleep(0.1)
    nodes[1].send_signal(signal.SIGINT)
    finish(nodes)
    last = int((stopped / "latest_checkpointed_iteration.txt").read_text())
    assert 1 <= last < STEPS and [m["step"] for m in metrics(stopped)] == list(range(1, last + 1))

    # Resumed with torchrun started by hand on each node (the Slurm way).
    outputs = finish(torchrun_nodes(stopped))
    assert f"continuing at step {last + 1}" in "".join(err for _, err in outputs)
    assert metrics(stopped) == expected

    # The same ranks on one node (2 processes, file store) give the same numbers.
    single = tmp_path / "single"
    done = subprocess.run(
        [sys.executable, "-m", "relm.cli", "train", "trainer.n_gpus_per_node=2", *ARGS,
         f"trainer.default_local_dir={single}"],  # fmt: skip
        cwd=REPO, env=node_env(), capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert metrics(single) == expected


def test_a_node_started_with_another_process_count_than_the_config_is_named(tmp_path: Path):
    """torchrun's --nproc_per_node=2 on 1 node with `trainer.nnodes=2 trainer.n_gpus_per_node=1`:
    the world size (2) agrees, the processes per node do not."""
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "relm.cli",
         "train", *TWO_NODES, *ARGS, f"trainer.default_local_dir={tmp_path / 'run'}"],  # fmt: skip
        cwd=REPO, env=node_env(), capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode != 0
    line = "error: torchrun started 2 processes on this node but `trainer.n_gpus_per_node=1`"
    assert done.stderr.count(line) == 2, done.stderr[-3000:]  # one line from each rank
