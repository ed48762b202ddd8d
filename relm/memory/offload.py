"""Models that wait in CPU memory outside the phases that use them (the memory plan's "parking").

A step uses its models one phase at a time: the engine's copy of the policy while generating and
syncing, the reference model for one forward, the critic for its values and its update. When the
memory plan finds that the actor's update does not fit beside all of them, the ones it names are
moved to pinned CPU memory when their phase ends and back when it starts. A 7B model's bf16 copy
moves in about half a second each way over PCIe, small beside the step it makes possible.

Moving is done on the tensors' `.data`, so parameter objects (and the optimizer state keyed by them)
stay the same; CUDA graphs captured over the old addresses are dropped and recaptured by the engine
(`DecodeGraphs.check_weights`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch
from torch import nn

PHASE_NEEDS = {
    "generate": {"engine_copy"},
    "old_log_prob": set(),
    "reference": {"reference"},
    "teacher": {"teacher"},
    "values": {"critic"},
    "update_critic": {"critic"},
    "update_actor": set(),
    "sync": {"engine_copy"},
}
"""Which parkable models each phase of `ppo_step` uses."""


class ParkedModel:
    """One model (and optionally its optimizer's states) that can move between the GPU and pinned CPU memory.

    Args:
        module: the model.
        device: where it computes.
        optimizer: its optimizer, whose per-parameter state tensors move with it.
    """

    def __init__(
        self, module: nn.Module, device: torch.device, optimizer: torch.optim.Optimizer | None = None
    ):
        self.module = module
        self.device = torch.device(device)
        self.optimizer = optimizer
        self.parked = False
        self._host = HostBuffers()

    def park(self) -> None:
        """Copy every tensor into its pinned CPU buffer and release the device copy."""
        if self.parked:
            return
        for tensor in self._tensors():
            host = self._host.get(id(tensor), tensor)
            host.copy_(tensor.data, non_blocking=True)
            tensor.data = host
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
        self.parked = True

    def unpark(self) -> None:
        """Bring every tensor back to the device (new device memory; the pinned buffers stay for next time)."""
        if not self.parked:
            return
        for tensor in self._tensors():
            tensor.data = tensor.data.to(self.device, non_blocking=True)
        self.parked = False

    def _tensors(self) -> Iterator[torch.Tensor]:
        yield from self.module.parameters()
        yield from self.module.buffers()
        if self.optimizer is not None:
            for state in self.optimizer.state.values():
                yield from (
                    value for value in state.values() if isinstance(value, torch.Tensor) and value.dim()
                )


class Residency:
    """The parkable models of a run and the phase that is running; `phase(name)` moves what it needs."""

    def __init__(self, models: dict[str, ParkedModel]) -> None:
        unknown = set(models) - {name for needs in PHASE_NEEDS.values() for name in needs}
        if unknown:
            raise ValueError(f"no phase uses {sorted(unknown)}")
        self.models = models
        self.current = "start-up"
        """The phase running now (or the last one), for the host-memory watchdog's message."""

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Park what `name` does not use, bring back what it does; nothing moves when nothing is parkable."""
        needs = PHASE_NEEDS[name]
        self.current = name
        # Autocast keeps the bf16 copies it made of fp32 weights until the outermost autocast region
        # ends, which spans several phases; a phase has no use for another model's copies (the memory
        # plan counts them only for the model being updated).
        torch.clear_autocast_cache()
        for model_name, model in self.models.items():
            if model_name not in needs:
                model.park()
        for model_name in needs:
            if model_name in self.models:
                self.models[model_name].unpark()
        yield


class OffloadedOptimizerStates:
    """AdamW moments that live in pinned CPU memory and visit the GPU a chunk at a time to step.

    fp32 AdamW keeps 8 bytes of moments per parameter beside 4 of weights and 4 of gradients: for a 7B
    actor that is 61 GB of the 122 its update holds, too much beside anything else on one H200. With
    this, `optimizer.step()` runs over consecutive chunks of the parameters (about `chunk_bytes` of
    moments each, as stored: `CompactAdamW`'s bf16 moments travel and wait in bf16, half the bytes):
    the chunk's moments come to the GPU, the optimizer's own step updates it, and they go back. The GPU holds one chunk of moments at a time; the price is moving them over PCIe twice a
    step (verl's `optimizer_offload` makes the same trade).

    Args:
        optimizer: a torch optimizer whose per-parameter state tensors are moments (AdamW).
        device: where the parameters are.
        chunk_bytes: moments brought to the GPU at once.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, device: torch.device, chunk_bytes: int = 2 << 30):
        self.optimizer = optimizer
        self.device = torch.device(device)
        self.chunk_bytes = chunk_bytes
        self._host = HostBuffers()
        inner = optimizer.step  # possibly an lr scheduler's counting wrapper: keep calling through it

        @functools.wraps(inner)  # keeps the scheduler's marker that it wrapped `step`
        def chunked_step(closure: object = None) -> None:
            if closure is not None:
                raise ValueError("offloaded optimizer states do not support a closure")
            self._step(inner)

        optimizer.step = chunked_step  # type: ignore[method-assign,assignment]  # a wrapper in place of the bound step

    def to_host(self) -> None:
        """Move every state tensor to pinned CPU memory (after loading a checkpoint, for instance)."""
        for param in self._params():
            self._move_state(param, to_device=False)

    def _params(self) -> list[torch.nn.Parameter]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def _chunks(self) -> list[dict[int, list[torch.nn.Parameter]]]:
        chunks: list[dict[int, list[torch.nn.Parameter]]] = [{}]
        size = 0
        for index, group in enumerate(self.optimizer.param_groups):
            for param in group["params"]:
                moments = self._moment_bytes(param)
                if size and size + moments > self.chunk_bytes:
                    chunks.append({})
                    size = 0
                chunks[-1].setdefault(index, []).append(param)
                size += moments
        return chunks

    def _moment_bytes(self, param: torch.nn.Parameter) -> int:
        """Bytes of the parameter's moments, as stored (bf16 moments of `CompactAdamW` are half of fp32's)."""
        state = self.optimizer.state.get(param)
        if state:
            return sum(v.nbytes for v in state.values() if isinstance(v, torch.Tensor) and v.dim())
        dtype = getattr(self.optimizer, "moments_dtype", param.dtype)  # torch's AdamW: the parameter's
        return 2 * param.numel() * dtype.itemsize

    def _step(self, inner) -> None:
        groups = self.optimizer.param_groups
        originals = [group["params"] for group in groups]
        try:
            for chunk in self._chunks():
                members = [p for params in chunk.values() for p in params]
                for param in members:
                    self._move_state(param, to_device=True)
                for index, group in enumerate(groups):
                    group["params"] = chunk.get(index, [])
                inner()
                for param in members:
                    self._move_state(param, to_device=False)
        finally:
            for group, params in zip(groups, originals, strict=True):
                group["params"] = params
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _move_state(self, param: torch.nn.Parameter, to_device: bool) -> None:
        state = self.optimizer.state.get(param)
        if not state:
            return
        for key, value in state.items():
            if not isinstance(value, torch.Tensor) or value.dim() == 0:
                continue  # the step counter stays where the optimizer keeps it
            if to_device:
                state[key] = value.to(self.device, non_blocking=True)
                continue
            host = self._host.get((id(param), key), value)
            if value.data_ptr() != host.data_ptr():
                host.copy_(value, non_blocking=True)
                state[key] = host


class HostBuffers:
    """CPU buffers kept by key, pinned where CUDA is available, carved out of power-of-two slabs.

    torch's pinned allocator rounds every allocation up to a power of two, so pinning each tensor on
    its own would pin up to twice its size (a 272 MB fp32 moment of a 7B model's MLP takes 512 MiB),
    and the memory plan's host arithmetic would not hold. Tensors are instead placed first-fit into
    slabs of `SLAB_BYTES` (or of the power of two that holds a larger tensor, its rest used for the
    next ones); what is lost is the unfilled tail of the slabs, about one slab per owner.
    """

    SLAB_BYTES = 1 << 28
    ALIGN = 4096

    def __init__(self) -> None:
        self.buffers: dict[object, torch.Tensor] = {}
        self._slabs: list[tuple[torch.Tensor, int]] = []  # (slab, bytes used)

    def get(self, key: object, like: torch.Tensor) -> torch.Tensor:
        """The buffer kept under `key` for tensors like `like`, made on first use."""
        host = self.buffers.get(key)
        if host is None:
            host = self._take(like.shape, like.dtype)
            self.buffers[key] = host
        return host

    @property
    def pinned_bytes(self) -> int:
        """Bytes of the slabs allocated so far."""
        return sum(slab.numel() for slab, _ in self._slabs)

    def _take(self, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        nbytes = shape.numel() * dtype.itemsize
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        size = -(-nbytes // self.ALIGN) * self.ALIGN
        index = next((i for i, (slab, used) in enumerate(self._slabs) if slab.numel() - used >= size), None)
        if index is None:
            slab_bytes = max(self.SLAB_BYTES, 1 << (size - 1).bit_length())
            slab = torch.empty(slab_bytes, dtype=torch.uint8, pin_memory=torch.cuda.is_available())
            self._slabs.append((slab, 0))
            index = len(self._slabs) - 1
        slab, used = self._slabs[index]
        self._slabs[index] = (slab, used + size)
        return slab[used : used + nbytes].view(dtype).view(shape)
