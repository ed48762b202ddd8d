"""The model zoo: known architectures with random weights, built locally from their configs.

`zoo:tiny/NAME` models are a few layers and ~100 tokens wide, for tests and the CPU demo.
`zoo:ORG/NAME` models carry a published model's shape for memory and speed measurements without a
download, with the family's real tokenizer where relm ships it (Qwen2.5, Phi-3, Mistral-Nemo:
`relm.models.family_tokenizers`), else the character tokenizer, whose ids fit inside the published
vocabulary.
Either way the result is an ordinary HF folder, so every loader in relm treats it like a user's
checkpoint and the zoo adds no second code path. The entries themselves live in
`relm.models.zoo_entries`; this module turns one into a folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, GenerationConfig, PretrainedConfig

from relm.errors import UserError
from relm.models.cache import COMPLETE_MARKER, default_cache_dir, publish_folder
from relm.models.family_tokenizers import tokenizer_folder
from relm.models.zoo_entries import STUDY_ZOO, TINY_ZOO, ZOO, ZooEntry

__all__ = [
    "COMPLETE_MARKER",
    "STUDY_ZOO",
    "TINY_ZOO",
    "ZOO",
    "ZooEntry",
    "default_cache_dir",
    "materialize_zoo",
    "zoo_config",
    "zoo_entry",
]

ZOO_PREFIX = "zoo:"
CONFIG_ONLY_ABOVE_LAYERS = 4
"""Zoo models deeper than this (the published shapes) are written as config only; see `_write_folder`."""


def is_zoo_path(path: str | os.PathLike | None) -> bool:
    """True for `zoo:NAME` model paths."""
    return isinstance(path, str) and path.startswith(ZOO_PREFIX)


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
    entry = zoo_entry(path)
    config = entry.build_config(entry.tokenizer())
    if entry.declared_architecture:
        config.architectures = [entry.declared_architecture]
    return config


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
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    tokenizer = entry.tokenizer(root)
    config = entry.build_config(tokenizer)
    fingerprint = hashlib.sha256(
        "\n".join(
            [
                config.to_json_string(),
                tokenizer.backend_tokenizer.to_str(),
                str(tokenizer.pad_token),
                str(entry.weight_dtype),
                str(entry.declared_architecture),
            ]
        ).encode()
    ).hexdigest()[:10]
    final = root / "zoo" / name / f"seed{seed}-{fingerprint}"
    if (final / COMPLETE_MARKER).is_file():
        return final

    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        family = entry.tokenizer_family
        _write_folder(staging, config, entry.weight_dtype, seed, entry.declared_architecture)
        if family is not None:
            # The shipped files as published (a re-save can rewrite a normalizer), LICENSE and SOURCE included.
            for file in tokenizer_folder(family, root).iterdir():
                if file.name != COMPLETE_MARKER:
                    shutil.copyfile(file, staging / file.name)
        else:
            tokenizer.save_pretrained(staging)
        (staging / COMPLETE_MARKER).write_text(f"seed={seed}\n")
        publish_folder(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def _write_folder(
    folder: Path,
    config: PretrainedConfig,
    dtype: torch.dtype,
    seed: int,
    declared_architecture: str | None = None,
) -> None:
    generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    )
    if config.num_hidden_layers > CONFIG_ONLY_ABOVE_LAYERS:
        # A published shape: writing gigabytes of random weights through the CPU only to read them
        # back would dominate a benchmark's start-up; the loader builds them seeded on the device.
        # transformers annotates every lazy auto mapping with the tokenizer mapping's (slow, fast) pair;
        # the model mapping holds the class itself.
        config.architectures = [AutoModelForCausalLM._model_mapping[type(config)].__name__]  # type: ignore[attr-defined]
        config.save_pretrained(folder)
        generation_config.save_pretrained(folder)
    else:
        # fork_rng keeps the caller's global RNG stream untouched by the zoo's seeding.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        model.generation_config = generation_config
        model.save_pretrained(folder)
    if declared_architecture:
        # save_pretrained writes the class it saved; a renamed architecture is a fact of the file.
        config_file = folder / "config.json"
        written = json.loads(config_file.read_text())
        written["architectures"] = [declared_architecture]
        config_file.write_text(json.dumps(written, indent=2, sort_keys=True) + "\n")
