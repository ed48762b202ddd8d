"""Multi-turn pieces without a model: tool turns as ids with the real tokenizers that have a tool role
(Qwen2.5, Llama-3.2) and the refusal of those that do not show one (Phi-3, Mistral-Nemo), Hermes parsing,
the calculator, tool loading from verl's YAML, and the config keys."""

from __future__ import annotations

import asyncio
import textwrap
from datetime import datetime
from pathlib import Path

import pytest
import transformers.utils.chat_template_utils as chat_template_utils
from transformers import AutoTokenizer

from relm.config.loader import load_config
from relm.config.translate import translate
from relm.errors import UserError
from relm.models.tokenizer import _template_turn_end
from relm.rollout.multi_turn.driver import truncate_text
from relm.rollout.multi_turn.hermes import parse_tool_calls
from relm.rollout.multi_turn.render import ToolTurnRenderer
from relm.rollout.multi_turn.setup import load_run_tools
from relm.rollout.multi_turn.tools import Calculator, ToolContext, load_tools, run_tool

REALWORLD = Path(__file__).resolve().parents[3] / "shared" / "realworld" / "tokenizers"
SCHEMA = Calculator.DEFAULT_SCHEMA
SUFFIXES = {
    "qwen2.5": "\n<|im_start|>user\n<tool_response>\n84\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
    # Jinja's `iterable` test holds for a string, so the template JSON-quotes a string result.
    "llama3.2": '<|start_header_id|>ipython<|end_header_id|>\n\n"84"<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n',
}  # fmt: skip
"""What each template writes after the model's turn for the result `84`: the tool turn, the next header."""


def real_tokenizer(name: str):
    if not (REALWORLD / name).is_dir():
        pytest.skip(f"../shared/realworld/tokenizers/{name} is not here")
    return AutoTokenizer.from_pretrained(str(REALWORLD / name))


class _Clock:
    """Stands in for transformers' `datetime` in its chat templates' `strftime_now`."""

    moment = datetime(2024, 7, 26, 23, 59)

    @classmethod
    def now(cls) -> datetime:
        return cls.moment


@pytest.mark.parametrize("name", sorted(SUFFIXES))
def test_prompt_plus_sampled_plus_tool_ids_are_the_templates_ids(name, monkeypatch):
    """The conversation built turn by turn as ids equals the template's ids of the whole conversation."""
    tok = real_tokenizer(name)
    turn_end = _template_turn_end(tok)
    # Llama-3.2's template writes today's date into the prompt's system turn. A renderer built before
    # midnight still renders suffixes after it, equal to those of one built after it.
    monkeypatch.setattr(chat_template_utils, "datetime", _Clock)
    monkeypatch.setattr(_Clock, "moment", datetime(2024, 7, 26, 23, 59))
    renderer = ToolTurnRenderer(tok, turn_end, chat_template_kwargs={"tools": [SCHEMA]})
    monkeypatch.setattr(_Clock, "moment", datetime(2024, 7, 27, 0, 1))
    assert renderer.suffix_ids(["84"]) == ToolTurnRenderer(
        tok, turn_end, chat_template_kwargs={"tools": [SCHEMA]}
    ).suffix_ids(["84"])
    user = [{"role": "user", "content": "What is 12 * (3 + 4)? Use the calculator."}]
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * (3 + 4)"}}\n</tool_call>'
    results = [["84"], ["84", "error: ZeroDivisionError: division by zero"]]
    answers = [call, "Let me check again.\n" + call + "\n" + call, "The answer is 84."]
    ids = tok.apply_chat_template(
        user, tools=[SCHEMA], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    messages = list(user)
    for turn, text in enumerate(answers):
        ids += tok.encode(text, add_special_tokens=False) + [turn_end]  # what the model samples
        messages.append({"role": "assistant", "content": text})
        if turn < len(results):
            ids += renderer.suffix_ids(results[turn])
            messages += [{"role": "tool", "content": r} for r in results[turn]]
    whole = tok.apply_chat_template(messages, tools=[SCHEMA], tokenize=True, return_dict=False)
    # The model's ids stop at the turn end; Qwen2.5's template writes a newline after it, Llama's nothing.
    assert ids == whole[: len(ids)] and tok.decode(whole[len(ids) :]).strip() == ""
    assert renderer.suffix_text(["84"]) == SUFFIXES[name]


def test_templates_that_hide_a_tool_result_stop_the_run():
    """Phi-3's template has no tool role and writes nothing for a tool message; Mistral-Nemo's renders
    one only with a call id that Hermes calls do not carry. Each is one line naming the fix."""
    phi3 = real_tokenizer("phi3")
    renderer = ToolTurnRenderer(phi3, _template_turn_end(phi3), chat_template_kwargs={"tools": [SCHEMA]})
    assert renderer.suffix_ids(["again?"], role="user")  # its user role shows the reply
    with pytest.raises(UserError, match="drops or mangles a `tool` message") as dropped:
        renderer.suffix_ids(["84"])
    mistral = real_tokenizer("mistral-nemo")
    renderer = ToolTurnRenderer(
        mistral, _template_turn_end(mistral), chat_template_kwargs={"tools": [SCHEMA]}
    )
    with pytest.raises(UserError, match="only with a tool call id") as needs_ids:
        renderer.check_role("tool")
    # Its template moves the tool list to the latest user message: a reply would re-render the prompt.
    with pytest.raises(UserError, match="renders earlier turns differently once a `user` message") as moved:
        renderer.check_role("user")
    for error in (dropped, needs_ids, moved):
        assert "actor_rollout_ref.model.custom_chat_template" in str(error.value)
        assert "\n" not in str(error.value)


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
        load_run_tools(translate(cfg)[0].engine.multi_turn)
    cfg = load_config([f"{ro}.enable=true", f"{ro}.format=chatml", f"{ro}.tool_config_path=x.yaml"])
    with pytest.raises(UserError, match="format=chatml"):
        load_run_tools(translate(cfg)[0].engine.multi_turn)
    cfg = load_config([f"{ro}.enable=true", f"{ro}.tool_config_path={tmp_path}/none.yaml"])
    with pytest.raises(UserError, match="no such file"):
        load_run_tools(translate(cfg)[0].engine.multi_turn)
