"""`DistContext`: who this process is in a data-parallel run, and the few collectives the trainer uses.

One context is built per process (`init_distributed`) and handed to whatever needs it; there is no
module-level process group. Its collectives take and return plain Python values or CPU tensors, so
callers stay free of backend details (NCCL wants CUDA tensors, gloo CPU ones). In a single-process run
the context is `DistContext()`: every collective returns its input unchanged and nothing is imported
from `torch.distributed`'s process-group machinery.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from relm.errors import UserError

logger = logging.getLogger("relm")

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
"""Variables torchrun sets in every worker; their presence is how relm knows it runs under torchrun."""


STORE_FILE_ENV = "RELM_STORE_FILE"
"""Set by `relm train`'s one-node launcher: the file the processes meet through (a FileStore), instead
of the TCP store at MASTER_ADDR:MASTER_PORT that listens on every interface."""


def in_torchrun() -> bool:
    """True inside a process started by torchrun (or any launcher that sets its variables)."""
    return all(name in os.environ for name in TORCHRUN_ENV)


@dataclass
class DistContext:
    """This process's place in the run. The default is the single-process context."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    """Where this rank computes: `cuda:LOCAL_RANK` on GPUs, `cpu` with gloo."""
    mesh: Any = None
    """The 1-D `DeviceMesh` ("dp") of all ranks: the trainer's collectives, and the mesh of a model
    sharded over all ranks; None in a single-process run."""
    _model_meshes: dict[int, Any] = field(default_factory=dict, repr=False)
    host_budget_bytes: int | None = None
    """Host memory this process may hold (`trainer.max_host_memory_gb`), None: unbounded. On CPU it is
    what decides whether a sharded model's weights stay gathered (`relm.distributed.gathering`)."""

    @property
    def is_distributed(self) -> bool:
        """Running under torchrun with a process group (possibly of one process)."""
        return self.mesh is not None

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that writes logs, metrics and checkpoint metadata."""
        return self.rank == 0

    def model_mesh(self, shard_size: int) -> Any:
        """The mesh a model sharded over `shard_size` ranks is laid on (`relm.distributed.layout`).

        All ranks: the 1-D mesh. Fewer: a 2-D ("replicate", "shard") mesh of world / shard_size copies
        of `shard_size` consecutive ranks each (so a copy stays within a node where it can), built
        once per size. Building one creates process groups, a collective: every rank asks for the same
        sizes in the same order.
        """
        if shard_size == self.world_size:
            return self.mesh
        if shard_size not in self._model_meshes:
            from torch.distributed.device_mesh import init_device_mesh

            self._model_meshes[shard_size] = init_device_mesh(
                self.device.type,
                (self.world_size // shard_size, shard_size),
                mesh_dim_names=("replicate", "shard"),
            )
        return self._model_meshes[shard_size]

    def group_mesh(self, group_size: int) -> Any:
        """The 1-D mesh of this rank's group of `group_size` consecutive ranks (a tensor-parallel
        generation group: ranks `r // group_size` together), the "shard" dim of `model_mesh`."""
        mesh = self.model_mesh(group_size)
        return mesh if mesh.ndim == 1 else mesh["shard"]

    def sum_floats(self, values: list[float]) -> list[float]:
        """Element-wise sum over ranks (float64, so counts of tokens stay exact)."""
        return self._all_reduce(values, "sum")

    def max_floats(self, values: list[float]) -> list[float]:
        """Element-wise maximum over ranks."""
        return self._all_reduce(values, "max")

    def any_true(self, flag: bool) -> bool:
        """True on every rank if it is true on any: decisions that must not split the ranks (stop now)."""
        if not self.is_distributed:
            return flag
        return self._all_reduce([float(flag)], "max")[0] > 0

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's `obj` (picklable; tensors on CPU), in rank order, on every rank."""
        if not self.is_distributed:
            return [obj]
        import torch.distributed as dist

        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, obj, group=self.mesh.get_group())
        return gathered

    def barrier(self) -> None:
        """Wait for every rank (around files only rank 0 writes)."""
        if self.is_distributed:
            import torch.distributed as dist

            dist.barrier(group=self.mesh.get_group())

    def _all_reduce(self, values: list[float], op: str) -> list[float]:
        if not self.is_distributed:
            return list(values)
        import torch.distributed as dist

        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        reduce_op = dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX
        dist.all_reduce(tensor, op=reduce_op, group=self.mesh.get_group())
        return tensor.cpu().tolist()

    def close(self, *, finished: bool = True) -> None:
        """Tear the process group down at the end of a run; the run's models must be dropped by then.

        Sharded models hold collective handles of the process group; freed after it (at interpreter
        exit) they abort the process now and then ("terminate called without an active exception",
        seen with gloo in 1 of 3 runs), so the garbage they form (FSDP's hooks make cycles) is
        collected first. After a run that `finished`, every rank then waits for the others; after a
        failure there is no waiting (the other ranks may be gone).
        """
        if self.is_distributed:
            import gc

            import torch.distributed as dist

            if dist.is_initialized():
                gc.collect()
                if finished:
                    dist.barrier(group=self.mesh.get_group())
                dist.destroy_process_group()


def init_distributed(
    device: torch.device, *, expected_world_size: int, per_node: int | None = None
) -> DistContext:
    """The context of this process: single-process outside torchrun, else a process group and mesh.

    Under torchrun the world size must equal `trainer.n_gpus_per_node * trainer.nnodes`, so that the
    batch sizes validated against that product are the ones that run, and the processes on this node
    (torchrun's `LOCAL_WORLD_SIZE`) `trainer.n_gpus_per_node`: with several nodes started by hand
    (Slurm), a node given another `--nproc_per_node` would otherwise pass the product unnoticed. On CUDA each rank takes the GPU
    of its local rank; collectives use NCCL for CUDA tensors and gloo for CPU ones (CPU-offloaded
    shards and picklable objects), on CPU gloo for both.

    Args:
        device: the device `trainer.device` names (`cuda` or `cpu`; the index is chosen here).
        expected_world_size: `trainer.n_gpus_per_node * trainer.nnodes`.
        per_node: `trainer.n_gpus_per_node`, checked against `LOCAL_WORLD_SIZE` where the launcher
            sets it (torchrun does); None: not checked.

    Raises:
        UserError: torchrun started another number of processes than the config names (in all or
            on this node), or more processes on this node than it has GPUs.
    """
    if not in_torchrun():
        return DistContext(device=device)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    if world_size != expected_world_size:
        raise UserError(
            f"torchrun started {world_size} processes but `trainer.n_gpus_per_node` x `trainer.nnodes` = "
            f"{expected_world_size}; make them equal (torchrun's --nnodes x --nproc_per_node, one process per GPU)"
        )
    local_world = os.environ.get("LOCAL_WORLD_SIZE")
    if per_node is not None and local_world is not None and int(local_world) != per_node:
        raise UserError(
            f"torchrun started {local_world} processes on this node but `trainer.n_gpus_per_node={per_node}`; "
            f"give torchrun --nproc_per_node={per_node} on every node (one process per GPU)"
        )
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if device.type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise UserError(
                f"local rank {local_rank} has no GPU: this node shows {torch.cuda.device_count()}; "
                "lower `trainer.n_gpus_per_node` (and torchrun's --nproc_per_node)"
            )
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "cpu:gloo,cuda:nccl"
    else:
        backend = "gloo"
    if not dist.is_initialized():
        device_id = device if device.type == "cuda" else None
        store_file = os.environ.get(STORE_FILE_ENV)
        if store_file:
            store = dist.FileStore(store_file, world_size)
            dist.init_process_group(
                backend, store=store, rank=rank, world_size=world_size, device_id=device_id
            )
        else:
            dist.init_process_group(backend=backend, device_id=device_id)
    mesh = init_device_mesh(device.type, (world_size,), mesh_dim_names=("dp",))
    logger.info("rank %d of %d on %s (%s)", rank, world_size, device, backend)
    return DistContext(rank=rank, world_size=world_size, local_rank=local_rank, device=device, mesh=mesh)
