"""The lookup task's tokenizer: 16 tokens, ChatML without newlines between turns, the whole `lookup`
call one token (built in memory).

The lookup task (`relm.rollout.multi_turn.lookup`) asks a random model to learn tool use by RL from
scratch. With the 101-token character vocabulary a Hermes call is ~50 tokens that must all be right
before the tool answers even once, which sampling never finds; here the call
`<tool_call>{"name": "lookup", "arguments": {}}</tool_call>` and each role line are single tokens, and
the rest of the vocabulary is the answer letters and the prompt's `?`. A random policy then calls the
tool in about one conversation in twelve (measured at step 1), so tool results come from the first
step, and what is left to learn is what the task is about: call, then copy the tool's letter.
"""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from relm.models.char_tokenizer import IM_END_TOKEN, IM_START_TOKEN, PAD_TOKEN, UNK_TOKEN

LOOKUP_CALL = '<tool_call>{"name": "lookup", "arguments": {}}</tool_call>'
"""The one call the task's tool takes, as Hermes writes it; one token of this vocabulary."""
LOOKUP_LETTERS = ("a", "b", "c", "d", "e", "f")
"""The letters the tool may answer with: a policy that guesses scores 1/6."""
ROLE_TOKENS = ("system\n", "user\n", "assistant\n", "tool\n")
"""A role line is one token, so a tool turn is six tokens and the tool's letter is three before the answer."""
_CHARACTERS = ("?", *LOOKUP_LETTERS)
"""The prompt's `?` and the answers (their own symbols in GPT-2's byte-level alphabet)."""
COMPACT_CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""ChatML without the newline between turns: every token of a turn is one the model reads or writes."""


def build_lookup_tokenizer() -> PreTrainedTokenizerFast:
    """The lookup task's tokenizer: pad, im_start, im_end, unk, `?`, a-f, the call and four role lines.

    Byte-level like the character tokenizer, so transformers' `Qwen2Tokenizer` (which a `qwen2` model
    folder loads whatever class it names) tokenizes the same way; the call and the role names are
    added tokens, matched in the text before the characters.
    """
    specials = (PAD_TOKEN, IM_START_TOKEN, IM_END_TOKEN, UNK_TOKEN)
    symbols = _CHARACTERS
    vocab = {token: index for index, token in enumerate(specials + symbols)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK_TOKEN))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(specials))
    backend.add_tokens([AddedToken(word, normalized=False) for word in (LOOKUP_CALL, *ROLE_TOKENS)])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=IM_END_TOKEN,
        unk_token=UNK_TOKEN,
        chat_template=COMPACT_CHATML_TEMPLATE,
    )
