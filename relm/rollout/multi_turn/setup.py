"""Building the run's multi-turn rollout from `actor_rollout_ref.rollout.multi_turn.*`."""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedTokenizerBase

from relm.config.specs import MultiTurnSpec
from relm.errors import UserError
from relm.models.tokenizer import _template_turn_end
from relm.rollout.base import RolloutEngine
from relm.rollout.multi_turn.driver import TRUNCATE_SIDES, MultiTurnLimits, MultiTurnRollout
from relm.rollout.multi_turn.hermes import FORMATS
from relm.rollout.multi_turn.interactions import Interaction, InteractionRunner, load_interactions
from relm.rollout.multi_turn.render import ToolTurnRenderer
from relm.rollout.multi_turn.tools import Tool, load_tools

KEY = "actor_rollout_ref.rollout.multi_turn"


def load_run_tools(cfg: MultiTurnSpec) -> dict[str, Tool]:
    """The tools of an enabled multi-turn config, after checking its other keys; {} when disabled or
    when the conversations have interactions and no tools."""
    if not cfg.enable:
        return {}
    if cfg.format not in FORMATS:
        raise UserError(
            f"{KEY}.format={cfg.format}: relm parses {', '.join(FORMATS)} tool calls; set format=hermes"
        )
    if cfg.tool_response_truncate_side not in TRUNCATE_SIDES:
        raise UserError(
            f"{KEY}.tool_response_truncate_side={cfg.tool_response_truncate_side}: use one of {', '.join(TRUNCATE_SIDES)}"
        )
    for name in (
        "max_parallel_calls",
        "max_tool_response_length",
        "max_assistant_turns",
        "max_user_turns",
        "max_turns",
    ):
        value = getattr(cfg, name)
        if value is not None and value < 1:
            raise UserError(f"{KEY}.{name}={value}: must be at least 1 (or unset where null is allowed)")
    if not cfg.tool_config_path and not cfg.interaction_config_path:
        raise UserError(
            f"{KEY}.enable=true needs {KEY}.tool_config_path (verl's tool config YAML) or "
            f"{KEY}.interaction_config_path (verl's interaction config YAML)"
        )
    return load_tools(cfg.tool_config_path) if cfg.tool_config_path else {}


def load_run_interactions(cfg: MultiTurnSpec) -> dict[str, Interaction]:
    """The interactions of an enabled multi-turn config; {} when it names none."""
    if not cfg.enable or not cfg.interaction_config_path:
        return {}
    return load_interactions(cfg.interaction_config_path)


def tool_schemas(tools: dict[str, Tool]) -> list[dict[str, Any]]:
    """The schemas the chat template lists in the prompt (`apply_chat_template(..., tools=...)`)."""
    return [tool.schema for tool in tools.values()]


def build_multi_turn(
    cfg: MultiTurnSpec,
    tools: dict[str, Tool],
    engine: RolloutEngine,
    tokenizer: PreTrainedTokenizerBase,
    *,
    chat_template: str | None,
    chat_template_kwargs: dict[str, Any],
    eos_token_ids: list[int],
    interactions: dict[str, Interaction] | None = None,
) -> MultiTurnRollout:
    """The rollout that drives `engine` through conversations with `tools` and `interactions`."""
    turn_end = _template_turn_end(tokenizer)
    if turn_end is None or turn_end not in eos_token_ids:
        raise UserError(
            f"{KEY}.enable=true: the chat template writes no end-of-turn token that responses stop at, so a turn "
            "cannot hand over to a tool; use a tokenizer whose template closes assistant turns with a special token"
        )
    renderer = ToolTurnRenderer(
        tokenizer, turn_end, chat_template, {**chat_template_kwargs, "tools": tool_schemas(tools)}
    )
    # At start-up, not at the first tool call: a template that drops tool results (Phi-3's) or needs
    # call ids (Mistral's) stops the run before its first rollout.
    for role, used in (("tool", tools), ("user", interactions)):
        if used:
            renderer.check_role(role)
    limits = MultiTurnLimits(
        max_assistant_turns=cfg.max_assistant_turns if cfg.max_assistant_turns is not None else cfg.max_turns,
        max_user_turns=cfg.max_user_turns,
        max_parallel_calls=cfg.max_parallel_calls,
        max_tool_response_length=cfg.max_tool_response_length,
        tool_response_truncate_side=cfg.tool_response_truncate_side,
    )
    return MultiTurnRollout(
        engine,
        tokenizer,
        renderer,
        tools,
        limits,
        pad_token_id=tokenizer.pad_token_id,
        interactions=InteractionRunner(interactions) if interactions else None,
    )
