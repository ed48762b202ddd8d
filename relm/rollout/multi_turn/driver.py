"""The multi-turn loop: sample a turn, run the tools it calls, append their results as ids, repeat.

Every conversation is a list of token ids from its prompt on. Each turn the engine continues the
conversations still open from their own ids (one `generate` call over all of them, so any engine
works); the ids it samples are appended as they are (mask 1), tool results as the chat template's
ids (mask 0). A row ends when its turn has no tool call, ends in a token other than the template's
turn end, reaches a turn limit, or its response would pass `max_new_tokens` (tool ids included).
With interactions (interactions.py), a turn without a call goes to the row's scripted user instead,
whose reply is appended as the template's user turn (mask 0) and who may end the conversation.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from relm.rollout.base import FINISH_LENGTH, FINISH_STOP, GenerationOutput, RolloutEngine, SamplingParams
from relm.rollout.multi_turn.conversations import (
    ConversationRecord,
    MultiTurnOutput,
    ToolCallTally,
    multi_turn_metrics,
)
from relm.rollout.multi_turn.hermes import ToolCall, parse_tool_calls
from relm.rollout.multi_turn.interactions import InteractionReply, InteractionRunner, InteractionSession
from relm.rollout.multi_turn.render import ToolTurnRenderer
from relm.rollout.multi_turn.tools import Tool, ToolContext, ToolResult, run_tool

TRUNCATE_SIDES = ("left", "right", "middle")


@dataclass(frozen=True)
class MultiTurnLimits:
    """verl's `rollout.multi_turn.*` limits."""

    max_assistant_turns: int | None = None
    """Model turns per conversation; None: until the response length runs out."""
    max_user_turns: int | None = None
    """Tool (user-side) turns per conversation; None: no limit."""
    max_parallel_calls: int = 1
    """Calls run from one turn; later ones are dropped."""
    max_tool_response_length: int = 256
    """Characters of one tool result the model reads (verl counts characters)."""
    tool_response_truncate_side: str = "middle"
    """Which part of a long result is cut: left, right or middle."""


@dataclass
class _Conversation:
    ids: list[int]
    response: list[int] = field(default_factory=list)
    model_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    assistant_turns: int = 0
    user_turns: int = 0
    last_turn: list[int] = field(default_factory=list)
    """The ids sampled in the latest turn, read for tool calls."""
    tool_rewards: list[float] = field(default_factory=list)
    finish: str | None = None


class MultiTurnRollout:
    """Runs conversations with `tools` through any `RolloutEngine`.

    Args:
        engine: The rollout engine; its `eos_token_ids` must include the template's turn end.
        tokenizer: Decodes each turn to find its tool calls (the ids themselves are kept).
        renderer: Renders tool results as ids.
        tools: Tools by name.
        limits: Turn and result limits.
        pad_token_id: Padding of the returned tensors.
        interactions: Scripted users (`multi_turn.interaction_config_path`), or None.
    """

    def __init__(
        self,
        engine: RolloutEngine,
        tokenizer: PreTrainedTokenizerBase,
        renderer: ToolTurnRenderer,
        tools: dict[str, Tool],
        limits: MultiTurnLimits,
        pad_token_id: int,
        interactions: InteractionRunner | None = None,
    ) -> None:
        self.engine, self.tokenizer, self.renderer = engine, tokenizer, renderer
        self.tools, self.limits, self.pad_token_id = tools, limits, pad_token_id
        self.interactions = interactions

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """The tools' function schemas, which the chat template lists in every prompt."""
        return [tool.schema for tool in self.tools.values()]

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        tools_kwargs: list[dict[str, Any]] | None = None,
        interaction_kwargs: list[dict[str, Any]] | None = None,
        messages: list[list[dict[str, Any]]] | None = None,
    ) -> MultiTurnOutput:
        """`params.n` conversations per prompt, grouped prompt by prompt as engines return them;
        `tools_kwargs[i]`: prompt i's `extra_info.tools_kwargs` (by tool name); with interactions,
        `interaction_kwargs[i]` its `extra_info.interaction_kwargs` and `messages[i]` its chat messages."""
        rows = [_Conversation(ids=list(p)) for p in prompts for _ in range(params.n)]
        row_kwargs = [k for k in (tools_kwargs or [{}] * len(prompts)) for _ in range(params.n)]
        sessions = self._open_sessions(len(prompts), params.n, interaction_kwargs, messages)
        stats = ToolCallTally()
        turn = 0
        while open_rows := [i for i, r in enumerate(rows) if r.finish is None]:
            self._sample_turn(rows, open_rows, params, turn)
            for i in open_rows if sessions else []:
                sessions[i].messages.append({"role": "assistant", "content": self._text(rows[i].last_turn)})
            calling = self._calls_of(rows, open_rows, answering=bool(sessions))
            results = asyncio.run(self._run_calls(calling, row_kwargs, stats))
            stats.end_turn()
            for i, outcomes in results.items():
                rows[i].tool_rewards += [r.reward for r in outcomes]
                self._append_tool_turn(rows[i], outcomes, params.max_new_tokens)
                if sessions:
                    sessions[i].messages += [{"role": "tool", "content": r.text} for r in outcomes]
            asking = [i for i in open_rows if sessions and rows[i].finish is None and i not in calling]
            if asking and self.interactions is not None:
                replies = self.interactions.respond({i: sessions[i] for i in asking})
                for i, reply in replies.items():
                    self._append_user_turn(rows[i], reply, params.max_new_tokens)
            turn += 1
        if sessions and self.interactions is not None:
            self.interactions.close(sessions)
        for tool in self.tools.values():  # once a step: the Python tool's weak-mode warning
            end_step = getattr(tool, "end_step", None)
            if callable(end_step):
                end_step()
        records = [_record(i, row, stats, sessions[i] if sessions else None) for i, row in enumerate(rows)]
        # verl's `turn_scores`, `tool_rewards` and `num_turns` (its NaiveRewardManager) reach the reward
        # function in `extra_info`.
        extra = [
            {
                "turn_scores": sessions[i].turn_scores if sessions else [],
                "tool_rewards": row.tool_rewards,
                "num_turns": records[i].num_turns,
            }
            for i, row in enumerate(rows)
        ]
        generation = self._pack(rows, params.max_new_tokens, extra)
        return MultiTurnOutput(generation, multi_turn_metrics(records), records)

    def _open_sessions(
        self,
        num_prompts: int,
        n: int,
        interaction_kwargs: list[dict[str, Any]] | None,
        messages: list[list[dict[str, Any]]] | None,
    ) -> list[InteractionSession]:
        if self.interactions is None:
            return []
        kwargs = [k for k in (interaction_kwargs or [{}] * num_prompts) for _ in range(n)]
        prompts = [m for m in (messages or [[]] * num_prompts) for _ in range(n)]
        return self.interactions.open(kwargs, prompts)

    def _text(self, ids: list[int]) -> str:
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        assert isinstance(text, str), "one sequence decodes to one string"
        return text

    def _sample_turn(
        self, rows: list[_Conversation], open_rows: list[int], params: SamplingParams, turn: int
    ) -> None:
        room = [params.max_new_tokens - len(rows[i].response) for i in open_rows]
        seed = None if params.seed is None else params.seed + 7919 * turn
        gen = self.engine.generate(
            [rows[i].ids for i in open_rows], replace(params, n=1, max_new_tokens=max(room), seed=seed)
        )
        for k, i in enumerate(open_rows):
            row = rows[i]
            length = min(int(gen.response_mask[k].sum()), room[k])
            sampled = gen.response_ids[k, :length].tolist()
            row.ids += sampled
            row.response += sampled
            row.model_mask += [1] * length
            row.logprobs += gen.logprobs[k, :length].float().tolist()
            row.assistant_turns += 1
            if length < int(gen.response_mask[k].sum()) or gen.finish_reasons[k] == FINISH_LENGTH:
                row.finish = FINISH_LENGTH
            elif not sampled or sampled[-1] != self.renderer.turn_end_id:
                row.finish = FINISH_STOP  # ended by eos, not by the template's turn end: the answer is final
            row.last_turn = sampled

    def _calls_of(
        self, rows: list[_Conversation], open_rows: list[int], answering: bool = False
    ) -> dict[int, list[ToolCall]]:
        """The calls of each open row's latest turn; a row without calls ends, unless `answering`
        (an interaction replies to it)."""
        calling: dict[int, list[ToolCall]] = {}
        for i in open_rows:
            row = rows[i]
            if row.finish is not None:
                continue
            calls = parse_tool_calls(self._text(row.last_turn))
            over_turns = (
                self.limits.max_assistant_turns is not None
                and row.assistant_turns >= self.limits.max_assistant_turns
            )
            over_user = (
                self.limits.max_user_turns is not None and row.user_turns >= self.limits.max_user_turns
            )
            if over_turns or over_user or not (calls or answering):
                row.finish = FINISH_STOP
                continue
            if calls:
                calling[i] = calls[: self.limits.max_parallel_calls]
        return calling

    async def _run_calls(
        self, calling: dict[int, list[ToolCall]], row_kwargs: list[dict[str, Any]], stats: ToolCallTally
    ) -> dict[int, list[ToolResult]]:
        async def one(i: int, call: ToolCall) -> ToolResult:
            started = time.monotonic()
            if call.error is not None:
                result = ToolResult(f"error: {call.error}", error="bad_call")
            elif call.name not in self.tools:
                known = ", ".join(sorted(self.tools))
                result = ToolResult(
                    f"error: no tool named {call.name!r}; tools: {known}", error="unknown_tool"
                )
            else:
                kwargs = (row_kwargs[i] or {}).get(call.name) or {}
                result = await run_tool(
                    self.tools[call.name], call.arguments, ToolContext(row=i, kwargs=kwargs)
                )
            stats.record(i, result, time.monotonic() - started)
            return result

        keys = [(i, call) for i, calls in calling.items() for call in calls]
        done = await asyncio.gather(*(one(i, call) for i, call in keys))
        results: dict[int, list[ToolResult]] = {i: [] for i in calling}
        for (i, _), result in zip(keys, done, strict=True):
            results[i].append(result)
        return results

    def _append_tool_turn(self, row: _Conversation, outcomes: list[ToolResult], max_new_tokens: int) -> None:
        texts = [
            truncate_text(
                r.text, self.limits.max_tool_response_length, self.limits.tool_response_truncate_side
            )
            for r in outcomes
        ]
        if not self._append_unsampled(row, self.renderer.suffix_ids(texts), max_new_tokens):
            row.finish = FINISH_LENGTH  # no room for the results and a reply: the conversation ends here

    def _append_user_turn(self, row: _Conversation, reply: InteractionReply, max_new_tokens: int) -> None:
        """The interaction's reply as the template's user turn; appended even when it ends the episode,
        as verl does, so the reward function and the samples see the verdict."""
        appended = self._append_unsampled(
            row, self.renderer.suffix_ids([reply.text], role="user"), max_new_tokens
        )
        if reply.should_terminate:
            row.finish = FINISH_STOP
        elif not appended:
            row.finish = FINISH_LENGTH

    @staticmethod
    def _append_unsampled(row: _Conversation, suffix: list[int], max_new_tokens: int) -> bool:
        """Append a tool or user turn's ids (mask 0, logprob 0) and count the turn; False, appending nothing,
        when they would leave no room under `max_new_tokens` for the model's reply."""
        if len(row.response) + len(suffix) >= max_new_tokens:
            return False
        row.ids += suffix
        row.response += suffix
        row.model_mask += [0] * len(suffix)
        row.logprobs += [0.0] * len(suffix)
        row.user_turns += 1
        return True

    def _pack(
        self, rows: list[_Conversation], width: int, extra: list[dict[str, Any]] | None = None
    ) -> GenerationOutput:
        num_rows = len(rows)
        ids = torch.full((num_rows, width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((num_rows, width), dtype=torch.long)
        model_mask = torch.zeros((num_rows, width), dtype=torch.long)
        logprobs = torch.zeros((num_rows, width), dtype=torch.float32)
        for i, row in enumerate(rows):
            n = len(row.response)
            ids[i, :n] = torch.tensor(row.response, dtype=torch.long)
            mask[i, :n] = 1
            model_mask[i, :n] = torch.tensor(row.model_mask, dtype=torch.long)
            logprobs[i, :n] = torch.tensor(row.logprobs, dtype=torch.float32)
        return GenerationOutput(
            ids,
            mask,
            logprobs,
            [r.finish or FINISH_STOP for r in rows],
            model_mask=model_mask,
            extra_fields=extra,
        )


def _record(
    i: int, row: _Conversation, stats: ToolCallTally, session: InteractionSession | None
) -> ConversationRecord:
    """Conversation `i`'s record, from which the step's metrics are computed (conversations.py)."""
    model_tokens = sum(row.model_mask)
    return stats.record_of(
        i,
        assistant_turns=row.assistant_turns,
        user_turns=row.user_turns,
        model_tokens=model_tokens,
        tool_tokens=len(row.response) - model_tokens,
        interaction_replies=None if session is None else session.replies,
        interaction_score=session.turn_scores[-1] if session is not None and session.turn_scores else 0.0,
    )


def truncate_text(text: str, limit: int, side: str) -> str:
    """`text` cut to `limit` characters (verl's `max_tool_response_length`), keeping the `side` not cut."""
    if len(text) <= limit:
        return text
    marker = "...(truncated)"
    if side == "left":
        return marker + text[-limit:]
    if side == "right":
        return text[:limit] + marker
    half = limit // 2
    return text[:half] + marker + text[len(text) - (limit - half) :]
