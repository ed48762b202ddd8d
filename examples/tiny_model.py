"""Write a tiny random-weight Qwen2 beside a real tokenizer, as a model folder relm (or HF) loads.

    python examples/tiny_model.py --tokenizer ../shared/realworld/tokenizers/qwen2.5 --output models/tiny-qwen2.5

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

import torch
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM
from transformers.utils import logging as hf_logging


def tiny_config(tokenizer, *, layers: int, hidden: int, max_positions: int) -> Qwen2Config:
    """Qwen2 with `layers` layers of width `hidden` (4 heads, 2 KV heads) over the tokenizer's vocabulary."""
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", required=True, type=Path, help="tokenizer folder (tokenizer.json ...)")
    parser.add_argument("--output", required=True, type=Path, help="model folder to write")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--max_positions", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(args.tokenizer))
    except (OSError, ValueError) as exc:
        print(f"error: --tokenizer '{args.tokenizer}' does not load: {exc}", file=sys.stderr)
        return 2
    torch.manual_seed(args.seed)
    hf_logging.disable_progress_bar()
    config = tiny_config(tokenizer, layers=args.layers, hidden=args.hidden, max_positions=args.max_positions)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(args.output)
    tokenizer.save_pretrained(args.output)
    num_params = sum(p.numel() for p in model.parameters())
    print(f"wrote a {num_params / 1e6:.1f}M-parameter Qwen2 with {len(tokenizer)} tokens to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
