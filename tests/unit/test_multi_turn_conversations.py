"""The multi-turn metrics as a pure function of per-conversation records (what a data-parallel rollout
gathers), against numbers worked out by hand, and the tally the driver fills them from."""

from __future__ import annotations

import pytest

from relm.rollout.multi_turn.conversations import (
    ConversationRecord,
    ToolCallTally,
    multi_turn_metrics,
    row_kwargs,
)
from relm.rollout.multi_turn.tools import ToolResult


def test_metrics_of_three_conversations_worked_by_hand():
    records = [
        # Two calls (one an error), 3 model turns, 2 tool turns.
        ConversationRecord(
            assistant_turns=3, user_turns=2, model_tokens=9, tool_tokens=12, tool_calls=2, tool_errors=1,
            tool_seconds=0.5, tool_wait_seconds=0.4, tool_reward=1.0, tool_metrics=(("time_s", 0.2), ("time_s", 0.3)),
        ),
        ConversationRecord(assistant_turns=1, user_turns=0, model_tokens=3, tool_tokens=0),
        # One call that timed out.
        ConversationRecord(
            assistant_turns=2, user_turns=1, model_tokens=6, tool_tokens=6, tool_calls=1, tool_errors=1,
            tool_timeouts=1, tool_seconds=1.0, tool_wait_seconds=1.0, tool_metrics=(("time_s", 1.0),),
        ),
    ]  # fmt: skip
    m = multi_turn_metrics(records)
    assert [r.num_turns for r in records] == [6, 2, 4]
    assert m == {
        "multi_turn/tool/time_s/mean": pytest.approx(0.5),  # over the 3 calls, not the conversations
        "num_turns/min": 2.0,
        "num_turns/max": 6.0,
        "num_turns/mean": 4.0,
        "agent_loop/tool_calls/min": 0.0,
        "agent_loop/tool_calls/max": 1.0,
        "agent_loop/tool_calls/mean": pytest.approx(1.4 / 3),
        "multi_turn/assistant_turns/mean": 2.0,
        "multi_turn/assistant_turns/max": 3.0,
        "multi_turn/tool_calls/mean": 1.0,
        "multi_turn/tool_errors": 2.0,
        "multi_turn/tool_timeouts": 1.0,
        "multi_turn/tool_time_s": 1.5,
        "multi_turn/tool_reward/mean": pytest.approx(1 / 3),
        "multi_turn/model_tokens/mean": 6.0,
        "multi_turn/tool_tokens/mean": 6.0,
    }
    # Shares in any split, put back in order, give the whole batch's metrics: nothing but the records counts.
    assert multi_turn_metrics(records[:1] + records[1:]) == m


def test_interaction_metrics_appear_with_interactions_only():
    plain = [ConversationRecord(assistant_turns=1, user_turns=0, model_tokens=2, tool_tokens=0)]
    assert not any("interaction" in key for key in multi_turn_metrics(plain))
    talked = [
        ConversationRecord(2, 1, 4, 5, interaction_replies=1, interaction_score=1.0),
        ConversationRecord(3, 2, 6, 10, interaction_replies=2, interaction_score=0.0),
    ]
    m = multi_turn_metrics(talked)
    assert m["multi_turn/interaction_turns/mean"] == 1.5 and m["multi_turn/interaction_score/mean"] == 0.5


def test_the_tally_counts_a_turn_by_its_slowest_call():
    tally = ToolCallTally()
    tally.record(0, ToolResult("a", reward=0.5, metrics={"n": 1}), 0.25)
    tally.record(0, ToolResult("error: x", error="timeout"), 0.5)  # the same turn, run beside the first
    tally.end_turn()
    tally.record(0, ToolResult("b"), 0.125)
    tally.end_turn()
    record = tally.record_of(0, assistant_turns=3, user_turns=2, model_tokens=7, tool_tokens=8)
    assert (record.tool_calls, record.tool_errors, record.tool_timeouts) == (3, 1, 1)
    assert record.tool_seconds == 0.875 and record.tool_wait_seconds == 0.625
    assert record.tool_reward == 0.5 and record.tool_metrics == (("n", 1.0),)
    empty = tally.record_of(1, assistant_turns=1, user_turns=0, model_tokens=1, tool_tokens=0)
    assert (empty.tool_calls, empty.tool_wait_seconds, empty.interaction_replies) == (0, 0.0, None)


def test_row_kwargs_read_verls_extra_info_places_and_default_to_empty():
    infos = [
        {"tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "72"}}}, "index": 0},
        {"interaction_kwargs": {"name": "gsm8k", "ground_truth": "5"}},
        None,
        {"tools_kwargs": None},
    ]
    kwargs = row_kwargs(infos)
    assert kwargs == {
        "tools_kwargs": [{"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "72"}}}, {}, {}, {}],
        "interaction_kwargs": [{}, {"name": "gsm8k", "ground_truth": "5"}, {}, {}],
    }
    kwargs["tools_kwargs"][0]["extra"] = {}  # copies: a tool that edits its kwargs leaves the row as it was
    assert "extra" not in infos[0]["tools_kwargs"]
