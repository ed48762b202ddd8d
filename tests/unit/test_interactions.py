"""Interactions (verl's `interaction_config_path`): a scripted user answers each turn without a tool call.

The driver runs against an engine that replays fixed turns (the token ids a model would sample), with
the real Qwen2.5 tokenizer and template, so each test knows exactly what was sampled: the episode ends
when the interaction says so, with its score in the reward function's `extra_info`, the user's turns
have mask 0, and the ids trained on are the ids sampled plus the user's template ids.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from relm.errors import UserError
from relm.models.tokenizer import _template_turn_end
from relm.rollout.base import FINISH_STOP, SamplingParams
from relm.rollout.multi_turn.driver import MultiTurnLimits, MultiTurnRollout
from relm.rollout.multi_turn.gsm8k import Gsm8kInteraction, Gsm8kTool
from relm.rollout.multi_turn.interactions import GuessingGame, InteractionRunner, load_interactions
from relm.rollout.multi_turn.render import ToolTurnRenderer
from relm.rollout.multi_turn.tools import Calculator, ToolContext, load_tools
from tests.replay_engine import ReplayEngine

QWEN = Path(__file__).resolve().parents[3] / "shared" / "realworld" / "tokenizers" / "qwen2.5"
PARAMS = SamplingParams(n=1, max_new_tokens=200)


@pytest.fixture(scope="module")
def qwen():
    if not QWEN.is_dir():
        pytest.skip("../shared/realworld/tokenizers/qwen2.5 is not here")
    return AutoTokenizer.from_pretrained(str(QWEN))


def _prompt(tok, messages):
    return tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)


def _rollout(tok, engine, interactions, limits=None, tools=None):
    turn_end = _template_turn_end(tok)
    renderer = ToolTurnRenderer(tok, turn_end, chat_template_kwargs={"tools": None})
    return MultiTurnRollout(
        engine,
        tok,
        renderer,
        tools or {},
        limits or MultiTurnLimits(),
        tok.pad_token_id,
        interactions=InteractionRunner(interactions),
    )


def test_a_scripted_user_ends_the_episode_with_its_score_and_its_turns_are_not_trained(qwen):
    messages = [[{"role": "user", "content": f"Guess my number ({k})."}] for k in range(2)]
    prompts = [_prompt(qwen, m) for m in messages]
    engine = ReplayEngine(qwen, _template_turn_end(qwen), [["I guess 3.", "Then 9.", "7!"], ["Is it 7?"]])
    engine.start(prompts)
    game = GuessingGame({"name": "guess"})
    out = _rollout(qwen, engine, {"guess": game}).generate(
        prompts, PARAMS, interaction_kwargs=[{"name": "guess", "secret": 7}] * 2, messages=messages
    )

    gen = out.generation
    # verl's num_turns: the prompt, each model turn and each user reply (the last one included)
    assert gen.extra_fields == [
        {"turn_scores": [0.0, 0.0, 1.0], "tool_rewards": [], "num_turns": 7},
        {"turn_scores": [1.0], "tool_rewards": [], "num_turns": 3},
    ]
    assert gen.finish_reasons == [FINISH_STOP, FINISH_STOP]
    # Row 0, turn by turn: the ids trained on are the sampled turns plus the user's template ids, and
    # together with the prompt they are the template's ids of the whole conversation.
    said = ["I guess 3.", "Higher.", "Then 9.", "Lower.", "7!", "Correct!"]
    chat = messages[0] + [{"role": ("assistant", "user")[k % 2], "content": t} for k, t in enumerate(said)]
    n = int(gen.response_mask[0].sum())
    assert prompts[0] + gen.response_ids[0, :n].tolist() == _prompt(qwen, chat)
    sampled = [ids for turn in engine.turns[0] for ids in turn]
    assert gen.response_ids[0][gen.model_mask[0].bool()].tolist() == sampled
    # Every later turn was asked to continue exactly the ids so far.
    for k, call in enumerate(engine.calls[1:], start=1):
        assert call[0] == _prompt(qwen, chat[: 1 + 2 * k])
    # Tool/user tokens: mask 0 and logprob 0; the engine's logprobs kept on the sampled ones.
    user = (gen.response_mask[0] == 1) & (gen.model_mask[0] == 0)
    assert int(user.sum()) > 0 and bool((gen.logprobs[0][user] == 0).all())
    assert bool((gen.logprobs[0][gen.model_mask[0].bool()] == -0.5).all())
    assert out.metrics["multi_turn/interaction_turns/mean"] == 2.0
    assert out.metrics["multi_turn/interaction_score/mean"] == 1.0
    assert game._games == {}, "every session was finalized"


def test_max_user_turns_ends_the_conversation_before_the_next_reply(qwen):
    messages = [[{"role": "user", "content": "Guess."}]]
    prompts = [_prompt(qwen, messages[0])]
    engine = ReplayEngine(qwen, _template_turn_end(qwen), [["1", "2", "3"]])
    engine.start(prompts)
    out = _rollout(qwen, engine, {"g": GuessingGame({})}, MultiTurnLimits(max_user_turns=1)).generate(
        prompts, PARAMS, interaction_kwargs=[{"secret": 5}], messages=messages
    )
    assert len(engine.calls) == 2
    assert out.generation.extra_fields == [{"turn_scores": [0.0], "tool_rewards": [], "num_turns": 4}]
    text = qwen.decode(out.generation.response_ids[0][out.generation.response_mask[0].bool()])
    assert text.endswith("2<|im_end|>"), "the second turn is the last: no reply after it"


def test_a_turn_with_a_tool_call_goes_to_the_tool_and_the_next_one_to_the_user(qwen):
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6 * 7"}}\n</tool_call>'
    messages = [[{"role": "user", "content": "What is 6 * 7?"}]]
    prompts = [_prompt(qwen, messages[0])]
    engine = ReplayEngine(qwen, _template_turn_end(qwen), [[call, "#### 42"]])
    engine.start(prompts)
    interaction = Gsm8kInteraction({"name": "gsm8k"})
    out = _rollout(qwen, engine, {"gsm8k": interaction}, tools={"calculator": Calculator()}).generate(
        prompts, PARAMS, interaction_kwargs=[{"name": "gsm8k", "ground_truth": "42"}], messages=messages
    )
    assert out.generation.extra_fields == [{"turn_scores": [1.0], "tool_rewards": [0.0], "num_turns": 5}]
    text = qwen.decode(out.generation.response_ids[0][out.generation.response_mask[0].bool()])
    assert "<tool_response>\n42\n</tool_response>" in text
    assert text.endswith(f"user\n{Gsm8kInteraction.CORRECT}<|im_end|>\n<|im_start|>assistant\n")


def test_gsm8k_interaction_and_tool_say_what_verls_say():
    interaction = Gsm8kInteraction({"name": "gsm8k"})
    interaction.start_interaction("a", ground_truth="72", query="...")
    wrong = interaction.generate_response("a", [{"role": "assistant", "content": "#### 71"}])
    right = interaction.generate_response("a", [{"role": "assistant", "content": "so #### 72"}])
    assert wrong == (
        False,
        "Your response is incorrect! You need to reflect on your answer and try again.",
        0.0,
        {},
    )
    assert right == (True, "Your response is correct!", 1.0, {})

    tool = Gsm8kTool(config={"type": "native"}, tool_schema=None)
    context = ToolContext(row=0, kwargs={"create_kwargs": {"ground_truth": "72"}})
    assert tool.name == "calc_gsm8k_reward"
    good, bad = tool.execute({"answer": "72"}, context), tool.execute({"answer": "70"}, context)
    assert (good.text, good.reward) == ("Current parsed answer='72' reward=1.0", 0.0)
    assert (bad.text, bad.reward) == ("Current parsed answer='70' reward=0.0", -0.05)


def test_verls_example_configs_load_relms_counterparts(tmp_path: Path, caplog):
    interactions = tmp_path / "interaction.yaml"
    interactions.write_text(
        textwrap.dedent("""\
        interaction:
          - name: "gsm8k"
            class_name: "verl.interactions.gsm8k_interaction.Gsm8kInteraction"
            config: {}
          - class_name: relm.rollout.multi_turn.interactions.GuessingGame
            config: {}
        """)
    )
    tools = tmp_path / "tools.yaml"
    tools.write_text(
        textwrap.dedent("""\
        tools:
          - class_name: "verl.tools.gsm8k_tool.Gsm8kTool"
            config: {type: native}
            tool_schema:
              type: "function"
              function:
                name: "calc_gsm8k_reward"
                description: "A tool for calculating the reward of gsm8k."
                parameters: {type: object, properties: {answer: {type: string}}, required: ["answer"]}
        """)
    )
    loaded = load_interactions(str(interactions))
    assert {name: type(i) for name, i in loaded.items()} == {
        "gsm8k": Gsm8kInteraction,
        "guessinggame": GuessingGame,
    }
    assert loaded["guessinggame"].name == "guessinggame"
    assert isinstance(load_tools(str(tools))["calc_gsm8k_reward"], Gsm8kTool)
    assert "runs as relm's built-in `relm.rollout.multi_turn.gsm8k.Gsm8kTool`" in caplog.text


@pytest.mark.parametrize(
    ("yaml_text", "culprit"),
    [
        ("interaction: []", "needs a non-empty `interaction:` list"),
        ("interaction: [{config: {}}]", "interaction[0] needs a `class_name`"),
        ("interaction: [{class_name: no_such_module.X}]", "cannot import `no_such_module`"),
        (
            "interaction: [{name: a, class_name: relm.rollout.multi_turn.interactions.GuessingGame},"
            " {name: a, class_name: relm.rollout.multi_turn.interactions.GuessingGame}]",
            "a second interaction named `a`",
        ),
    ],
)
def test_a_bad_interaction_config_is_one_line_naming_it(tmp_path: Path, yaml_text, culprit):
    path = tmp_path / "interaction.yaml"
    path.write_text(yaml_text)
    with pytest.raises(UserError, match="interaction_config_path") as err:
        load_interactions(str(path))
    assert culprit in str(err.value)


def test_a_row_naming_an_unknown_interaction_is_a_user_error():
    runner = InteractionRunner({"a": GuessingGame({"name": "a"}), "b": GuessingGame({"name": "b"})})
    with pytest.raises(UserError, match="names interaction 'c'; .* defines: a, b"):
        runner.open([{"name": "c", "secret": 1}], [[]])
    with pytest.raises(
        UserError, match=r"interaction `a` \(GuessingGame.start_interaction\) raised ValueError"
    ):
        runner.open([{"name": "a"}], [[]])
