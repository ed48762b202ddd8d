"""The tokenizer facts `relm compat` reports per model: what relm pads with, what ends a turn, what the
chat template renders, and whether every token has an embedding row.

These are where a user's real checkpoint differs from a home-made stand-in (issue 15): families that
name no pad token (Llama 3, Mistral-Nemo), a turn that ends on a token other than eos (Phi-3's
`<|end|>`), templates that write their own bos, tokenizers shorter than the embedding (Qwen2.5: 151,665
tokens, 151,936 rows). Each fact is read from the tokenizer, its chat template and
generation_config.json through the functions training uses (`encode_prompt`, `end_of_turn_ids`), so the
report says what a run would do, not what a table of families expects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedTokenizerBase

from relm.models.tokenizer import encode_prompt, end_of_turn_ids

__all__ = [
    "MARKDOWN_HEADER",
    "PROBE_CONVERSATION",
    "TokenizerFacts",
    "facts_lines",
    "markdown_row",
    "tokenizer_facts",
]

PROBE_CONVERSATION = [{"role": "user", "content": "What is 2 + 3?"}]
"""The one-message conversation rendered to show the template (with the generation prompt)."""


@dataclass
class TokenizerFacts:
    """What one model's tokenizer gave relm."""

    tokenizer_class: str
    """The class relm loaded: the one tokenizer_config.json declares, whatever the model's config.json says
    (`relm.models.tokenizer.load_tokenizer`; plain `AutoTokenizer` on the model folder can differ)."""
    length: int
    """`len(tokenizer)`: base vocabulary plus added tokens."""
    embedding_rows: int | None
    """Rows of the input embedding (config's vocab_size; the load stage puts in the built model's)."""
    pad_token: str | None
    pad_token_id: int | None
    pad_chosen_by_relm: bool
    """True when the tokenizer named no pad token and the preflight picked this one."""
    bos_token: str | None
    bos_token_id: int | None
    eos_token: str | None
    eos_token_id: int | None
    generation_config_eos_ids: list[int] = field(default_factory=list)
    """generation_config.json's eos_token_id (an int or a list there), empty without one."""
    end_of_turn_ids: list[int] = field(default_factory=list)
    """Every id that ends a response: eos, generation-config eos, the template's turn end."""
    end_of_turn_tokens: list[str] = field(default_factory=list)
    chat_template: bool = False
    rendered: str | None = None
    """`PROBE_CONVERSATION` rendered with the generation prompt, as text."""
    prompt_tokens: int | None = None
    """Length of the prompt ids relm feeds the model for `PROBE_CONVERSATION`."""
    prompt_matches_template: bool | None = None
    """Those ids equal `apply_chat_template(..., tokenize=True)`'s (a doubled bos would break this)."""
    template_error: str | None = None
    """Why the template could not render `PROBE_CONVERSATION`, if it could not."""

    @property
    def unreachable_rows(self) -> int | None:
        """Embedding rows no token maps to (sampling must never pick them), negative when short."""
        return None if self.embedding_rows is None else self.embedding_rows - self.length


def tokenizer_facts(
    tokenizer: PreTrainedTokenizerBase,
    *,
    embedding_rows: int | None,
    generation_config: Any = None,
    pad_chosen_by_relm: bool = False,
) -> TokenizerFacts:
    """Read the facts off a tokenizer that has been through `preflight_tokenizer`.

    Args:
        tokenizer: The loaded tokenizer, pad already chosen.
        embedding_rows: The model's embedding rows (config vocab_size), None when unknown.
        generation_config: The model's `GenerationConfig` (or anything with `eos_token_id`), or None.
        pad_chosen_by_relm: Whether the preflight chose the pad token.
    """
    config_eos = getattr(generation_config, "eos_token_id", None)
    turn_ids = end_of_turn_ids(tokenizer, generation_config)
    facts = TokenizerFacts(
        tokenizer_class=type(tokenizer).__name__,
        length=len(tokenizer),
        embedding_rows=embedding_rows,
        pad_token=_text(tokenizer.pad_token),
        pad_token_id=tokenizer.pad_token_id,
        pad_chosen_by_relm=pad_chosen_by_relm,
        bos_token=_text(tokenizer.bos_token),
        bos_token_id=tokenizer.bos_token_id,
        eos_token=_text(tokenizer.eos_token),
        eos_token_id=tokenizer.eos_token_id,
        generation_config_eos_ids=[]
        if config_eos is None
        else sorted({int(i) for i in _as_list(config_eos)}),
        end_of_turn_ids=turn_ids,
        end_of_turn_tokens=[str(token) for token in tokenizer.convert_ids_to_tokens(turn_ids)],
        chat_template=bool(tokenizer.chat_template),
    )
    try:
        ids = encode_prompt(tokenizer, PROBE_CONVERSATION)
        facts.prompt_tokens = len(ids)
        if tokenizer.chat_template:
            facts.rendered = str(
                tokenizer.apply_chat_template(PROBE_CONVERSATION, add_generation_prompt=True, tokenize=False)
            )
            templated: Any = tokenizer.apply_chat_template(
                PROBE_CONVERSATION, add_generation_prompt=True, tokenize=True
            )
            templated = templated["input_ids"] if not isinstance(templated, list) else templated
            facts.prompt_matches_template = list(templated) == ids
    except Exception as exc:  # noqa: BLE001 - a template that cannot render is the fact to report
        facts.template_error = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
    return facts


def _text(token: Any) -> str | None:
    return None if token is None else str(token)


def _as_list(value: Any) -> list[int]:
    return [value] if isinstance(value, int) else list(value)


def _token(token: str | None, token_id: int | None) -> str:
    return "none" if token is None else f"{token!r} ({token_id})"


def facts_lines(facts: TokenizerFacts) -> list[str]:
    """The facts as short lines for the console."""
    rows = "?" if facts.embedding_rows is None else f"{facts.embedding_rows:,}"
    spare = facts.unreachable_rows
    spare_note = (
        "" if not spare else f" ({spare:,} rows no token reaches)" if spare > 0 else " (TOO FEW ROWS)"
    )
    pad_from = (
        "chosen by relm: the tokenizer names none" if facts.pad_chosen_by_relm else "from the tokenizer"
    )
    turn = ", ".join(
        f"{t!r} ({i})" for t, i in zip(facts.end_of_turn_tokens, facts.end_of_turn_ids, strict=True)
    )
    lines = [
        f"tokenizer {facts.tokenizer_class}: {facts.length:,} tokens, {rows} embedding rows{spare_note}",
        f"pad {_token(facts.pad_token, facts.pad_token_id)} {pad_from}",
        f"bos {_token(facts.bos_token, facts.bos_token_id)}; eos {_token(facts.eos_token, facts.eos_token_id)}; "
        f"generation_config eos {facts.generation_config_eos_ids or 'none'}",
        f"a response ends at: {turn or 'nothing (only max_response_length)'}",
    ]
    if facts.template_error:
        lines.append(f"chat template FAILS to render one user message: {facts.template_error}")
    elif facts.chat_template:
        same = "equal" if facts.prompt_matches_template else "DIFFER from"
        lines.append(
            f"chat template renders one user message as {facts.rendered!r}: {facts.prompt_tokens} prompt ids, "
            f"which {same} apply_chat_template(tokenize=True)'s"
        )
    else:
        lines.append(f"no chat template: prompts are plain text ({facts.prompt_tokens} ids for one message)")
    return lines


MARKDOWN_HEADER = [
    "model",
    "tokenizer",
    "tokens / embedding rows",
    "pad",
    "bos",
    "eos",
    "generation_config eos",
    "ends a turn",
    "one user message, rendered",
    "prompt ids = template ids",
]


def markdown_row(model: str, facts: TokenizerFacts) -> list[str]:
    """One row of the facts table (docs/models.md and compat.md)."""
    rows = "?" if facts.embedding_rows is None else f"{facts.embedding_rows:,}"
    pad = _token(facts.pad_token, facts.pad_token_id) + (
        " chosen by relm" if facts.pad_chosen_by_relm else ""
    )
    if facts.template_error:
        rendered = f"FAILS: {facts.template_error}"
    elif facts.rendered is not None:
        rendered = "`" + facts.rendered.replace("\n", "\\n").replace("`", "'") + "`"
    else:
        rendered = "no template (plain text)"
    return [
        model,
        facts.tokenizer_class,
        f"{facts.length:,} / {rows}",
        pad,
        _token(facts.bos_token, facts.bos_token_id),
        _token(facts.eos_token, facts.eos_token_id),
        ", ".join(map(str, facts.generation_config_eos_ids)) or "none",
        ", ".join(f"{t} ({i})" for t, i in zip(facts.end_of_turn_tokens, facts.end_of_turn_ids, strict=True)),
        rendered,
        {True: "yes", False: "NO", None: "-"}[facts.prompt_matches_template],
    ]
