"""Fused elementwise pieces of an HF decoder layer, for generation and training on CUDA.

After grouped attention, what remained of a native-engine decode step on an H200 (Qwen2.5-1.5B
shape, batch 256) was hundreds of small elementwise kernels a step: an RMSNorm is six or seven of
them, rotary embedding ten, the gated MLP's activation two. Each reads and writes the whole
activation, and inside a CUDA graph each still costs a few microseconds. torch.compile (inductor)
fuses each of those pieces into one or two kernels: the decode step went from 6.7 ms to 4.7 ms. In
training the same pieces (forward and backward) took a packed forward+backward of 16k tokens from
34.6% to 41.8% MFU.

Only those pieces are compiled, not the whole model: they have no per-layer constants (one compiled
kernel serves every layer), their shapes do not depend on the cache length (no recompilation per
length bucket), and the attention and KV cache, which do, stay as they are. The pieces are found by
the names transformers gives them in every architecture's modeling file: `*RMSNorm` and dense
`*MLP` classes, and the module-level `apply_rotary_pos_emb`. Mixture-of-experts blocks are left
eager (their routing is data-dependent). The patch is class-wide and applied only inside
`applied()`, around generation or a training step. A piece whose compilation fails runs its
original code from then on, with one warning naming the error.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import _StopRecomputationError

logger = logging.getLogger("relm")

_CLASS_SUFFIXES = ("RMSNorm", "MLP")
_FUNCTIONS = ("apply_rotary_pos_emb",)


class FusedLayers:
    """Swaps compiled versions of a model's norm, MLP and rotary functions in while it generates.

    Args:
        model: the HF causal LM the engine drives.
        enabled: compile at all (False on CPU, or when the user asks for eager generation).
        backend: torch.compile's backend.
        mode: torch.compile's mode (None: its default).
        functions: more (owner, name) pairs to compile the same way, given by the caller: a training
            step passes the learner's vocabulary-chunk functions (`relm.learner.vocab_chunks.
            compiled_pieces`), which this room, below the learner, cannot import.
    """

    def __init__(
        self,
        model: nn.Module,
        enabled: bool,
        backend: str | Callable[..., Any] = "inductor",
        mode: str | None = None,
        *,
        functions: Iterable[tuple[Any, str]] = (),
    ) -> None:
        self.backend = backend
        self.mode = mode
        self.disabled_reason: str | None = None if enabled else "disabled"
        self._targets = _find_targets(model) + list(functions) if enabled else []
        self._compiled: dict[tuple[Any, str], Callable[..., Any]] = {}

    @property
    def active(self) -> bool:
        return self.disabled_reason is None and bool(self._targets)

    def describe(self) -> str:
        """The names of what gets compiled, for logs and benchmark rows."""
        return ", ".join(
            sorted({f"{getattr(owner, '__name__', owner)}.{name}" for owner, name in self._targets})
        )

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """Patch the compiled pieces in for the duration of a generate call; always restore them."""
        if not self.active:
            yield
            return
        _raise_recompile_limits()
        originals = [(owner, name, getattr(owner, name)) for owner, name in self._targets]
        for owner, name, original in originals:
            key = (owner, name)
            if key not in self._compiled:
                self._compiled[key] = self._guarded(
                    torch.compile(original, dynamic=None, backend=self.backend, mode=self.mode), original
                )
            setattr(owner, name, self._compiled[key])
        try:
            yield
        finally:
            for owner, name, original in originals:
                setattr(owner, name, original)

    def compiled(self, function: Callable[..., Any]) -> Callable[..., Any] | None:
        """A compiled copy of a pure `function` under the same failure rule, or None when disabled."""
        if self.disabled_reason is not None:
            return None
        compiled = torch.compile(function, dynamic=None, backend=self.backend, mode=self.mode)
        return self._guarded(compiled, function)

    def _guarded(self, compiled: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
        """`compiled`, or `original` once any compilation has failed (compilers fail on first call)."""

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.disabled_reason is not None:
                return original(*args, **kwargs)
            try:
                return compiled(*args, **kwargs)
            except (torch.OutOfMemoryError, _StopRecomputationError):
                # The second is how activation checkpointing ends a recomputation once it has what
                # backward needs (early stop): control flow, not a compiler failure. Catching it and
                # rerunning the original left checkpointing in a broken state ("target_frame.early_stop
                # is set"), which is how training-side compilation failed under checkpointing.
                raise
            except Exception as exc:  # noqa: BLE001 - any compiler failure: run the model's own code
                self.disable(exc)
                return original(*args, **kwargs)

        return call

    def disable(self, exc: BaseException) -> None:
        """Stop using compiled pieces after a failure (inside or outside `applied`)."""
        reason = " ".join(str(exc).split())[:300] or type(exc).__name__
        self.disabled_reason = f"{type(exc).__name__}: {reason}"
        logger.warning(
            "compiling the decoder's norm/MLP/rotary pieces failed (%s); running the model's own "
            "code instead (same results, slower)",
            self.disabled_reason,
        )


def _raise_recompile_limits(limit: int = 64) -> None:
    """Each piece sees several shapes (row buckets, prefill, decode), grad modes and autocast states;
    dynamo's default of 8 compiled variants per function was hit in a full training run."""
    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name) and getattr(config, name) < limit:
            setattr(config, name, limit)


def _find_targets(model: nn.Module) -> list[tuple[Any, str]]:
    """(owner, attribute) pairs to compile: classes' `forward` and modeling-module functions."""
    targets: list[tuple[Any, str]] = []
    seen: set[type] = set()
    for module in model.modules():
        cls = type(module)
        if cls in seen or not cls.__name__.endswith(_CLASS_SUFFIXES):
            continue
        seen.add(cls)
        if compiles(module):
            targets.append((cls, "forward"))
    modeling_modules = {sys.modules.get(cls.__module__) for cls in seen} | {
        sys.modules.get(type(model).__module__)
    }
    for modeling in modeling_modules:
        if modeling is None:
            continue
        targets.extend((modeling, name) for name in _FUNCTIONS if callable(getattr(modeling, name, None)))
    return targets


def compiles(module: nn.Module) -> bool:
    """Whether `module`'s forward is one of the compiled pieces: an `*RMSNorm` or a dense `*MLP`.

    The memory plan reads it too: a compiled piece casts its fp32 weights to bf16 inside its graph, so
    autocast's cache (which keeps a bf16 copy of each fp32 weight cast eagerly) never holds them."""
    name = type(module).__name__
    if name.endswith("MLP"):
        return not _looks_routed(module)
    return name.endswith(_CLASS_SUFFIXES)


def _looks_routed(module: nn.Module) -> bool:
    """An `*MLP` that holds experts or a router is a mixture-of-experts block: its routing is data-dependent."""
    return any(hasattr(module, name) for name in ("experts", "router", "gate")) and not hasattr(
        module, "gate_proj"
    )
