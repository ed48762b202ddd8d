"""Multi-turn pieces without a model: tool turns as ids with the real Qwen2.5 template, Hermes parsing,
the calculator, tool loading from verl's YAML, and the config keys."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from relm.config.loader import load_config
from relm.errors import UserError
from relm.models.tokenizer import _template_turn_end
from relm.rollout.multi_turn.driver import truncate_text
from relm.rollout.multi_turn.hermes import parse_tool_calls
from relm.rollout.multi_turn.render import ToolTurnRenderer
from relm.rollout.multi_turn.setup import load_run_tools
from relm.rollout.multi_turn.tools import Calculator, ToolContext, load_tools, run_tool

QWEN = Path(__file__).resolve().parents[3] / "shared" / "realworld" / "tokenizers" / "qwen2.5"
SCHEMA = Calculator.DEFAULT_SCHEMA


@pytest.fixture(scope="module")
def qwen():
    if not QWEN.is_dir():
        pytest.skip("../shared/realworld/tokenizers/qwen2.5 is not here")
    return AutoTokenizer.from_pretrained(str(QWEN))


def test_prompt_plus_sampled_plus_tool_ids_are_the_templates_ids(qwen):
    """The conversation built turn by turn as ids equals the template's ids of the whole conversation."""
    turn_end = _template_turn_end(qwen)
    renderer = ToolTurnRenderer(qwen, turn_end, chat_template_kwargs={"tools": [SCHEMA]})
    user = [{"role": "user", "content": "What is 12 * (3 + 4)? Use the calculator."}]
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * (3 + 4)"}}\n</tool_call>'
    results = [["84"], ["84", "error: ZeroDivisionError: division by zero"]]
    answers = [call, "Let me check again.\n" + call + "\n" + call, "The answer is 84."]
    ids = qwen.apply_chat_template(
        user, tools=[SCHEMA], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    messages = list(user)
    for turn, text in enumerate(answers):
        ids += qwen.encode(text, add_special_tokens=False) + [turn_end]  # what the model samples
        messages.append({"role": "assistant", "content": text})
        if turn < len(results):
            ids += renderer.suffix_ids(results[turn])
            messages += [{"role": "tool", "content": r} for r in results[turn]]
    whole = qwen.apply_chat_template(messages, tools=[SCHEMA], tokenize=True, return_dict=False)
    # The template closes the last assistant turn with <|im_end|>\n; the model's ids stop at <|im_end|>.
    assert ids == whole[: len(ids)] and whole[len(ids) :] == qwen.encode("\n", add_special_tokens=False)
    assert (
        renderer.suffix_text(["84"])
        == "\n<|im_start|>user\n<tool_response>\n84\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_hermes_calls_are_parsed_and_bad_ones_say_why():
    text = (
        'think <tool_call>\n{"name": "calculator", "arguments": {"expression": "1+2"}}\n</tool_call>'
        '<tool_call>{"name": "lookup", "arguments": "{\\"key\\": \\"q\\"}"}</tool_call>'
        "<tool_call>{not json}</tool_call><tool_call>[1]</tool_call>"
    )
    calls = parse_tool_calls(text)
    assert [(c.name, c.arguments, c.error is None) for c in calls[:2]] == [
        ("calculator", {"expression": "1+2"}, True),
        ("lookup", {"key": "q"}, True),
    ]
    assert "not valid JSON" in calls[2].error and "name" in calls[3].error
    assert parse_tool_calls("no call here") == []


def test_calculator_evaluates_arithmetic_and_refuses_the_rest():
    calc = Calculator()
    run = lambda expr: asyncio.run(run_tool(calc, {"expression": expr}, ToolContext(row=0)))  # noqa: E731
    assert run("12 * (3 + 4)").text == "84"
    assert run("7 / 2").text == "3.5"
    for bad in ("__import__('os').system('true')", "1/0", "9**9**9", "x + 1"):
        result = run(bad)
        assert result.error is not None and result.text.startswith("error:")


def test_truncation_keeps_the_side_asked_for():
    assert truncate_text("abcdefghij", 4, "right") == "abcd...(truncated)"
    assert truncate_text("abcdefghij", 4, "left") == "...(truncated)ghij"
    assert truncate_text("abcdefghij", 4, "middle") == "ab...(truncated)ij"
    assert truncate_text("abc", 4, "middle") == "abc"


def test_tools_load_from_verl_yaml_by_dotted_name(tmp_path):
    (tmp_path / "my_tools.py").write_text(
        textwrap.dedent(
            """
            class Lookup:
                def __init__(self, config, tool_schema):
                    self.schema, self.name, self.table = tool_schema, "lookup", config["table"]

                async def execute(self, arguments, context):
                    return self.table.get(arguments.get("key"), "unknown"), 0.0, {}


            class VerlStyle:  # verl's BaseTool shape: create / execute(instance_id, parameters) / release
                def __init__(self, config, tool_schema):
                    self.tool_schema = tool_schema

                async def create(self, instance_id=None, **kwargs):
                    self.truth = kwargs["ground_truth"]
                    return "id-1"

                async def execute(self, instance_id, parameters, **kwargs):
                    return f"truth={self.truth} got={parameters['answer']}", 1.0, {"n": 1}

                async def release(self, instance_id, **kwargs):
                    pass
            """
        )
    )
    fn = lambda name: {"type": "function", "function": {"name": name, "parameters": {}}}  # noqa: E731
    config = tmp_path / "tools.yaml"
    config.write_text(
        textwrap.dedent(
            f"""
            tools:
              - class_name: my_tools.Lookup
                config: {{table: {{q: x}}}}
                tool_schema: {fn("lookup")}
              - class_name: my_tools.VerlStyle
                config: {{type: native}}
                tool_schema: {fn("check")}
              - class_name: relm.rollout.multi_turn.python_tool.PythonTool
                config: {{timeout_s: 5}}
            """
        ).replace("'", '"')
    )
    tools = load_tools(str(config))
    assert sorted(tools) == ["check", "lookup", "python"]
    lookup = asyncio.run(run_tool(tools["lookup"], {"key": "q"}, ToolContext(row=0)))
    assert lookup.text == "x"
    context = ToolContext(row=0, kwargs={"create_kwargs": {"ground_truth": "7"}})
    checked = asyncio.run(run_tool(tools["check"], {"answer": "7"}, context))
    assert (checked.text, checked.reward, checked.metrics) == ("truth=7 got=7", 1.0, {"n": 1})


def test_multi_turn_keys_act_and_mistakes_are_one_line(tmp_path):
    ro = "actor_rollout_ref.rollout.multi_turn"
    cfg = load_config([f"{ro}.enable=true", f"{ro}.max_assistant_turns=3", f"{ro}.format=hermes"])
    assert cfg.actor_rollout_ref.rollout.multi_turn.max_assistant_turns == 3
    with pytest.raises(UserError, match="tool_config_path"):
        load_run_tools(cfg.actor_rollout_ref.rollout.multi_turn)
    cfg = load_config([f"{ro}.enable=true", f"{ro}.format=chatml", f"{ro}.tool_config_path=x.yaml"])
    with pytest.raises(UserError, match="format=chatml"):
        load_run_tools(cfg.actor_rollout_ref.rollout.multi_turn)
    cfg = load_config([f"{ro}.enable=true", f"{ro}.tool_config_path={tmp_path}/none.yaml"])
    with pytest.raises(UserError, match="no such file"):
        load_run_tools(cfg.actor_rollout_ref.rollout.multi_turn)
