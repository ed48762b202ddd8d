"""Write a tiny random-weight model of a real tokenizer's own family beside it, as a folder relm (or HF) loads.

    python examples/tiny_model.py --tokenizer ../shared/realworld/tokenizers/llama3.2 --output models/tiny-llama3.2

The architecture is the tokenizer's family, read from its special tokens (`relm.models.tokenizer_family`):
Llama for Llama-3.2 (`<|begin_of_text|>`), Phi3 for Phi-3 (`<|user|>`, `<|end|>`), Mistral for Mistral-Nemo
(`[INST]`), Gemma2 for Gemma-2 (`<start_of_turn>`), Qwen2 for Qwen2.5 (`<|im_start|>`). A model of another
family beside a tokenizer makes transformers load the tokenizer as that family's (a Qwen2 config.json turns
Llama-3.2's tokenizer into a Qwen2 one that splits numbers digit by digit), so a tokenizer it cannot place
stops with one line asking for `--architecture` (e.g. `--architecture LlamaForCausalLM`). The tokenizer is
written with `save_pretrained`, so that transformers, which reads the folder's config.json too, encodes as
relm does (relm loads the class tokenizer_config.json declares: docs/models.md).

A real checkpoint's tokenizer brings its own special tokens, chat template and vocabulary size; a tiny
model sized to it (2 layers, hidden 64: about 10M parameters, nearly all in the embedding) exercises all
of them in a run that takes seconds on a CPU. The embedding has one row per token of the tokenizer
(`len(tokenizer)`), and the config's pad, bos and eos ids are the tokenizer's, so what the model
generates always decodes. The weights are random: it learns nothing useful, it shows the machinery.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig
from transformers.utils import logging as hf_logging

from relm.models.tokenizer_family import FAMILIES, place_tokenizer

HEADS = 4
"""Attention heads of the tiny model (2 of them key/value heads, where the family has GQA)."""


def tiny_config(
    tokenizer: Any, model_type: str, *, layers: int, hidden: int, max_positions: int
) -> PretrainedConfig:
    """`model_type` with `layers` layers of width `hidden` (4 heads, 2 KV heads) over the tokenizer's vocabulary."""
    head_dim = hidden // HEADS
    fields: dict[str, Any] = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=HEADS,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    if model_type in ("gemma2", "mistral", "llama"):
        fields["head_dim"] = head_dim  # Gemma-2's default is the 2B model's 256, whatever the width
    if model_type == "gemma2":
        fields["query_pre_attn_scalar"] = head_dim
    return AutoConfig.for_model(model_type, **fields)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", required=True, type=Path, help="tokenizer folder (tokenizer.json ...)")
    parser.add_argument("--output", required=True, type=Path, help="model folder to write")
    parser.add_argument(
        "--architecture",
        help="the causal-LM class to write (e.g. LlamaForCausalLM); default: the tokenizer's family",
    )
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--max_positions", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not args.tokenizer.is_dir():
        print(
            f"error: --tokenizer '{args.tokenizer}' is not a folder; give a tokenizer folder", file=sys.stderr
        )
        return 2
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(args.tokenizer))
    except (OSError, ValueError) as exc:
        print(f"error: --tokenizer '{args.tokenizer}' does not load: {exc}", file=sys.stderr)
        return 2
    by_architecture = {family.architecture: family.model_type for family in FAMILIES}
    if args.architecture is not None:
        if args.architecture not in by_architecture:
            print(
                f"error: --architecture {args.architecture} is not one of {', '.join(by_architecture)}",
                file=sys.stderr,
            )
            return 2
        architecture, model_type = args.architecture, by_architecture[args.architecture]
    else:
        family = place_tokenizer(tokenizer.get_vocab())
        if family is None:
            print(
                f"error: --tokenizer '{args.tokenizer}' has none of the chat tokens of a family this recipe "
                f"knows ({', '.join(f.name for f in FAMILIES)}); pass --architecture, one of "
                f"{', '.join(by_architecture)}",
                file=sys.stderr,
            )
            return 2
        architecture, model_type = family.architecture, family.model_type
    torch.manual_seed(args.seed)
    hf_logging.disable_progress_bar()
    config = tiny_config(
        tokenizer, model_type, layers=args.layers, hidden=args.hidden, max_positions=args.max_positions
    )
    model = AutoModelForCausalLM.from_config(config)
    assert type(model).__name__ == architecture, f"{model_type} builds {type(model).__name__}"
    model.save_pretrained(args.output)
    tokenizer.save_pretrained(args.output)
    num_params = sum(p.numel() for p in model.parameters())
    print(
        f"wrote a {num_params / 1e6:.1f}M-parameter {architecture} with {len(tokenizer)} tokens "
        f"({type(tokenizer).__name__}) to {args.output}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
