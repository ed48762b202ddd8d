"""The real tokenizers of Qwen2.5-Instruct, Phi-3-mini and Mistral-Nemo, shipped with the package.

The zoo's full-size entries of these families carry the family's own tokenizer, so `relm compat zoo:...`
and `relm bench` meet the real vocabulary, special tokens and chat template instead of the character
tokenizer. Their licenses (Apache-2.0, MIT, Apache-2.0) let the package ship them; each family's folder
under `tokenizer_files/` keeps its LICENSE and SOURCE.txt (where the bytes come from) beside the files.
Llama 3.2's license asks for its notice to travel with the files, so it stays out of the package (tests
read it from the shared real-world folder).

`tokenizer.json` is stored xz-compressed (5.4 + 1.8 + 7.3 MB become 1.4 + 0.3 + 1.7 MB) and unpacked
once into the relm cache, where it is an ordinary Hugging Face tokenizer folder.
"""

from __future__ import annotations

import hashlib
import lzma
import shutil
import tempfile
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from relm.models.cache import COMPLETE_MARKER, default_cache_dir, publish_folder

__all__ = ["FAMILIES", "FILES_DIR", "load_family_tokenizer", "tokenizer_folder"]

FILES_DIR = Path(__file__).with_name("tokenizer_files")
"""Package data: one folder per family."""
FAMILIES = ("qwen2.5", "phi3", "mistral-nemo")
COMPRESSED = "tokenizer.json.xz"


def tokenizer_folder(family: str, cache_dir: str | Path | None = None) -> Path:
    """The family's tokenizer as a Hugging Face folder in the cache (unpacked on first use).

    The folder is `<cache>/tokenizers/<family>-<hash>`, the hash of the shipped files, so a package
    upgrade that changes them never reuses a stale copy. LICENSE and SOURCE.txt are copied with it.

    Raises:
        KeyError: `family` is not one of `FAMILIES` (a zoo entry naming a family that is not shipped).
    """
    if family not in FAMILIES:
        raise KeyError(f"no shipped tokenizer for family {family!r}; shipped: {', '.join(FAMILIES)}")
    source = FILES_DIR / family
    files = sorted(path for path in source.iterdir() if path.is_file())
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = root / "tokenizers" / f"{family}-{digest.hexdigest()[:10]}"
    if (final / COMPLETE_MARKER).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        for path in files:
            if path.name == COMPRESSED:
                with lzma.open(path) as packed, open(staging / path.name.removesuffix(".xz"), "wb") as out:
                    shutil.copyfileobj(packed, out)
            else:
                shutil.copyfile(path, staging / path.name)
        (staging / COMPLETE_MARKER).write_text(f"{family}\n")
        publish_folder(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def load_family_tokenizer(family: str, cache_dir: str | Path | None = None) -> PreTrainedTokenizerBase:
    """The family's tokenizer as transformers loads its folder (no preflight: that is the loader's job)."""
    return AutoTokenizer.from_pretrained(tokenizer_folder(family, cache_dir))
