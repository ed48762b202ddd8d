"""FP8 rollout weights for the native engine (`actor_rollout_ref.rollout.quantization=fp8`).

Decoding reads every weight once per step, so at rollout batch sizes a step's time is mostly the bytes
of the linear layers' weights; float8_e4m3fn halves them against bf16, and Hopper's FP8 tensor cores
run the products at twice bf16's rate. The trainer keeps its own weights: only the engine's copy is
quantized, again at every weight sync, and the gap between the engine's and the trainer's logprobs is
logged as for any engine (`rollout/logprob_diff_max`, `rollout/logprob_diff_mean`).

What is quantized follows verl 0.9's `quantization=fp8` (its vLLM path, `FP8_BLOCK_QUANT_KWARGS`):

- the decoder's `nn.Linear` layers (q/k/v/o, gate/up/down); weights in 128 x 128 blocks, each with its
  own float32 scale (amax / 448), where both of a layer's dimensions are multiples of 128, else one
  scale per output channel (row); a fused q/k/v or gate/up product is quantized as one layer;
- activations quantized dynamically at every product: one scale per token (row) for per-channel
  weights, one per token and 128 input columns (1 x 128) for block weights, as vLLM's block FP8 does;
- kept in the engine's dtype: the LM head and embeddings (vLLM's fp8 method skips them too), norms,
  MoE routers (`*.gate`, verl's `ignored_layers`; also anything named `*router*`), transformers 5's fused
  expert tensors (not `nn.Linear`), LoRA adapters (a LoRA actor that generates itself, on CPU, has its
  base layers quantized), and layers whose dimensions are not multiples of 16 (what FP8 tensor cores take).

On CUDA a product is `torch._scaled_mm` (fp32 accumulation, output in the activation dtype). Elsewhere
(CPU tests) the same quantized operands are dequantized and multiplied in float32: the same rounding
of weights and activations, only the product's precision differs.

The FP8 copy of a layer lives in non-persistent buffers of the module (`fp8_weight`, `fp8_scale`), so
the memory plan's parking moves it with the module and the engine's CUDA-graph check sees it move;
re-quantizing writes into the same buffers, so captured graphs stay valid across syncs.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from relm.rollout.native.fused_projections import ProjectionGroup

logger = logging.getLogger("relm")

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448
BLOCK = 128
"""Side of verl's weight blocks (`weight_block_size: [128, 128]`) and of the activation groups."""
_ALIGN = 16
"""FP8 tensor-core products need both weight dimensions to be multiples of this."""
_TINY = torch.finfo(torch.float32).tiny
"""Smallest scale: an all-zero row or block quantizes to zeros instead of 0/0."""
WEIGHT_BUFFER, SCALE_BUFFER = "fp8_weight", "fp8_scale"


@dataclass(frozen=True)
class Fp8Tensor:
    """A float8_e4m3fn tensor and the float32 scales that decode it (value = data * scale).

    `block` None: `scale` has one entry per row ([rows, 1]). Otherwise the rows are cut into groups of
    `block[0]` and the columns into groups of `block[1]` (the last ones may be shorter) and `scale` is
    [ceil(rows / block[0]), ceil(cols / block[1])].
    """

    data: torch.Tensor
    scale: torch.Tensor
    block: tuple[int, int] | None


def quantize(x: torch.Tensor, block: tuple[int, int] | None = None) -> Fp8Tensor:
    """`x` [rows, cols] as FP8 with one scale per row (`block` None) or per `block` tile.

    Each scale is the tile's largest magnitude over 448 (e4m3's largest finite value), so the largest
    element maps to +-448 and each element is rounded to e4m3's nearest value: a relative error of at
    most 2^-4 for elements whose scaled magnitude is at least 2^-6 (e4m3's normal range), an absolute one
    of at most 2^-10 x scale below that.
    """
    values = x.detach().float()
    if block is None:
        scale = values.abs().amax(dim=1, keepdim=True).div(FP8_MAX).clamp(min=_TINY)  # [rows, 1]
        return Fp8Tensor(_to_fp8(values / scale), scale, None)
    tiles = _tiles(values, block)  # [R, b0, C, b1], zero-padded to whole tiles
    scale = tiles.abs().amax(dim=(1, 3)).div(FP8_MAX).clamp(min=_TINY)  # [R, C]
    data = _untile(_to_fp8(tiles / scale[:, None, :, None]), x.shape)
    return Fp8Tensor(data, scale, block)


def dequantize(q: Fp8Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The tensor `q` stands for, in `dtype` (the product of float32 data and scale, then cast)."""
    if q.block is None:
        return (q.data.float() * q.scale).to(dtype)
    tiles = _tiles(q.data.float(), q.block) * q.scale[:, None, :, None]
    return _untile(tiles, q.data.shape).to(dtype)


def quantize_activation(x: torch.Tensor, weight_block: tuple[int, int] | None) -> Fp8Tensor:
    """Activations [tokens, cols] for a product with a weight quantized with `weight_block`: one scale per
    token for per-channel weights, one per token and `weight_block[1]` columns for block weights."""
    block = None if weight_block is None else (1, weight_block[1])
    return Fp8Tensor(*activation_parts(x, block), block)


def activation_parts(x: torch.Tensor, block: tuple[int, int] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """`quantize(x, block)`'s data and scale: a pure tensor function, which the engine compiles on CUDA so
    that each product's quantization is one fused kernel instead of half a dozen small ones."""
    q = quantize(x, block)
    return q.data, q.scale


def fp8_linear(
    x: torch.Tensor,
    weight: Fp8Tensor,
    bias: torch.Tensor | None,
    parts: Callable[
        [torch.Tensor, tuple[int, int] | None], tuple[torch.Tensor, torch.Tensor]
    ] = activation_parts,
) -> torch.Tensor:
    """`F.linear(x, W, bias)` with W given as FP8 ([out, in]) and `x` ([..., in]) quantized per token
    (by `parts`, `activation_parts` or its compiled copy); the output is in `x`'s dtype.
    `torch._scaled_mm` on CUDA, dequantized operands in float32 elsewhere."""
    shape = x.shape
    flat = x.reshape(-1, shape[-1])
    block = None if weight.block is None else (1, weight.block[1])
    activation = Fp8Tensor(*parts(flat, block), block)
    if x.is_cuda:
        out = _scaled_mm(activation, weight, x.dtype)
    else:
        out = F.linear(dequantize(activation), dequantize(weight)).to(x.dtype)
    if bias is not None:
        out = out + bias
    return out.view(*shape[:-1], out.shape[-1])


def _scaled_mm(activation: Fp8Tensor, weight: Fp8Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """cuBLAS's FP8 product: row-wise scales ([M, 1] x [1, N]) or 1 x 128 by 128 x 128 blocks, whose
    scales cuBLAS reads outer-dimension-major (PyTorch's own tests lay them out the same way)."""
    if weight.block is None:
        scale_a, scale_b = activation.scale, weight.scale.view(1, -1)
    else:
        scale_a, scale_b = activation.scale.t().contiguous().t(), weight.scale.t()
    # Row-wise and block scaling write bf16 (or fp16); an fp32 engine gets the product cast up.
    product_dtype = out_dtype if out_dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
    out = torch._scaled_mm(
        activation.data, weight.data.t(), scale_a=scale_a, scale_b=scale_b, out_dtype=product_dtype
    )
    return out.to(out_dtype)


def weight_block(out_features: int, in_features: int) -> tuple[int, int] | None:
    """verl's 128 x 128 blocks where both dimensions are multiples of 128, else None (per channel)."""
    return (BLOCK, BLOCK) if out_features % BLOCK == 0 and in_features % BLOCK == 0 else None


def blockwise_supported(device: torch.device) -> bool:
    """Whether `torch._scaled_mm` runs 1 x 128 by 128 x 128 block scales on `device` (cuBLAS 12.9+ on
    Hopper); CPU products are dequantized, so any layout works there."""
    if device.type != "cuda":
        return True
    try:
        w = quantize(torch.randn(2 * BLOCK, 2 * BLOCK, device=device), (BLOCK, BLOCK))
        for rows in (16, 3):  # decode buckets and prefill chunks: any number of rows
            x = torch.randn(rows, 2 * BLOCK, device=device, dtype=torch.bfloat16)
            _scaled_mm(quantize_activation(x, w.block), w, torch.bfloat16)
    except (RuntimeError, NotImplementedError) as exc:
        logger.warning("fp8 rollout: block scales are not supported here (%s); scaling per channel", exc)
        return False
    return True


class _Unit:
    """One FP8 product: a plain linear, or a fused q/k/v or gate/up group (quantized as one weight).

    The FP8 tensors are buffers of the first linear, read at each call (parking replaces them)."""

    def __init__(
        self, linears: list[nn.Linear], group: ProjectionGroup | None, blocks: bool, parts: Callable[..., Any]
    ) -> None:
        self.linears = linears
        self.group = group
        self.parts = parts
        out_features = sum(linear.out_features for linear in linears)
        self.block = weight_block(out_features, linears[0].in_features) if blocks else None

    @property
    def owner(self) -> nn.Linear:
        return self.linears[0]

    def weight(self) -> torch.Tensor:
        weights = [linear.weight.detach() for linear in self.linears]
        return weights[0] if len(weights) == 1 else torch.cat(weights)

    def quantize(self) -> None:
        q = quantize(self.weight(), self.block)
        held = getattr(self.owner, WEIGHT_BUFFER, None)
        if held is None or held.device != q.data.device or held.shape != q.data.shape:
            self.owner.register_buffer(WEIGHT_BUFFER, q.data, persistent=False)
            self.owner.register_buffer(SCALE_BUFFER, q.scale, persistent=False)
            return
        held.copy_(q.data)  # in place: captured CUDA graphs read these addresses
        getattr(self.owner, SCALE_BUFFER).copy_(q.scale)

    def fp8(self) -> Fp8Tensor:
        return Fp8Tensor(getattr(self.owner, WEIGHT_BUFFER), getattr(self.owner, SCALE_BUFFER), self.block)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.group.bias if self.group is not None else self.owner.bias
        # Inside a compiled piece (the MLP) the plain function is traced into that piece's kernels;
        # called eagerly (attention's projections), the compiled copy is one kernel of its own.
        parts = activation_parts if torch.compiler.is_compiling() else self.parts
        return fp8_linear(x, self.fp8(), bias, parts)

    def remove(self) -> None:
        for name in (WEIGHT_BUFFER, SCALE_BUFFER):
            self.owner._buffers.pop(name, None)


class Fp8Weights:
    """The FP8 copy of a model's linear layers, re-quantized by `quantize()` and used inside `applied()`.

    Args:
        model: the engine's model.
        groups: its fused projection groups (`FusedProjections.groups`): each is quantized and
            multiplied as one weight; their members are left to the group.
        device: where it generates; on CUDA without block-scaled products, every layer scales per channel.
        compiled: `activation_parts` compiled (the engine's `FusedLayers.compiled`), or None to run it
            as it is.
    """

    def __init__(
        self,
        model: nn.Module,
        groups: list[ProjectionGroup],
        device: torch.device,
        compiled: Callable[..., Any] | None = None,
    ) -> None:
        self.model = model
        blocks = blockwise_supported(torch.device(device))
        parts = compiled or activation_parts
        grouped = {id(linear) for group in groups for linear in group.linears}
        self.units = [
            _Unit(group.linears, group, blocks, parts) for group in groups if _quantizable(group.linears)
        ]
        for name, module in model.named_modules():
            if type(module) is nn.Linear and id(module) not in grouped and _quantizable([module], name):
                self.units.append(_Unit([module], None, blocks, parts))
        self.units = [unit for unit in self.units if not _skipped(model, unit)]
        self.stale = True
        """Whether the weights changed since the last `quantize()` (the engine quantizes before generating)."""

    def quantize(self) -> None:
        """(Re-)quantize every layer from its current weights (after each weight sync)."""
        with torch.no_grad():
            for unit in self.units:
                unit.quantize()
        self.stale = False

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """Route the layers' products through their FP8 copies; inside `FusedProjections.applied()`, whose
        groups then hand their members the columns of one FP8 product."""
        if self.stale:
            self.quantize()
        try:
            for unit in self.units:
                if unit.group is not None:
                    unit.group.product = unit.forward
                else:
                    unit.owner.forward = unit.forward  # type: ignore[method-assign,assignment]  # popped below
            yield
        finally:
            for unit in self.units:
                if unit.group is not None:
                    unit.group.product = None
                else:
                    unit.owner.__dict__.pop("forward", None)

    def quantized_bytes(self) -> int:
        return sum(
            t.numel() * t.element_size()
            for unit in self.units
            for t in (getattr(unit.owner, WEIGHT_BUFFER, None), getattr(unit.owner, SCALE_BUFFER, None))
            if t is not None
        )


def _quantizable(linears: list[nn.Linear], name: str = "") -> bool:
    leaf = name.rsplit(".", 1)[-1]
    if leaf.endswith("gate") or "router" in leaf:  # MoE routers stay exact (verl's ignored_layers)
        return False
    if ".lora_" in name:  # a LoRA actor generating itself (CPU): its base layers are quantized, not adapters
        return False
    out_features = sum(linear.out_features for linear in linears)
    return out_features % _ALIGN == 0 and linears[0].in_features % _ALIGN == 0


def _skipped(model: nn.Module, unit: _Unit) -> bool:
    """The output head (and the input embedding it may share) stays in the engine's dtype."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None  # type: ignore[operator]  # nn.Module hides the HF model's API
    return head is not None and any(linear is head for linear in unit.linears)


def _tiles(x: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """[rows, cols] zero-padded to whole tiles and viewed as [R, b0, C, b1]."""
    rows, cols = x.shape
    b0, b1 = block
    padded = F.pad(x, (0, -cols % b1, 0, -rows % b0))
    return padded.view(padded.shape[0] // b0, b0, padded.shape[1] // b1, b1)


def _untile(tiles: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """[R, b0, C, b1] back to [rows, cols] (the padding cut off)."""
    rows, cols = shape
    flat = tiles.reshape(tiles.shape[0] * tiles.shape[1], tiles.shape[2] * tiles.shape[3])
    return flat if flat.shape == shape else flat[:rows, :cols].contiguous()


def _to_fp8(x: torch.Tensor) -> torch.Tensor:
    """Round to e4m3's nearest value; magnitudes past 448 (none, given the scales) saturate."""
    return x.clamp(-FP8_MAX, FP8_MAX).to(FP8)
