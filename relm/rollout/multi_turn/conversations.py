"""What a multi-turn rollout returns: the packed conversations, one record per conversation, and the
step's metrics as a pure function of those records.

The metrics are computed from the records and nothing else, so a data-parallel rollout
(relm/distributed/multi_turn.py), whose ranks each run a share of the conversations, gathers the
records with the conversations and gets exactly the metrics one process computes over the same batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from relm.rollout.base import GenerationOutput, SamplingParams
from relm.rollout.multi_turn.tools import ToolResult


@dataclass(frozen=True)
class ConversationRecord:
    """What one conversation did, as its step's metrics count it."""

    assistant_turns: int
    """Model turns."""
    user_turns: int
    """Tool and interaction turns appended (verl counts both as user turns)."""
    model_tokens: int
    """Response tokens the model sampled."""
    tool_tokens: int
    """Response tokens the tool and user turns added."""
    tool_calls: int = 0
    tool_errors: int = 0
    """Calls that failed: bad JSON, an unknown tool, a tool's exception or error (timeouts included)."""
    tool_timeouts: int = 0
    tool_seconds: float = 0.0
    """Every call's seconds added up."""
    tool_wait_seconds: float = 0.0
    """Seconds the conversation waited on its calls: per turn its slowest call (verl's `agent_loop/tool_calls`)."""
    tool_reward: float = 0.0
    """The tools' own rewards, added up."""
    tool_metrics: tuple[tuple[str, float], ...] = ()
    """Every number each call returned in its metrics, (name, value), in call order."""
    interaction_replies: int | None = None
    """User turns an interaction wrote; None when the rollout has no interactions."""
    interaction_score: float = 0.0
    """The interaction's last turn score (0 where none came)."""

    @property
    def num_turns(self) -> int:
        """verl's count (`user_turns + assistant_turns + 1`): the prompt, each model turn and each tool turn."""
        return self.user_turns + self.assistant_turns + 1


@dataclass
class MultiTurnOutput:
    """The rollout, one record per conversation (in the generation's row order) and their metrics."""

    generation: GenerationOutput
    """`response_mask` 1 on every response token; `model_mask` 1 on the sampled ones."""
    metrics: dict[str, float]
    """`multi_turn_metrics(records)`."""
    records: list[ConversationRecord] = field(default_factory=list)


class ConversationRollout(Protocol):
    """What the trainer drives conversations through: `MultiTurnRollout` in one process,
    `DataParallelMultiTurn` over several."""

    @property
    def schemas(self) -> list[dict[str, Any]]: ...

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        tools_kwargs: list[dict[str, Any]] | None = None,
        interaction_kwargs: list[dict[str, Any]] | None = None,
        messages: list[list[dict[str, Any]]] | None = None,
    ) -> MultiTurnOutput: ...


def row_kwargs(extra_infos: Sequence[Mapping[str, Any] | None]) -> dict[str, list[dict[str, Any]]]:
    """`generate`'s per-prompt `tools_kwargs` and `interaction_kwargs`, from each row's `extra_info` (verl's
    places for them; a row without them gets {})."""
    infos = [info or {} for info in extra_infos]
    return {
        "tools_kwargs": [dict(info.get("tools_kwargs") or {}) for info in infos],
        "interaction_kwargs": [dict(info.get("interaction_kwargs") or {}) for info in infos],
    }


@dataclass
class _Calls:
    calls: int = 0
    errors: int = 0
    timeouts: int = 0
    seconds: float = 0.0
    wait_seconds: float = 0.0
    reward: float = 0.0
    metrics: list[tuple[str, float]] = field(default_factory=list)


class ToolCallTally:
    """Per conversation, its tool calls as they finish, turn by turn (the driver's running count)."""

    def __init__(self) -> None:
        self._rows: dict[int, _Calls] = {}
        self._turn_seconds: dict[int, float] = {}

    def record(self, row: int, result: ToolResult, seconds: float) -> None:
        # A row's calls of one turn run concurrently: the turn waits for the slowest.
        self._turn_seconds[row] = max(self._turn_seconds.get(row, 0.0), seconds)
        calls = self._rows.setdefault(row, _Calls())
        calls.calls += 1
        calls.errors += result.error is not None
        calls.timeouts += result.error == "timeout"
        calls.seconds += seconds
        calls.reward += result.reward
        calls.metrics += [(key, float(value)) for key, value in result.metrics.items()]

    def end_turn(self) -> None:
        for row, seconds in self._turn_seconds.items():
            self._rows[row].wait_seconds += seconds
        self._turn_seconds.clear()

    def record_of(
        self,
        row: int,
        *,
        assistant_turns: int,
        user_turns: int,
        model_tokens: int,
        tool_tokens: int,
        interaction_replies: int | None = None,
        interaction_score: float = 0.0,
    ) -> ConversationRecord:
        """Row `row`'s record: its calls from this tally, the rest as given."""
        calls = self._rows.get(row, _Calls())
        return ConversationRecord(
            assistant_turns=assistant_turns,
            user_turns=user_turns,
            model_tokens=model_tokens,
            tool_tokens=tool_tokens,
            tool_calls=calls.calls,
            tool_errors=calls.errors,
            tool_timeouts=calls.timeouts,
            tool_seconds=calls.seconds,
            tool_wait_seconds=calls.wait_seconds,
            tool_reward=calls.reward,
            tool_metrics=tuple(calls.metrics),
            interaction_replies=interaction_replies,
            interaction_score=interaction_score,
        )


def multi_turn_metrics(records: Sequence[ConversationRecord]) -> dict[str, float]:
    """The step's multi-turn metrics (docs/multi_turn.md) over `records`, under verl's names where verl
    has them: `num_turns/*` (trainer/ppo/metric_utils.py) and the agent loop's tool timer,
    `agent_loop/tool_calls/*`, seconds per conversation (experimental/agent_loop/agent_loop.py)."""
    num = max(len(records), 1)
    per_call: dict[str, list[float]] = {}
    for record in records:
        for key, value in record.tool_metrics:
            per_call.setdefault(key, []).append(value)
    turns = [r.num_turns for r in records] or [0]
    waits = [r.tool_wait_seconds for r in records] or [0.0]
    metrics = {f"multi_turn/tool/{k}/mean": sum(v) / len(v) for k, v in per_call.items()} | {
        "num_turns/min": float(min(turns)),
        "num_turns/max": float(max(turns)),
        "num_turns/mean": sum(turns) / len(turns),
        "agent_loop/tool_calls/min": min(waits),
        "agent_loop/tool_calls/max": max(waits),
        "agent_loop/tool_calls/mean": sum(waits) / len(waits),
        "multi_turn/assistant_turns/mean": sum(r.assistant_turns for r in records) / num,
        "multi_turn/assistant_turns/max": float(max((r.assistant_turns for r in records), default=0)),
        "multi_turn/tool_calls/mean": sum(r.tool_calls for r in records) / num,
        "multi_turn/tool_errors": float(sum(r.tool_errors for r in records)),
        "multi_turn/tool_timeouts": float(sum(r.tool_timeouts for r in records)),
        "multi_turn/tool_time_s": sum(r.tool_seconds for r in records),
        "multi_turn/tool_reward/mean": sum(r.tool_reward for r in records) / num,
        "multi_turn/model_tokens/mean": sum(r.model_tokens for r in records) / num,
        "multi_turn/tool_tokens/mean": sum(r.tool_tokens for r in records) / num,
    }
    talked = [r for r in records if r.interaction_replies is not None]
    if talked:
        metrics["multi_turn/interaction_turns/mean"] = sum(r.interaction_replies or 0 for r in talked) / num
        metrics["multi_turn/interaction_score/mean"] = sum(r.interaction_score for r in talked) / num
    return metrics
