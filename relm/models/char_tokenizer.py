"""The built-in character tokenizer: 101 tokens, ChatML template, built in memory (no files, no download).

Apart from `relm.models.tokenizer` (loading and preflight) because the zoo builds its tiny models'
tokenizers with it while the loader resolves `zoo:` paths through the zoo: in one file the two
would import each other.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<|pad|>"
BOS_TOKEN = "<|bos|>"
IM_START_TOKEN = "<|im_start|>"
IM_END_TOKEN = "<|im_end|>"
UNK_TOKEN = "<|unk|>"
# Order fixes the ids: pad=0, bos=1, im_start=2, im_end=3, unk=4, then the characters.
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, IM_START_TOKEN, IM_END_TOKEN, UNK_TOKEN)
CHARACTERS = tuple(chr(code) for code in range(32, 127)) + ("\n",)
"""Printable ASCII and newline: enough for the demo task and for readable test text."""
_BYTE_LEVEL = {" ": "\u0120", "\n": "\u010a"}
"""GPT-2 byte-level symbols of the two characters it does not map to themselves (Ġ, Ċ)."""

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""ChatML as Qwen uses it, so the tiny models exercise the same template shape as real ones."""


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """A 101-token character-level tokenizer with a ChatML chat template, built in memory.

    A BPE model with no merges splits text into single characters, so any ASCII string maps to
    one token per character and the vocabulary (hence the tiny models' embedding) stays small.
    Characters outside the vocabulary become `<|unk|>` (one per UTF-8 byte) rather than failing;
    under `Qwen2Tokenizer` (below) they are dropped instead. ASCII text tokenizes identically.

    The vocabulary is written in GPT-2's byte-level alphabet (space is `Ġ`, newline `Ċ`) with a
    byte-level pre-tokenizer and decoder: transformers 5 loads a folder whose config says
    `model_type: qwen2` with its own byte-level `Qwen2Tokenizer` whatever tokenizer class the folder
    names, and only a byte-level vocabulary tokenizes the same way under both classes.
    """
    symbols = tuple(_BYTE_LEVEL.get(char, char) for char in CHARACTERS)
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS + symbols)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK_TOKEN))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=IM_END_TOKEN,
        unk_token=UNK_TOKEN,
        chat_template=CHATML_TEMPLATE,
    )
