"""What a rollout batch costs in GPU memory, and the refusal when it exceeds the engine's share.

Checked before the native engine allocates its cache. A batch whose rows do not all fit decodes
fewer rows at a time (continuous batching refills the slots); when not even one row fits, the
call fails at once with the config key to change, instead of as a CUDA out-of-memory error halfway
through a step.
"""

from __future__ import annotations

from transformers import PretrainedConfig

from relm.errors import UserError

SAMPLING_ROWS_OF_VOCAB = 4
"""fp32 vocabulary rows of sampling memory per batch row: the logits buffer, the temperature-scaled
copy, the probabilities and the exponential noise (see `relm.rollout.sampling.sample_next_token`)."""


def kv_bytes_per_token(config: PretrainedConfig, dtype_bytes: int, tp_size: int = 1) -> int:
    """Keys + values of one token over all layers, from an HF text config (standard attention), on one
    rank of a tensor-parallel group of `tp_size` (each keeps its share of the key/value heads)."""
    num_heads = config.num_attention_heads
    num_kv_heads = (getattr(config, "num_key_value_heads", None) or num_heads) // tp_size
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
    return 2 * config.num_hidden_layers * num_kv_heads * head_dim * dtype_bytes


def bytes_per_row(config: PretrainedConfig, dtype_bytes: int, length: int, tp_size: int = 1) -> int:
    """GPU bytes one decoding row holds: its KV cache of `length` tokens and its sampling buffers."""
    kv = length * kv_bytes_per_token(config, dtype_bytes, tp_size)
    return kv + config.vocab_size * 4 * SAMPLING_ROWS_OF_VOCAB


def rows_within_budget(
    config: PretrainedConfig,
    weight_bytes: int,
    dtype_bytes: int,
    length: int,
    gpu_memory_utilization: float,
    total_bytes: int,
    tp_size: int = 1,
) -> int:
    """How many rows of `length` tokens fit beside the weights (this rank's) in `gpu_memory_utilization` of
    `total_bytes` (0 or less: not even one)."""
    free = gpu_memory_utilization * total_bytes - weight_bytes
    return int(free // bytes_per_row(config, dtype_bytes, length, tp_size))


def check_rollout_memory(
    config: PretrainedConfig,
    weight_bytes: int,
    dtype_bytes: int,
    rows: int,
    length: int,
    gpu_memory_utilization: float,
    total_bytes: int,
    tp_size: int = 1,
) -> None:
    """Refuse a cache of `rows` x `length` tokens that, with the weights and sampling buffers, would
    exceed `gpu_memory_utilization` of the device's `total_bytes`.

    Raises:
        UserError: naming actor_rollout_ref.rollout.gpu_memory_utilization, the need and the share.
    """
    kv = rows * length * kv_bytes_per_token(config, dtype_bytes, tp_size)
    sampling = rows * config.vocab_size * 4 * SAMPLING_ROWS_OF_VOCAB
    need = weight_bytes + kv + sampling
    total = total_bytes
    budget = gpu_memory_utilization * total
    if need > budget:
        gib = 1024**3
        raise UserError(
            f"actor_rollout_ref.rollout.gpu_memory_utilization={gpu_memory_utilization} gives the rollout "
            f"{budget / gib:.1f} GiB of the GPU's {total / gib:.1f} GiB, but {rows} row{'s' * (rows != 1)} x {length} tokens "
            f"need {need / gib:.1f} GiB (weights {weight_bytes / gib:.1f}, KV cache {kv / gib:.1f}, sampling "
            f"{sampling / gib:.1f}); raise gpu_memory_utilization or lower the prompt/response lengths"
        )
