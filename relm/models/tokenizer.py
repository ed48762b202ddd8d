"""Tokenizers: loading with preflight, and prompt encoding (the built-in one: `relm.models.char_tokenizer`).

Loading goes through one function so that every way a tokenizer can be unfit for RL (no pad
token, no eos, no chat template, a folder that is not there) is caught in one place and turned
into either a warning with a stated fallback or a one-line `UserError`, never a traceback deep
inside batching or generation.

The tokenizer is the class its own `tokenizer_config.json` declares, never one the model's config.json
imposes (`_declared_class_kwargs`), and a chat template that refuses a conversation is a one-line
`TemplateRefused`, not jinja's traceback.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from relm.errors import UserError
from relm.models.tokenizer_family import place_tokenizer
from relm.models.zoo import is_zoo_path, materialize_zoo

logger = logging.getLogger(__name__)


def load_tokenizer(
    path: str, *, trust_remote_code: bool = False, path_key: str = "actor_rollout_ref.model.tokenizer_path"
) -> PreTrainedTokenizerBase:
    """Load a tokenizer from a folder, a Hub id or `zoo:NAME`, then run `preflight_tokenizer`.

    Args:
        path: Local folder, Hub id, or `zoo:NAME` (materialized into the relm cache first).
        trust_remote_code: Allow tokenizer code shipped inside the folder.
        path_key: The config key the path came from, named in the error message.

    Raises:
        UserError: The path cannot be loaded as a tokenizer.
    """
    local = str(materialize_zoo(path)) if is_zoo_path(path) else path
    if _looks_local(local) and not Path(local).expanduser().is_dir():
        raise UserError(
            f"{path_key}: tokenizer folder '{path}' does not exist; point {path_key} (or "
            "actor_rollout_ref.model.path) at a folder holding tokenizer files"
        )
    local = str(Path(local).expanduser()) if _looks_local(local) else local
    declared_kwargs = _declared_class_kwargs(local)
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            local, trust_remote_code=trust_remote_code, **declared_kwargs
        )
    except Exception as exc:  # any loader failure is the path's fault from the user's side
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        raise UserError(
            f"{path_key}: cannot load a tokenizer from '{path}' ({reason}); point {path_key} "
            "(or actor_rollout_ref.model.path) at a folder holding tokenizer files, or at a Hub id "
            "that is in the local cache"
        ) from exc
    # transformers 5 builds an EMPTY tokenizer (its class from config.json, no vocabulary) for a
    # model folder that has no tokenizer files, instead of failing; every prompt then encodes to
    # nothing and the run dies deep in generation.
    if not tokenizer.encode("hello", add_special_tokens=False):
        raise UserError(
            f"{path_key}: '{path}' has no tokenizer files (the tokenizer loaded from it has no "
            "vocabulary); point it at a folder holding tokenizer.json or the model's vocab files"
        )
    if declared_kwargs:
        _warn_if_another_family(tokenizer, local, path)
    return preflight_tokenizer(tokenizer, name=path)


def _warn_if_another_family(tokenizer: PreTrainedTokenizerBase, local: str, path: str) -> None:
    """One warning when config.json is of another known family than the tokenizer and transformers would
    have loaded the tokenizer as that family's class (what relm no longer does: `_declared_class_kwargs`).

    Such a folder is a mix-up more often than a plan (a tokenizer copied beside the wrong model, as
    `examples/tiny_model.py` made before it read the family), so the user hears of it once. Combinations
    transformers itself leaves alone (Phi-4's Qwen-like tokenizer on a phi3 config) say nothing.
    """
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES

    model_type = _config_model_type(local)
    by_model = TOKENIZER_MAPPING_NAMES.get(model_type or "")
    if by_model in (None, "TokenizersBackend", "PythonBackend", "PreTrainedTokenizerFast"):
        return
    if by_model.removesuffix("Fast") == type(tokenizer).__name__.removesuffix("Fast"):
        return
    family = place_tokenizer(tokenizer.get_vocab())
    if family is None or family.model_type == model_type:
        return
    logger.warning(
        "tokenizer %s is a %s tokenizer (%s) but config.json's model_type is %s (transformers would load "
        "it as a %s); relm uses the class tokenizer_config.json declares. Check that the model and the "
        "tokenizer belong together (actor_rollout_ref.model.path, tokenizer_path)",
        path,
        family.name,
        type(tokenizer).__name__,
        model_type,
        by_model,
    )


def _declared_class_kwargs(local: str) -> dict[str, Any]:
    """`AutoTokenizer` arguments that load the class `tokenizer_config.json` declares, whatever config.json says.

    transformers 5 lets a folder's config.json overrule the tokenizer's own `tokenizer_class` for some
    model types (qwen2, phi3, ...: `MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS`): a Llama-3.2 or Gemma-2
    tokenizer beside a Qwen2 config.json loads as a Qwen2 tokenizer, whose pre-tokenizer splits numbers
    digit by digit and leaves `▁` in the text, and nothing fails (issue 37). Handing it a config with no
    model type makes it read the tokenizer as the tokenizer folder alone declares it, which is what the
    tokenizer's authors tested. A folder without a declared class (or with its own code, `auto_map`) is
    left to transformers as before.
    """
    from transformers import PretrainedConfig
    from transformers.models.auto.tokenization_auto import get_tokenizer_config

    try:
        declared_config = get_tokenizer_config(local)
    except (OSError, ValueError):
        return {}
    declared = declared_config.get("tokenizer_class")
    if not isinstance(declared, str) or "auto_map" in declared_config:
        return {}
    return {"config": PretrainedConfig()}


def _config_model_type(local: str) -> str | None:
    """config.json's `model_type` in a local folder, or None (no folder, no file, not JSON)."""
    try:
        raw = json.loads((Path(local) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    model_type = raw.get("model_type") if isinstance(raw, dict) else None
    return model_type if isinstance(model_type, str) else None


def _looks_local(path: str) -> bool:
    """A filesystem path rather than a Hub id (`org/name`), so a missing one fails without a network wait."""
    return os.path.isabs(path) or path.startswith((".", "~")) or os.path.exists(path) or path.count("/") > 1


def preflight_tokenizer(
    tokenizer: PreTrainedTokenizerBase, name: str = "tokenizer"
) -> PreTrainedTokenizerBase:
    """Make a tokenizer usable for batched RL, warning about each fallback taken.

    Batching needs a pad id; generation needs eos to stop; prompts need a chat template. None of
    their absence is fatal, so each gets a logged fallback instead of an error.

    Returns:
        The same tokenizer, with `pad_token` set if it had none.
    """
    if tokenizer.eos_token is None:
        logger.warning("tokenizer %s has no eos token: responses will only stop at max_response_length", name)
    if tokenizer.pad_token is None:
        choice = _pad_fallback(tokenizer)
        tokenizer.pad_token = choice
        logger.warning(
            "tokenizer %s has no pad token: padding with %r (id %s); padded positions are masked",
            name,
            choice,
            tokenizer.pad_token_id,
        )
    if not tokenizer.chat_template:
        logger.warning(
            "tokenizer %s has no chat template: prompts are the messages' contents joined by newlines "
            "(set actor_rollout_ref.model.custom_chat_template to use one)",
            name,
        )
    return tokenizer


def _pad_fallback(tokenizer: PreTrainedTokenizerBase) -> str:
    """The token to pad with when a tokenizer has none.

    A token the model never needs to emit is safest: one named like a pad (Llama 3's
    `<|finetune_right_pad_id|>`), then unk, then a reserved special token. Eos is the last resort
    because a pad equal to eos makes "strip trailing pads" indistinguishable from "strip eos".
    """
    eos, bos = tokenizer.eos_token, tokenizer.bos_token
    specials = [
        str(token)
        for _, token in sorted(tokenizer.added_tokens_decoder.items())
        if token.special and str(token) not in (eos, bos)
    ]
    for token in specials:
        if "pad" in token.lower():
            return token
    if tokenizer.unk_token is not None and tokenizer.unk_token != eos:
        return tokenizer.unk_token
    for token in specials:
        if "reserved" in token.lower():
            return token
    # Without even an eos, any id works as long as the mask hides it: take the first token.
    return eos if eos is not None else str(tokenizer.convert_ids_to_tokens(0))


def encode_prompt(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    custom_chat_template: str | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """Token ids of a chat prompt, ending where the assistant's reply starts.

    The ids are exactly `tokenizer.apply_chat_template(messages, add_generation_prompt=True,
    tokenize=True, **chat_template_kwargs)`, as verl renders them: the template is tokenized in one
    call, so a template that writes its own bos (Llama 3, Mistral) gets it once, where rendering to
    text and encoding that with special tokens would add a second one. Without any template the
    contents are joined by newlines and encoded as plain text (special tokens as the tokenizer adds them).

    Args:
        tokenizer: The run's tokenizer.
        messages: The row's chat messages.
        custom_chat_template: A template replacing the tokenizer's own
            (`actor_rollout_ref.model.custom_chat_template`).
        chat_template_kwargs: Extra variables for the template (`data.apply_chat_template_kwargs`),
            e.g. Llama 3's `date_string`, whose template otherwise writes today's date into every prompt.
    """
    template = custom_chat_template or tokenizer.chat_template
    if template:
        from jinja2 import TemplateError

        kwargs = {k: v for k, v in (chat_template_kwargs or {}).items() if k not in _RESERVED_TEMPLATE_KWARGS}
        try:
            # Any: transformers types every form (text, batches, BatchEncoding); one conversation gives ids.
            ids: Any = tokenizer.apply_chat_template(
                messages,
                chat_template=template,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
                **kwargs,
            )
        except TemplateError as exc:
            raise TemplateRefused(messages, exc) from exc
        if isinstance(ids, Mapping):  # a BatchEncoding where a transformers version ignores return_dict
            ids = ids["input_ids"]
        return [int(i) for i in ids]
    text = "\n".join(str(message["content"]) for message in messages)
    return list(tokenizer.encode(text, add_special_tokens=True))


class TemplateRefused(UserError):
    """The chat template raised on a conversation (its `raise_exception`: Gemma-2's "System role not
    supported", Mistral's "roles must alternate").

    verl and TRL hand the messages to `apply_chat_template` as they are and stop with jinja's traceback;
    relm does not rewrite the conversation either (folding a system message into the user turn changes
    the prompt the data asked for), it stops with one line naming the roles and the fix. The dataset
    puts the file and row in front (`prefixed`).
    """

    def __init__(self, messages: list[dict[str, Any]], exc: Exception) -> None:
        roles = ", ".join(str(message.get("role")) for message in messages)
        reason = " ".join(str(exc).split())[:200]
        self.detail = (
            f"the chat template refuses the conversation (roles: {roles}): {reason}; give a template that "
            "takes it with actor_rollout_ref.model.custom_chat_template, or rewrite the rows (e.g. move a "
            "system message's text into the first user message)"
        )
        super().__init__(self.detail)

    def prefixed(self, where: str) -> UserError:
        """The same error with `where` (file and row) in front."""
        return UserError(f"{where}: {self.detail}")


_RESERVED_TEMPLATE_KWARGS = frozenset(
    {"tokenize", "return_dict", "return_tensors", "add_generation_prompt", "chat_template"}
)
"""Arguments relm sets itself; verl drops the first three from `apply_chat_template_kwargs` the same way."""


_TURN_MARKER = "relm-end-of-turn-probe"


def end_of_turn_ids(tokenizer: PreTrainedTokenizerBase, generation_config: Any = None) -> list[int]:
    """Every token id that ends an assistant turn: eos, the generation config's eos ids, and the
    special token the chat template writes right after an assistant message.

    The end of a turn is not always `eos_token`: Phi-3's template closes a turn with `<|end|>` while its
    eos is `<|endoftext|>`, and Llama 3's closes with `<|eot_id|>`. Asking the template (render one
    assistant message and read the special token that follows its text) finds these without a table of
    families; generation_config.json adds the ids the model's authors stop on (an int or a list).

    Args:
        tokenizer: The loaded tokenizer (its chat template, if any, is rendered).
        generation_config: A `GenerationConfig`, or anything with an `eos_token_id` attribute, or None.

    Returns:
        Sorted distinct ids, empty when the tokenizer names no eos and the template writes no special token.
    """
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    config_eos = getattr(generation_config, "eos_token_id", None)
    if config_eos is not None:
        ids.update(int(i) for i in ([config_eos] if isinstance(config_eos, int) else config_eos))
    turn_end = _template_turn_end(tokenizer)
    if turn_end is not None:
        ids.add(turn_end)
    return sorted(ids)


def _template_turn_end(tokenizer: PreTrainedTokenizerBase) -> int | None:
    """The special token id the chat template writes right after an assistant message's text, if any."""
    if not tokenizer.chat_template:
        return None
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _TURN_MARKER}]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception:  # a template that refuses this shape (e.g. demands a system turn) tells us nothing
        return None
    if not isinstance(text, str) or _TURN_MARKER not in text:
        return None
    tail = text.split(_TURN_MARKER, 1)[1].lstrip(" ")
    following = tokenizer.encode(tail, add_special_tokens=False)[:1]
    if following and following[0] in set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder):
        return int(following[0])
    return None
