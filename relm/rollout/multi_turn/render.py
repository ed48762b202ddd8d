"""Tool results as token ids, as the chat template would write them after the model's turn.

The conversation so far is token ids and stays so: the model's turns are the ids it sampled, never
decoded and encoded again. A tool turn is rendered by the chat template and only the text the template
writes after the assistant's end-of-turn token is encoded, so prompt + sampled ids + these ids are the
ids of the whole conversation rendered at once (tests/unit/test_multi_turn_pieces.py checks it with
the real Qwen2.5 and Llama-3.2 templates).

A template can accept a role and still not show it to the model: Phi-3's writes nothing for a `tool`
message, so the model would never read a tool's result. Before a role's first use the renderer renders
two marker messages in it and stops the run unless both markers come out, in order.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from transformers import PreTrainedTokenizerBase

from relm.errors import UserError
from relm.models.tokenizer import _RESERVED_TEMPLATE_KWARGS

_USER = "relm-user-marker"
_ASSISTANT = "relm-assistant-marker"
_PROBES = ("relmprobefirst", "relmprobesecond")
"""Letters only, so that a template's JSON-quoting (Llama-3.2's of a tool result) or trimming keeps them."""
_PROBE_CALL_ID = "relmcall0"
"""Nine letters and digits: Mistral's template renders a tool result only with an id of that shape."""
_FIX = "set actor_rollout_ref.model.custom_chat_template to a template with a {role} role"


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
        # Llama-3.2's template writes today's date (transformers' `strftime_now`) into the system turn.
        # The renderer compares every rendering's earlier turns with the ones it rendered here, so its
        # clock stops now: a run that passes midnight renders the same earlier turns. The date lies
        # before the assistant's turn end, in the part that is cut off, never in the ids appended.
        now = datetime.now()
        self.kwargs.setdefault("strftime_now", now.strftime)
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
        self._checked_roles: set[str] = set()

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

    def check_role(self, role: str) -> None:
        """Stop with a `UserError` unless the template shows the model every `role` message after an
        assistant turn: markers rendered in that role (two tool results, as one turn's calls give, or
        one user reply) must all come out, in order."""
        if role in self._checked_roles:
            return
        probes = _PROBES if role == "tool" else _PROBES[:1]
        suffix = self._suffix(list(probes), role)
        found = 0
        for probe in probes:
            found = suffix.find(probe, found)
            if found < 0:
                raise UserError(
                    f"the chat template drops or mangles a `{role}` message after an assistant turn (it wrote "
                    f"{suffix!r} for {len(probes)} of them), so the model would never read it; "
                    f"{_FIX.format(role=role)}"
                )
        self._checked_roles.add(role)

    def _suffix(self, texts: list[str], role: str) -> str:
        messages = self._base + [{"role": role, "content": text} for text in texts]
        try:
            full = self._render(messages, add_generation_prompt=True)
        except Exception as exc:  # a Jinja `raise_exception` for an unknown role
            if role == "tool" and self._renders_with_call_ids(messages):
                raise UserError(
                    f"the chat template renders a `tool` message only with a tool call id ({exc}), as "
                    "Mistral's [TOOL_CALLS]/[TOOL_RESULTS] format does; relm parses Hermes-format calls "
                    "(actor_rollout_ref.rollout.multi_turn.format=hermes, as verl), which carry no ids: "
                    f"{_FIX.format(role='tool')} that needs no call ids (Hermes-style, as Qwen2.5's)"
                ) from exc
            raise UserError(
                f"the chat template cannot render a `{role}` message ({exc}); multi-turn rollouts need a "
                f"template with a {role} role; {_FIX.format(role=role)}"
            ) from exc
        if not full.startswith(self._prefix):
            raise UserError(
                f"the chat template renders earlier turns differently once a `{role}` message follows; relm "
                "cannot append it as token ids without re-tokenizing the conversation; "
                f"{_FIX.format(role=role)} whose earlier turns stay as they were"
            )
        return full[self._cut :]

    def _renders_with_call_ids(self, messages: list[dict[str, Any]]) -> bool:
        """Whether the template renders the tool messages once the assistant's call and each result
        carry a call id (Mistral's shape)."""
        call = {"id": _PROBE_CALL_ID, "type": "function", "function": {"name": "f", "arguments": {}}}
        with_ids = [messages[0], {"role": "assistant", "tool_calls": [call]}] + [
            {**m, "tool_call_id": _PROBE_CALL_ID} for m in messages[2:]
        ]
        try:
            self._render(with_ids, add_generation_prompt=True)
        except Exception:  # noqa: BLE001 - any failure means ids are not the missing piece
            return False
        return True

    def suffix_text(self, tool_texts: list[str], role: str = "tool") -> str:
        """What the template writes after the assistant's end-of-turn token: the tool messages (or, with
        `role="user"`, an interaction's reply) and the next assistant turn's header."""
        self.check_role(role)
        return self._suffix(tool_texts, role)

    def suffix_ids(self, tool_texts: list[str], role: str = "tool") -> list[int]:
        """Token ids of `suffix_text`, encoded without special tokens added (the template wrote them)."""
        return list(self.tokenizer.encode(self.suffix_text(tool_texts, role), add_special_tokens=False))
