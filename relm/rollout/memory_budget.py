"""What a rollout batch costs in GPU memory, and the refusal when it exceeds the engine's share.

Checked before the native engine allocates its cache, so a batch that cannot fit fails at once
with the config key to change, instead of as a CUDA out-of-memory error halfway through a step.
"""

from __future__ import annotations

from transformers import PretrainedConfig

from relm.errors import UserError

SAMPLING_ROWS_OF_VOCAB = 4
"""fp32 vocabulary rows of sampling memory per batch row: the logits buffer, the temperature-scaled
copy, the probabilities and the exponential noise (see `relm.rollout.sampling.sample_next_token`)."""


def kv_bytes_per_token(config: PretrainedConfig, dtype_bytes: int) -> int:
    """Keys + values of one token over all layers, from an HF text config (standard attention)."""
    num_heads = config.num_attention_heads
    num_kv_heads = getattr(config, "num_key_value_heads", None) or num_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
    return 2 * config.num_hidden_layers * num_kv_heads * head_dim * dtype_bytes


def check_rollout_memory(
    config: PretrainedConfig,
    weight_bytes: int,
    dtype_bytes: int,
    rows: int,
    length: int,
    gpu_memory_utilization: float,
    total_bytes: int,
) -> None:
    """Refuse a cache of `rows` x `length` tokens that, with the weights and sampling buffers, would
    exceed `gpu_memory_utilization` of the device's `total_bytes`.

    Raises:
        UserError: naming actor_rollout_ref.rollout.gpu_memory_utilization, the need and the share.
    """
    kv = rows * length * kv_bytes_per_token(config, dtype_bytes)
    sampling = rows * config.vocab_size * 4 * SAMPLING_ROWS_OF_VOCAB
    need = weight_bytes + kv + sampling
    total = total_bytes
    budget = gpu_memory_utilization * total
    if need > budget:
        gib = 1024**3
        raise UserError(
            f"actor_rollout_ref.rollout.gpu_memory_utilization={gpu_memory_utilization} gives the rollout "
            f"{budget / gib:.1f} GiB of the GPU's {total / gib:.1f} GiB, but {rows} rows x {length} tokens "
            f"need {need / gib:.1f} GiB (weights {weight_bytes / gib:.1f}, KV cache {kv / gib:.1f}, sampling "
            f"{sampling / gib:.1f}); raise gpu_memory_utilization or lower data.train_batch_size, "
            "rollout.n or the prompt/response lengths"
        )
