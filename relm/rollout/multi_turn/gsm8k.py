"""GSM8K's answer checker as a tool and as a scripted user: relm's counterparts of verl's
`verl.tools.gsm8k_tool.Gsm8kTool` and `verl.interactions.gsm8k_interaction.Gsm8kInteraction`.

verl's multi-turn GSM8K examples name those classes in their tool and interaction configs; relm runs
these in their place (tools.VERL_EQUIVALENTS), so the examples' YAML files work unchanged without
verl installed. They behave as verl 0.7.1's do (same texts, rewards and end of episode), and check the
answer with relm's GSM8K scorer, which compares numbers where verl compares strings (docs/algorithms.md).
"""

from __future__ import annotations

from typing import Any

from relm.data.gsm8k import gsm8k_score
from relm.rollout.multi_turn.tools import ToolContext, ToolResult

GSM8K_TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calc_gsm8k_reward",
        "description": "A tool for calculating the reward of gsm8k. (1.0 if parsed answer is correct, 0.0 if "
        "parsed answer is incorrect or not correctly parsed)",
        "parameters": {
            "type": "object",
            "properties": {
                "answer": {
                    "type": "string",
                    "description": "The model's answer to the GSM8K math problem, must be a digits",
                }
            },
            "required": ["answer"],
        },
    },
}
"""The schema of verl's example tool config, used when an entry brings none."""

_NO_IMPROVEMENT_PENALTY = -0.05
"""verl's tool reward for an answer that scores no better than the call's starting state (0)."""


class Gsm8kTool:
    """Scores the `answer` argument against the row's `tools_kwargs.<name>.create_kwargs.ground_truth`.

    Each call starts from a fresh state, as verl's agent loop creates and releases a tool instance per
    call: a right answer earns a tool reward of 0, any other -0.05. The text the model reads is verl's
    (`Current parsed answer='72' reward=1.0`).
    """

    def __init__(
        self, config: dict[str, Any] | None = None, tool_schema: dict[str, Any] | None = None
    ) -> None:
        self.schema = tool_schema or GSM8K_TOOL_SCHEMA
        function = self.schema.get("function", self.schema)
        self.name = str(function.get("name") or "calc_gsm8k_reward")

    def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        answer = arguments.get("answer", "")
        answer = answer if isinstance(answer, str) else str(answer)
        ground_truth = (context.kwargs.get("create_kwargs") or {}).get("ground_truth")
        submitted = answer if answer.startswith("#### ") else "#### " + answer
        reward = (
            gsm8k_score(submitted, str(ground_truth), method="flexible") if ground_truth is not None else 0.0
        )
        tool_reward = 0.0 if reward > 0.0 else _NO_IMPROVEMENT_PENALTY
        return ToolResult(f"Current parsed {answer=} {reward=}", tool_reward, {"gsm8k_reward": reward})


class Gsm8kInteraction:
    """A user who checks the model's last answer (`#### N`, strict) against the row's
    `interaction_kwargs.ground_truth`: right ends the episode with score 1, wrong asks to try again
    (score 0) until `max_user_turns` or the length runs out."""

    CORRECT = "Your response is correct!"
    INCORRECT = "Your response is incorrect! You need to reflect on your answer and try again."

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.name = str(config.get("name", "gsm8k"))
        self._ground_truths: dict[str, Any] = {}

    def start_interaction(self, instance_id: str, ground_truth: Any = None, **kwargs: Any) -> str:
        self._ground_truths[instance_id] = ground_truth
        return instance_id

    def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float, dict[str, Any]]:
        answer = next(
            (m.get("content") or "" for m in reversed(messages) if m.get("role") == "assistant"), ""
        )
        ground_truth = self._ground_truths.get(instance_id)
        score = (
            gsm8k_score(str(answer), str(ground_truth), method="strict") if ground_truth is not None else 0.0
        )
        if score == 1.0:
            return True, self.CORRECT, score, {}
        return False, self.INCORRECT, score, {}

    def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        self._ground_truths.pop(instance_id, None)
