"""`relm train` with more than one process: start torchrun on this node (one node, or one of several).

relm has no process launcher of its own: every data-parallel run is torchrun's (`python -m
torch.distributed.run`), one process per GPU, and `relm.distributed.context` picks the process group
up from the variables torchrun sets. This module only saves typing:

- one node (`trainer.nnodes=1`): `relm train trainer.n_gpus_per_node=N ...` re-runs itself under
  `torchrun --nproc_per_node N` and waits. Its processes meet through files in a private temporary
  folder, not a TCP port: torchrun's rendezvous is c10d's on a file store, the agent's shared TCP
  store is off (`TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`) and the workers' process group takes a
  `FileStore` (`STORE_FILE_ENV`). A TCPStore listens on every interface whatever address it is given
  (measured with `ss -ltnp`: `--standalone`, `--rdzv_endpoint=127.0.0.1:PORT` and
  `--master_addr=127.0.0.1` all listen on `*:PORT`), and it takes no password, so anyone who reached
  the port could join or stall the run. gloo's own sockets are kept on the loopback device
  (`GLOO_SOCKET_IFNAME=lo` unless set). It waits. SIGINT/SIGTERM go straight to the workers, as
  in a single-process run: each finishes its step, the ranks agree to stop after the same one, save,
  and exit 0, so torchrun ends cleanly too. (torchrun itself, signalled, would pass the signal on but
  then report the run as failed and kill workers still saving after 30 s.)
- several nodes: relm cannot start processes on other machines; `relm train` runs on every node. With
  `MASTER_ADDR` set (torchrun's own name for the head node; `MASTER_PORT`, default `RENDEZVOUS_PORT`)
  it re-runs itself under `torchrun --nnodes N --nproc_per_node G` with the c10d rendezvous at
  MASTER_ADDR:MASTER_PORT and waits, forwarding signals as on one node; the ranks stop together
  because the stop flag is all-reduced. The rendezvous hands out node ranks as nodes arrive (torchrun
  ignores `--node_rank` with c10d), so global rank 0, the one writer of shared files, may be on any
  node. Without `MASTER_ADDR` it prints the one torchrun command (rendezvous at this machine) to run
  on every node and exits with code 2. The rendezvous and process-group ports listen on every
  interface, unauthenticated (docs/distributed.md), and gloo follows `GLOO_SOCKET_IFNAME` as the user
  sets it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from types import FrameType

import torch

from relm.config.specs import RunSpec
from relm.distributed.context import STORE_FILE_ENV
from relm.errors import UserError
from relm.processes import list_processes

logger = logging.getLogger("relm")

RENDEZVOUS_PORT = 29400
"""torchrun's own default port for the c10d rendezvous."""
EXTRA_ARGS_ENV = "RELM_TORCHRUN_ARGS"
"""More torchrun options for `relm train` to pass, e.g. "--log-dir logs --redirects 3 --tee 3"."""


def world_size_of(spec: RunSpec) -> int:
    """Processes of the run: `trainer.n_gpus_per_node * trainer.nnodes`."""
    return spec.loop.n_gpus_per_node * spec.loop.nnodes


def offloads(spec: RunSpec) -> bool:
    """FSDP2's CPU offload asked for the actor (and reference) or the critic."""
    return bool(spec.actor.sharding.offload_policy or spec.critic.sharding.offload_policy)


def needs_torchrun(spec: RunSpec, device: torch.device) -> bool:
    """More than one process, or FSDP2's CPU offload (which needs a process group even on one GPU).

    Raises:
        UserError: offload asked for a run that computes on the CPU already.
    """
    if offloads(spec) and device.type != "cuda":
        raise UserError(
            "`fsdp_config.offload_policy=true` moves a GPU run's shards to the CPU; this run computes on "
            f"{device.type}: set it to false"
        )
    return world_size_of(spec) > 1 or offloads(spec)


def torchrun_command(
    argv: list[str],
    *,
    nproc_per_node: int,
    nnodes: int = 1,
    rendezvous: str | None = None,
    run_id: str = "",
    store_dir: Path | None = None,
) -> list[str]:
    """The torchrun command line that runs `relm train argv` in `nproc_per_node` processes per node.

    One node meets through a file in `store_dir` (no port: see the module docstring); several use the
    c10d rendezvous at `rendezvous` (host:port), the same command on every node. Options in
    `RELM_TORCHRUN_ARGS` come last, before the program.
    """
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc_per_node}"]
    if nnodes == 1:
        if store_dir is None:
            raise ValueError("a one-node run needs store_dir")
        command += [
            "--nnodes=1",
            "--rdzv_backend=c10d",
            "--rdzv_conf=store_type=file",
            f"--rdzv_endpoint={store_dir / 'rendezvous'}",
            "--rdzv_id=relm",
        ]
    else:
        command += [
            f"--nnodes={nnodes}",
            "--rdzv_backend=c10d",
            f"--rdzv_endpoint={rendezvous}",
            f"--rdzv_id={run_id or 'relm'}",
        ]
    command += shlex.split(os.environ.get(EXTRA_ARGS_ENV, ""))
    return [*command, "-m", "relm.trainer.main_ppo", *argv]


def launch(spec: RunSpec, argv: list[str], device: torch.device) -> int:
    """Run `relm train argv` under torchrun on this node and return its exit code (see module docstring).

    Raises:
        UserError: more GPUs per node than this machine shows, or several nodes without `MASTER_ADDR`
            (the command to run on each is printed first).
    """
    trainer = spec.loop
    visible = torch.cuda.device_count() if device.type == "cuda" else None
    if visible is not None and trainer.n_gpus_per_node > visible:
        raise UserError(
            f"`trainer.n_gpus_per_node={trainer.n_gpus_per_node}` but this machine shows {visible} GPU(s); "
            f"set it to {visible} or fewer (or trainer.device=cpu for CPU processes)"
        )
    if trainer.nnodes > 1:
        head = os.environ.get("MASTER_ADDR")
        command = torchrun_command(
            argv,
            nproc_per_node=trainer.n_gpus_per_node,
            nnodes=trainer.nnodes,
            rendezvous=f"{head or socket.gethostname()}:{rendezvous_port()}",
            run_id=trainer.experiment_name,
        )
        if head:
            logger.info(
                "starting %d processes on this node, one of %d meeting at %s:%d: %s",
                trainer.n_gpus_per_node,
                trainer.nnodes,
                head,
                rendezvous_port(),
                shlex.join(command),
            )
            return _run(command, dict(os.environ))
        print(
            f"relm: a {trainer.nnodes}-node run is started by torchrun on every node; run this same command "
            f"on each of the {trainer.nnodes} nodes (this machine included), from the same folder:\n\n"
            f"  {shlex.join(command)}\n\n"
            "or run this `relm train` on every node with MASTER_ADDR set to one node's address "
            f"(MASTER_PORT: its free port, default {RENDEZVOUS_PORT})\n",
            flush=True,
        )
        raise UserError(
            f"`trainer.nnodes={trainer.nnodes}`: relm starts processes on this machine only; run the "
            "torchrun command printed above on every node, or set MASTER_ADDR on each"
        )
    with tempfile.TemporaryDirectory(prefix="relm-rendezvous-") as store_dir:  # mode 0700: ours alone
        command = torchrun_command(argv, nproc_per_node=trainer.n_gpus_per_node, store_dir=Path(store_dir))
        logger.info("starting %d processes: %s", trainer.n_gpus_per_node, shlex.join(command))
        return _run(command, local_env(Path(store_dir)))


def rendezvous_port() -> int:
    """`MASTER_PORT` as the user set it for a several-node run, else torchrun's default c10d port.

    Raises:
        UserError: it is not a port number.
    """
    value = os.environ.get("MASTER_PORT", str(RENDEZVOUS_PORT))
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise UserError(
            f"MASTER_PORT={value!r} is not a TCP port; set it to a free port such as {RENDEZVOUS_PORT}"
        )
    return int(value)


def local_env(store_dir: Path) -> dict[str, str]:
    """The environment of a one-node torchrun: no TCP store, gloo on the loopback device."""
    return {
        "GLOO_SOCKET_IFNAME": "lo",
        **os.environ,
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        STORE_FILE_ENV: str(store_dir / "store"),
    }


def _run(command: list[str], env: dict[str, str]) -> int:
    """Run torchrun and wait, passing SIGINT/SIGTERM on to its workers."""
    # Its own session, so a Ctrl-C in the terminal reaches only us; we pass it on to the workers.
    process = subprocess.Popen(command, start_new_session=True, env=env)

    def forward(signum: int, frame: FrameType | None) -> None:
        workers = child_pids(process.pid)
        for pid in workers or [process.pid]:  # no worker yet: torchrun tears the start-up down
            with contextlib.suppress(ProcessLookupError):  # it ended in between
                os.kill(pid, signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return process.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def child_pids(parent: int) -> list[int]:
    """The processes whose parent is `parent` (torchrun's workers), from /proc; empty where it is absent."""
    return [process.pid for process in list_processes() if process.ppid == parent]
