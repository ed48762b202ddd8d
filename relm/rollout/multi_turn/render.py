"""Tool results as token ids, as the chat template would write them after the model's turn.

The conversation so far is token ids and stays so: the model's turns are the ids it sampled, never
decoded and encoded again. A tool turn is rendered by the chat template and only the text the template
writes after the assistant's end-of-turn token is encoded, so prompt + sampled ids + these ids are the
ids of the whole conversation rendered at once (tests/unit/test_multi_turn_render.py checks it with
the real Qwen2.5 template).
"""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedTokenizerBase

from relm.errors import UserError
from relm.models.tokenizer import _RESERVED_TEMPLATE_KWARGS

_USER = "relm-user-marker"
_ASSISTANT = "relm-assistant-marker"


class ToolTurnRenderer:
    """Token ids of tool messages following an assistant turn that ended with `turn_end_id`.

    Args:
        tokenizer: The run's tokenizer (its chat template, or `chat_template`).
        turn_end_id: The special token the template writes after an assistant message's text.
        chat_template: A template replacing the tokenizer's own.
        chat_template_kwargs: Extra template variables (`data.apply_chat_template_kwargs`), tools included.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        turn_end_id: int,
        chat_template: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.turn_end_id = turn_end_id
        self.template = chat_template or tokenizer.chat_template
        if not self.template:
            raise UserError(
                "actor_rollout_ref.rollout.multi_turn.enable=true needs a chat template with a tool role; "
                "the tokenizer has none (set actor_rollout_ref.model.custom_chat_template)"
            )
        self.kwargs = {
            k: v for k, v in (chat_template_kwargs or {}).items() if k not in _RESERVED_TEMPLATE_KWARGS
        }
        turn_end_text = tokenizer.convert_ids_to_tokens(turn_end_id)
        assert isinstance(turn_end_text, str), "one id converts to one token"
        self.turn_end_text = turn_end_text
        base = [{"role": "user", "content": _USER}, {"role": "assistant", "content": _ASSISTANT}]
        self._base = base
        prefix = self._render(base, add_generation_prompt=False)
        end = prefix.find(self.turn_end_text, prefix.rfind(_ASSISTANT))
        if end < 0:
            raise UserError(
                f"the chat template does not write {self.turn_end_text!r} after an assistant message; multi-turn "
                "rollouts need the turn's end token in the template"
            )
        self._cut = end + len(self.turn_end_text)
        self._prefix = prefix[: self._cut]

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        text = self.tokenizer.apply_chat_template(
            messages,
            chat_template=self.template,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **self.kwargs,
        )
        assert isinstance(text, str)
        return text

    def suffix_text(self, tool_texts: list[str], role: str = "tool") -> str:
        """What the template writes after the assistant's end-of-turn token: the tool messages (or, with
        `role="user"`, an interaction's reply) and the next assistant turn's header."""
        messages = self._base + [{"role": role, "content": text} for text in tool_texts]
        try:
            full = self._render(messages, add_generation_prompt=True)
        except Exception as exc:  # a Jinja `raise_exception` for an unknown role
            raise UserError(
                f"the chat template cannot render a `{role}` message ({exc}); multi-turn rollouts need a "
                f"template with a {role} role (actor_rollout_ref.model.custom_chat_template)"
            ) from exc
        if not full.startswith(self._prefix):
            raise UserError(
                "the chat template renders earlier turns differently once a tool message follows; relm cannot "
                "append tool results as token ids without re-tokenizing (use a template whose turns are stable)"
            )
        return full[self._cut :]

    def suffix_ids(self, tool_texts: list[str], role: str = "tool") -> list[int]:
        """Token ids of `suffix_text`, encoded without special tokens added (the template wrote them)."""
        return list(self.tokenizer.encode(self.suffix_text(tool_texts, role), add_special_tokens=False))
