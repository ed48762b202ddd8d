"""Which model family a tokenizer belongs to, read from its own special tokens.

A tokenizer folder says how to load it (`tokenizer_config.json`'s `tokenizer_class`) but not which
architecture it serves: Llama-3.2's and Mistral-Nemo's both declare the generic `TokenizersBackend`, and
Phi-3's declares `LlamaTokenizer`. Their chat-turn special tokens do tell them apart, and they are what the
chat template writes, so a tokenizer holding all of a family's markers is that family's. This is how
`examples/tiny_model.py` picks the architecture to write beside a real tokenizer (issue 37: it wrote Qwen2
for every tokenizer, and transformers then loaded each as a Qwen2 tokenizer).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["FAMILIES", "TokenizerFamily", "place_tokenizer"]


@dataclass(frozen=True)
class TokenizerFamily:
    """A model family as its tokenizer shows it."""

    name: str
    """Shown to the user (`llama`, `phi3`, ...)."""
    model_type: str
    """transformers' `model_type` of the family's architecture (the key of `AutoConfig.for_model`)."""
    architecture: str
    """The causal-LM class config.json names."""
    markers: tuple[str, ...]
    """Special tokens every tokenizer of the family holds (its chat template writes them)."""


FAMILIES: tuple[TokenizerFamily, ...] = (
    TokenizerFamily("gemma2", "gemma2", "Gemma2ForCausalLM", ("<start_of_turn>", "<end_of_turn>")),
    TokenizerFamily("llama", "llama", "LlamaForCausalLM", ("<|begin_of_text|>", "<|eot_id|>")),
    TokenizerFamily("phi3", "phi3", "Phi3ForCausalLM", ("<|user|>", "<|assistant|>", "<|end|>")),
    TokenizerFamily("qwen2", "qwen2", "Qwen2ForCausalLM", ("<|im_start|>", "<|im_end|>", "<|endoftext|>")),
    TokenizerFamily("mistral", "mistral", "MistralForCausalLM", ("[INST]", "[/INST]")),
)
"""Checked in this order; no two share a full set of markers."""


def place_tokenizer(vocabulary: Iterable[str]) -> TokenizerFamily | None:
    """The family whose markers are all in `vocabulary` (a tokenizer's `get_vocab()` keys), or None."""
    tokens = set(vocabulary)
    return next((family for family in FAMILIES if tokens.issuperset(family.markers)), None)
