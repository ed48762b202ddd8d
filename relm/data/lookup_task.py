"""The lookup task's answer check (docs/multi_turn.md), apart from its tool and files
(`relm.rollout.multi_turn.lookup`): the reward registry imports it, and reward workers import the registry,
so it must not pull in torch or the rollout code (a worker's resident memory is held to
`reward_model.memory_limit_mb`)."""

from __future__ import annotations

from typing import Any

LOOKUP_DATA_SOURCE = "relm/lookup"
_ASSISTANT_HEADER = "assistant\n"
"""How a later model turn starts in a response decoded with special tokens skipped."""
_TURNS_WITH_A_TOOL = 4
"""verl's `num_turns` of the shortest conversation that reads a tool result before answering."""


def final_answer_score(
    solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None
) -> float:
    """1.0 when the conversation called a tool and its last model turn is exactly `ground_truth`, else 0.0.

    `solution_str` is the whole response decoded with special tokens skipped, each turn after the first
    behind its role line (`...tool\\ncassistant\\nc`); the answer is what follows the last `assistant`
    line. The conversation must have had a tool turn, which verl's `extra_info["num_turns"]` tells (the
    prompt, a model turn, a tool turn, the answer: 4): a bare guess is right one time in six, and with
    that on offer GRPO settled on guessing (score 1/6, tool calls gone) in each of the runs measured
    before it learned to copy. The count comes from the rollout, not the text, because role lines are
    tokens the model can write: with a text check instead, the policy learned to write a fake tool turn.
    No partial credit: a call alone, or a wrong letter after it, scores 0.
    """
    if (extra_info or {}).get("num_turns", 0) < _TURNS_WITH_A_TOOL:
        return 0.0
    return float(solution_str.rpartition(_ASSISTANT_HEADER)[2].strip() == ground_truth)
