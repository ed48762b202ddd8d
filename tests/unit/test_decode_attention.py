"""The Triton decode attention against its fp32 torch reference, on CUDA and through Triton's interpreter.

Inputs are laid out as the engine hands them over: key/value/mask are slices of larger cache and
mask buffers (rows and columns past the slice, so no tensor is contiguous), the query is
transposed, masks have left padding, columns past each row's own, and holes. The interpreter runs
only on machines without CUDA (a GPU runs the compiled kernel instead) and skips without Triton
(CI); it cannot run bfloat16 products (triton-lang/triton#11584), so it checks fp32 and fp16.
Run them with `TRITON_INTERPRET=1 pytest tests/unit/test_decode_attention.py` where Triton is importable.
"""

from __future__ import annotations

import os

import pytest
import torch

from relm.rollout.native.attention import native_attention
from relm.rollout.native.decode_attention import (
    KernelConfig,
    available,
    decode_attention,
    default_config,
    reference_decode_attention,
)
from relm.rollout.native.grouped_attention import grouped_attention

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def decode_inputs(
    batch: int,
    kv_heads: int,
    group: int,
    head_dim: int,
    columns: int,
    dtype: torch.dtype,
    device: str,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """query [B, H, 1, D] (transposed), key/value [B, Hkv, K, D] and mask [B, 1, 1, K] as buffer slices."""
    generator = torch.Generator().manual_seed(seed)
    rows_cap, length_cap = batch + 3, columns + 17
    keys = torch.randn(rows_cap, kv_heads, length_cap, head_dim, generator=generator).to(device, dtype)
    values = torch.randn(rows_cap, kv_heads, length_cap, head_dim, generator=generator).to(device, dtype)
    query = torch.randn(batch, 1, kv_heads * group, head_dim, generator=generator).to(device, dtype)
    masks = torch.zeros(rows_cap, 1, 1, length_cap, dtype=torch.bool)
    for row in range(batch):
        # Left padding, then the prompt and response up to the row's own column, with a few holes.
        pad = int(torch.randint(0, columns, (), generator=generator))
        own = int(torch.randint(pad, columns, (), generator=generator))
        masks[row, 0, 0, pad : own + 1] = torch.rand(own + 1 - pad, generator=generator) > 0.1
        masks[row, 0, 0, own] = True
    masks = masks.to(device)
    return (
        query.transpose(1, 2),
        keys[:batch, :, :columns],
        values[:batch, :, :columns],
        masks[:batch, ..., :columns],
    )


def check(
    batch: int,
    kv_heads: int,
    group: int,
    head_dim: int,
    columns: int,
    dtype: torch.dtype,
    device: str,
    softcap: float | None = None,
    config: KernelConfig | None = None,
) -> None:
    query, key, value, mask = decode_inputs(batch, kv_heads, group, head_dim, columns, dtype, device)
    scale = head_dim**-0.5
    out = decode_attention(query, key, value, mask, scale, softcap, config)
    want = reference_decode_attention(query, key, value, mask, scale, softcap)
    assert out.shape == (batch, 1, kv_heads * group, head_dim) and out.is_contiguous() and out.dtype == dtype
    tolerance = TOLERANCE[dtype]
    torch.testing.assert_close(out.float(), want.float(), atol=tolerance, rtol=0)


@pytest.fixture(scope="module")
def interpreter() -> None:
    """Triton's interpreter on CPU, when the run asked for it with TRITON_INTERPRET=1.

    The variable cannot be set from here: `triton.jit` reads it when it decorates, Triton's own
    helpers (tl.max, tl.sigmoid) included, and importing transformers already imports Triton
    (through torch._dynamo) wherever it is installed.
    """
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine runs the compiled kernel (the gpu tests)")
    triton = pytest.importorskip("triton")
    if tuple(int(part) for part in triton.__version__.split(".")[:2]) < (3, 9):
        # 3.6's interpreter turns program ids into 1-element arrays that numpy 2 refuses as loop bounds.
        pytest.skip(f"Triton {triton.__version__}'s interpreter cannot run the kernel; 3.9 can")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("set TRITON_INTERPRET=1 to run the kernel through Triton's interpreter")


# --- CPU, through Triton's interpreter -----------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("group", "head_dim"), [(1, 16), (4, 64), (6, 32), (8, 16)])
@pytest.mark.parametrize("columns", [1, 37, 150])
def test_interpreter_matches_reference(interpreter, dtype, group, head_dim, columns):
    check(3, 2, group, head_dim, columns, dtype, "cpu")


@pytest.mark.parametrize(
    "config",
    [
        KernelConfig(block_n=16, num_splits=3),
        KernelConfig(block_n=32, num_splits=40),  # more splits asked than tiles: one per tile
        KernelConfig(block_n=64, num_splits=1, skip_masked=False),
        KernelConfig(block_n=16, num_splits=2, skip_masked=False),
    ],
)
def test_interpreter_split_and_unskipped_configs_match_reference(interpreter, config):
    check(8, 2, 6, 32, 150, torch.float32, "cpu", config=config)


def test_interpreter_softcap_matches_reference(interpreter):
    check(3, 2, 4, 32, 70, torch.float32, "cpu", softcap=2.0)  # a small cap so tanh bends the scores


def test_interpreter_never_reads_masked_columns(interpreter):
    poisoned_columns_are_skipped("cpu")


# --- CUDA -----------------------------------------------------------------------------------------


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("group", [1, 4, 6, 8])
def test_gpu_matches_reference(dtype, head_dim, group):
    for columns in (1, 37, 384, 1000):
        check(5, 2, group, head_dim, columns, dtype, "cuda")  # 10 programs: split-K past one tile
    check(300, 2, group, head_dim, 384, dtype, "cuda")  # 600 programs: one per (row, KV head)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize(
    "config",
    [
        KernelConfig(block_n=16, num_splits=1),
        KernelConfig(block_n=128, num_splits=5, num_warps=8, num_stages=3),
        KernelConfig(block_n=64, num_splits=1, skip_masked=False),
        KernelConfig(block_n=32, num_splits=7, skip_masked=False),
    ],
)
def test_gpu_configs_match_reference(config):
    check(9, 2, 6, 128, 1000, torch.bfloat16, "cuda", config=config)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_softcap_matches_reference(dtype):
    check(6, 4, 2, 256, 300, dtype, "cuda", softcap=2.0)


@pytest.mark.gpu
@requires_cuda
def test_gpu_never_reads_masked_columns():
    poisoned_columns_are_skipped("cuda")


@pytest.mark.gpu
@requires_cuda
def test_gpu_native_attention_decodes_through_the_kernel():
    query, key, value, mask = decode_inputs(7, 2, 6, 128, 200, torch.bfloat16, "cuda")
    assert available(query, value)
    out, _ = native_attention(None, query, key, value, mask, scaling=0.1)
    torch.testing.assert_close(out, decode_attention(query, key, value, mask, 0.1), atol=0, rtol=0)
    # Soft-capped models decode through the kernel too, instead of the grouped products.
    capped, _ = native_attention(None, query, key, value, mask, scaling=0.1, softcap=3.0)
    grouped = grouped_attention(query, key, value, mask, 0.1, 3.0)
    torch.testing.assert_close(capped.float(), grouped.float(), atol=2e-2, rtol=0)


# --- anywhere -------------------------------------------------------------------------------------


def test_unavailable_shapes_keep_the_callers_path():
    query = torch.zeros(2, 4, 1, 64)
    assert not available(query)  # CPU tensors: the grouped products
    if torch.cuda.is_available():
        assert available(query.cuda())
        assert not available(torch.zeros(2, 4, 1, 96, device="cuda"))  # not a power of two
        assert not available(torch.zeros(2, 4, 1, 512, device="cuda"))  # wider than a tile takes
        assert not available(query.cuda(), torch.zeros(2, 2, 5, 80, device="cuda"))  # value head size
        assert not available(torch.zeros(2, 4, 1, 64, device="cuda", dtype=torch.float64))
        assert not available(torch.zeros(2, 4, 3, 64, device="cuda"))  # a prefill, not a decode step


def test_default_config_splits_only_small_batches():
    cpu = torch.device("cpu")  # counts as one multiprocessor: 2 programs fill it
    assert default_config(2, 1000, 128, torch.bfloat16, cpu) == KernelConfig(block_n=32, num_splits=1)
    assert default_config(1, 1000, 128, torch.bfloat16, cpu) == KernelConfig(block_n=32, num_splits=2)
    assert default_config(1, 10, 128, torch.bfloat16, cpu).num_splits == 1  # one tile: nothing to split
    assert default_config(1, 1000, 256, torch.bfloat16, cpu).block_n == 32
    assert default_config(1, 1000, 128, torch.float32, cpu).block_n == 16


def poisoned_columns_are_skipped(device: str) -> None:
    """NaN in every masked column of the cache leaves the output equal to the clean cache's."""
    dtype = torch.float32
    query, key, value, mask = decode_inputs(4, 2, 4, 32, 100, dtype, device)
    want = decode_attention(query, key, value, mask, 0.2)
    hidden = ~mask[:, :, 0, :, None]  # [B, 1, K, 1], broadcast over heads and dims
    key.masked_fill_(hidden, float("nan"))
    value.masked_fill_(hidden, float("nan"))
    out = decode_attention(query, key, value, mask, 0.2)
    torch.testing.assert_close(out, want, atol=0, rtol=0)
    unskipped = decode_attention(query, key, value, mask, 0.2, config=KernelConfig(32, 1, skip_masked=False))
    assert unskipped.isnan().any()  # the check above can fail: reading those columns poisons the output
