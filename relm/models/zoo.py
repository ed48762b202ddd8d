"""The model zoo: known architectures with random weights, built locally from their configs.

`zoo:tiny/NAME` models are a few layers and ~100 tokens wide, for tests and the CPU demo.
`zoo:ORG/NAME` models carry a published model's shape (with the character tokenizer, whose ids
fit inside the published vocabulary) for memory and speed measurements without a download.
Either way the result is an ordinary HF folder, so every loader in relm treats it like a user's
checkpoint and the zoo adds no second code path.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

from relm.errors import UserError
from relm.models.tokenizer import build_char_tokenizer

ZOO_PREFIX = "zoo:"
COMPLETE_MARKER = ".relm-zoo-complete"
"""Written last inside the temp folder, so a folder that has it was written in full."""


@dataclass(frozen=True)
class ZooEntry:
    """One named architecture."""

    description: str
    """One line shown when listing the zoo."""
    build_config: Callable[[PreTrainedTokenizerFast], PretrainedConfig]
    """HF config for the given tokenizer (its special-token ids go into the config)."""
    weight_dtype: torch.dtype = torch.float32
    """Dtype of the saved weights; full-size shapes use bf16 to halve disk and build time."""


def _token_ids(tokenizer: PreTrainedTokenizerFast) -> dict[str, int | None]:
    return {
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }


def _tiny_qwen2(tokenizer: PreTrainedTokenizerFast) -> PretrainedConfig:
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        **_token_ids(tokenizer),
    )


def _tiny_qwen2_hd64(tokenizer: PreTrainedTokenizerFast) -> PretrainedConfig:
    # vLLM's CPU attention kernel refuses head_dim 16 (tiny/qwen2); Qwen2Config has no head_dim
    # key, so head_dim 64 needs hidden = 64 * heads.
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        **_token_ids(tokenizer),
    )


def _tiny_llama(tokenizer: PreTrainedTokenizerFast) -> PretrainedConfig:
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        **_token_ids(tokenizer),
    )


def _qwen25(hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int) -> Callable:
    def build(tokenizer: PreTrainedTokenizerFast) -> PretrainedConfig:
        return Qwen2Config(
            vocab_size=151936,
            hidden_size=hidden,
            intermediate_size=intermediate,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            max_position_embeddings=32768,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            tie_word_embeddings=True,
            **_token_ids(tokenizer),
        )

    return build


def _llama32_1b(tokenizer: PreTrainedTokenizerFast) -> PretrainedConfig:
    return LlamaConfig(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        tie_word_embeddings=True,
        **_token_ids(tokenizer),
    )


ZOO: dict[str, ZooEntry] = {
    "tiny/qwen2": ZooEntry("Qwen2, 2 layers, hidden 64, 4 heads / 2 kv heads, char vocab", _tiny_qwen2),
    "tiny/qwen2-hd64": ZooEntry("Qwen2, 2 layers, hidden 128, head_dim 64 (vLLM CPU)", _tiny_qwen2_hd64),
    "tiny/llama": ZooEntry("Llama, 2 layers, hidden 64, 4 heads / 2 kv heads, char vocab", _tiny_llama),
    "Qwen/Qwen2.5-0.5B": ZooEntry(
        "Qwen2.5-0.5B shape (494M parameters)", _qwen25(896, 4864, 24, 14, 2), torch.bfloat16
    ),
    "Qwen/Qwen2.5-1.5B": ZooEntry(
        "Qwen2.5-1.5B shape (1.54B parameters)", _qwen25(1536, 8960, 28, 12, 2), torch.bfloat16
    ),
    "meta-llama/Llama-3.2-1B": ZooEntry("Llama-3.2-1B shape (1.24B parameters)", _llama32_1b, torch.bfloat16),
}


def is_zoo_path(path: str | os.PathLike | None) -> bool:
    """True for `zoo:NAME` model paths."""
    return isinstance(path, str) and path.startswith(ZOO_PREFIX)


def default_cache_dir() -> Path:
    """`$RELM_CACHE`, else ~/.cache/relm."""
    return Path(os.environ.get("RELM_CACHE") or Path.home() / ".cache" / "relm")


def zoo_entry(path: str) -> ZooEntry:
    """The entry for `zoo:NAME` (or bare NAME).

    Raises:
        UserError: The name is not in the zoo.
    """
    name = path.removeprefix(ZOO_PREFIX)
    if name not in ZOO:
        raise UserError(
            f"actor_rollout_ref.model.path: unknown zoo model '{path}'; known: "
            + ", ".join(f"zoo:{known}" for known in ZOO)
        )
    return ZOO[name]


def zoo_config(path: str) -> PretrainedConfig:
    """The HF config of a zoo model, without building weights (cheap: for inspection and tests)."""
    return zoo_entry(path).build_config(build_char_tokenizer())


def materialize_zoo(path: str, cache_dir: str | Path | None = None, seed: int = 0) -> Path:
    """Write a zoo model as a complete HF folder in the cache and return the folder.

    The folder is `<cache>/zoo/<NAME>/seed<seed>-<fingerprint>`: the fingerprint hashes the config
    and tokenizer, so changing a zoo entry (or the transformers version that serialises it) never
    reuses stale weights. The folder is built in a temporary sibling and renamed into place, so
    concurrent processes either see nothing or a whole folder; the loser of a race discards its
    copy and uses the winner's. Same seed, same weights (for a given torch version).

    Args:
        path: `zoo:NAME`.
        cache_dir: Cache root; unset uses `default_cache_dir()`.
        seed: Seed of the random initialisation.

    Raises:
        UserError: Unknown zoo name.
    """
    entry = zoo_entry(path)
    name = path.removeprefix(ZOO_PREFIX)
    tokenizer = build_char_tokenizer()
    config = entry.build_config(tokenizer)
    fingerprint = hashlib.sha256(
        "\n".join(
            [config.to_json_string(), tokenizer.backend_tokenizer.to_str(), str(entry.weight_dtype)]
        ).encode()
    ).hexdigest()[:10]
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = root / "zoo" / name / f"seed{seed}-{fingerprint}"
    if (final / COMPLETE_MARKER).is_file():
        return final

    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        _write_folder(staging, config, tokenizer, entry.weight_dtype, seed)
        _publish(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def _write_folder(
    folder: Path, config: PretrainedConfig, tokenizer: PreTrainedTokenizerFast, dtype: torch.dtype, seed: int
) -> None:
    # fork_rng keeps the caller's global RNG stream untouched by the zoo's seeding.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / COMPLETE_MARKER).write_text(f"seed={seed}\n")


def _publish(staging: Path, final: Path) -> None:
    """Rename the staged folder into place; another process may have got there first."""
    try:
        os.rename(staging, final)
        return
    except OSError:
        if (final / COMPLETE_MARKER).is_file():
            return  # another process won the race with an identical folder
    # A folder without the marker was left by something other than this function: replace it.
    shutil.rmtree(final, ignore_errors=True)
    os.rename(staging, final)
