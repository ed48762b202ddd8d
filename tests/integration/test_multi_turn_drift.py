"""No drift in multi-turn rollouts, with the real tokenizers that have a tool role (Qwen2.5, Llama-3.2).

A tiny model with the tokenizer's vocabulary (a Qwen2 with Qwen2.5's 151,936 embedding rows, a Llama
with Llama-3.2's 128,256) is first fitted for a few seconds to one conversation (call the calculator in
Hermes format, read its result, answer), so that sampling at temperature 1 really produces tool calls.
Then each rollout is checked turn by turn: the ids trained on are the prompt, the ids the engine sampled
and the tool turns' template ids, which equal the template's ids of the whole conversation; the response
mask is 1 exactly on sampled tokens; and the trainer's logprobs of those tokens match the engine's.
Qwen2.5 runs through the native and hf engines, Llama-3.2 through the native one.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import (
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from relm.data.records import PromptBatch
from relm.models.tokenizer import _template_turn_end, end_of_turn_ids, preflight_tokenizer
from relm.rollout.base import SamplingParams, logprob_tolerance
from relm.rollout.hf_engine import HFRolloutEngine
from relm.rollout.multi_turn.driver import MultiTurnLimits, MultiTurnRollout
from relm.rollout.multi_turn.hermes import parse_tool_calls
from relm.rollout.multi_turn.render import ToolTurnRenderer
from relm.rollout.multi_turn.tools import Calculator
from relm.rollout.native.engine import NativeRolloutEngine
from relm.trainer.experience import batched_logprobs, build_experience

REALWORLD = Path(__file__).resolve().parents[3] / "shared" / "realworld" / "tokenizers"
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 7"}}\n</tool_call>'
QUESTION = [{"role": "user", "content": "What is 12 * 7?"}]
# Llama-3.2's template writes today's date into the prompt: a fixed one keeps the whole-conversation
# rendering below equal to the prompt's across midnight (relm's renderer stops its own clock; see
# tests/unit/test_multi_turn_pieces.py). Other templates ignore the variable.
DATE = {"date_string": "26 Jul 2024"}
SHAPE = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    max_position_embeddings=1024, tie_word_embeddings=True,
)  # fmt: skip
MODELS = {
    # (model, Adam's learning rate, steps): Llama's fit stalls near loss 3 at 1e-2 and reaches 0.2 at 3e-3.
    "qwen2.5": (lambda tok: Qwen2ForCausalLM(Qwen2Config(vocab_size=151_936, **SHAPE, **_special_ids(tok))), 1e-2, 60),
    "llama3.2": (lambda tok: LlamaForCausalLM(LlamaConfig(vocab_size=128_256, **SHAPE, **_special_ids(tok))), 3e-3, 80),
}  # fmt: skip


def _special_ids(tok: PreTrainedTokenizerBase) -> dict[str, Any]:
    return {
        "pad_token_id": tok.pad_token_id,
        "eos_token_id": tok.eos_token_id,
        "bos_token_id": tok.bos_token_id,
    }


@dataclass
class Fitted:
    """A tiny model with a real tokenizer's vocabulary, fitted to call the calculator."""

    tok: PreTrainedTokenizerBase
    model: PreTrainedModel
    renderer: ToolTurnRenderer
    calc: Calculator
    prompt: list[int]
    turn_end: int


@functools.cache
def fitted(name: str) -> Fitted:
    if not (REALWORLD / name).is_dir():
        pytest.skip(f"../shared/realworld/tokenizers/{name} is not here")
    tok = preflight_tokenizer(AutoTokenizer.from_pretrained(str(REALWORLD / name)), name=name)
    calc = Calculator()
    turn_end = _template_turn_end(tok)
    assert turn_end is not None
    renderer = ToolTurnRenderer(tok, turn_end, chat_template_kwargs={"tools": [calc.schema], **DATE})
    prompt = tok.apply_chat_template(
        QUESTION, tools=[calc.schema], add_generation_prompt=True, tokenize=True, return_dict=False, **DATE
    )
    turn1 = tok.encode(CALL, add_special_tokens=False) + [turn_end]
    tool = renderer.suffix_ids(["84"])
    turn2 = tok.encode("The answer is 84.", add_special_tokens=False) + [turn_end]
    ids = torch.tensor([prompt + turn1 + tool + turn2])
    labels = ids.clone()
    labels[0, : len(prompt)] = -100
    labels[0, len(prompt) + len(turn1) : len(prompt) + len(turn1) + len(tool)] = -100
    torch.manual_seed(0)
    build, lr, steps = MODELS[name]
    model = build(tok)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    return Fitted(tok, model, renderer, calc, prompt, turn_end)


@pytest.mark.parametrize(
    ("name", "engine_name"), [("qwen2.5", "native"), ("qwen2.5", "hf"), ("llama3.2", "native")]
)
def test_ids_trained_on_are_ids_sampled_plus_tool_ids(name, engine_name):
    f = fitted(name)
    tok, model, renderer, calc, prompt, turn_end = f.tok, f.model, f.renderer, f.calc, f.prompt, f.turn_end
    engine_cls = NativeRolloutEngine if engine_name == "native" else HFRolloutEngine
    engine = engine_cls(
        model, pad_token_id=tok.pad_token_id, eos_token_ids=end_of_turn_ids(tok), device="cpu", seed=3
    )
    rollout = MultiTurnRollout(
        engine, tok, renderer, {"calculator": calc}, MultiTurnLimits(max_assistant_turns=3), tok.pad_token_id
    )
    params = SamplingParams(n=6, max_new_tokens=96, temperature=1.0, seed=11)
    out = rollout.generate([prompt], params)
    gen = out.generation
    assert out.metrics["multi_turn/tool_calls/mean"] > 0
    rows_with_tools = whole_checked = 0
    for row in range(6):
        length = int(gen.response_mask[row].sum())
        ids = gen.response_ids[row, :length].tolist()
        model_mask = gen.model_mask[row, :length].tolist()
        assert gen.model_mask[row, length:].sum() == 0
        # Split the response into runs of sampled (1) and tool (0) tokens.
        runs, start = [], 0
        for t in range(1, length + 1):
            if t == length or model_mask[t] != model_mask[start]:
                runs.append((model_mask[start], ids[start:t]))
                start = t
        assert runs[0][0] == 1
        messages = list(QUESTION)
        tool_ok = False
        for k, (sampled, segment) in enumerate(runs):
            if sampled:
                text = tok.decode(segment, skip_special_tokens=True)
                messages.append({"role": "assistant", "content": text})
                if k + 1 < len(runs):  # a tool turn follows: the turn ended at the template's turn end
                    assert segment[-1] == turn_end
                    calls = parse_tool_calls(text)
                    assert calls
            else:
                rows_with_tools += 1
                results = ["84" if c.name == "calculator" and c.error is None else None for c in calls[:1]]
                if results[0] is not None and calls[0].arguments.get("expression") == "12 * 7":
                    assert segment == renderer.suffix_ids(results)  # the tool's ids are the template's
                    tool_ok = True
                assert gen.logprobs[row, :length][torch.tensor(model_mask) == 0].abs().sum() == 0
        # Where every sampled turn re-encodes to itself (and Llama's template, which trims a message,
        # has nothing to trim), the whole equals the template's rendering.
        sampled_runs = [segment for sampled, segment in runs if sampled]
        said = [m["content"] for m in messages if m["role"] == "assistant"]
        stable = all(
            text == text.strip() and tok.encode(text, add_special_tokens=False) + [turn_end] == segment
            for text, segment in zip(said, sampled_runs, strict=True)
        )
        if stable and len(runs) == 3 and tool_ok:
            full = messages[:2] + [{"role": "tool", "content": "84"}] + messages[2:]
            whole = tok.apply_chat_template(
                full, tools=[calc.schema], tokenize=True, return_dict=False, **DATE
            )
            assert prompt + ids == whole[: len(prompt) + length]
            whole_checked += 1
    assert rows_with_tools > 0 and whole_checked > 0

    # Trainer logprobs of the model's tokens match the engine's; tool tokens are attended, not trained.
    prompts = PromptBatch([prompt], ["t"], [None], [{}], [0])
    batch = build_experience(prompts, gen, n=6, pad_token_id=tok.pad_token_id)
    assert torch.equal(batch.response_mask, gen.model_mask) and torch.equal(
        batch.response_tokens, gen.response_mask
    )
    trainer = batched_logprobs(
        model, batch, rows_per_forward=6, temperature=1.0, device=torch.device("cpu"), vocab_limit=len(tok)
    )
    on_model = batch.response_mask.bool()
    diff = (trainer - gen.logprobs)[on_model].abs()
    max_tol, mean_tol = logprob_tolerance(torch.float32)
    assert diff.max() < max_tol and diff.mean() < mean_tol


TOOL_FILE = '''
from relm.rollout.multi_turn.tools import ToolResult, evaluate_arithmetic


class CheckedCalculator:
    """The calculator, reporting whether the row's tools_kwargs reached it."""

    def __init__(self, config, tool_schema):
        self.schema, self.name = tool_schema, "calculator"

    def execute(self, arguments, context):
        truth = context.kwargs.get("create_kwargs", {}).get("ground_truth")
        value = evaluate_arithmetic(arguments["expression"])
        return ToolResult(str(value), reward=0.0, metrics={"saw_ground_truth": float(truth == "84")})
'''

REWARD_FILE = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    # The whole conversation arrives, tool result included: score the last assistant turn only.
    last = solution_str.rsplit("assistant\\n", 1)[-1]
    return float(ground_truth in last and "<tool_call>" not in last)
"""


def test_a_run_with_tools_through_the_entry_point(train, tmp_path):
    """Two GRPO steps through `relm train` with verl's multi-turn keys, tool config and tools_kwargs."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq
    import yaml

    f = fitted("qwen2.5")
    tok, model, calc = f.tok, f.model, f.calc
    model_dir = tmp_path / "model"
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    (tmp_path / "entry_tools.py").write_text(TOOL_FILE)
    (tmp_path / "reward.py").write_text(REWARD_FILE)
    tools = tmp_path / "tools.yaml"
    tools.write_text(
        yaml.safe_dump(
            {
                "tools": [
                    {"class_name": "entry_tools.CheckedCalculator", "config": {}, "tool_schema": calc.schema}
                ]
            },
            sort_keys=False,
        )
    )
    rows = [
        {
            "data_source": "calc",
            "prompt": [{"role": "user", "content": "What is 12 * 7?"}],
            "reward_model": {"style": "rule", "ground_truth": "84"},
            "extra_info": {
                "index": i,
                "tools_kwargs": {"calculator": {"create_kwargs": {"ground_truth": "84"}}},
            },
        }
        for i in range(4)
    ]
    data = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), data)
    ro = "actor_rollout_ref.rollout"
    result = train(
        f"actor_rollout_ref.model.path={model_dir}",
        f"data.train_files={data}",
        "data.max_prompt_length=512",
        "data.max_response_length=96",
        "data.train_batch_size=2",
        "algorithm.adv_estimator=grpo",
        f"{ro}.n=4",
        f"{ro}.multi_turn.enable=true",
        f"{ro}.multi_turn.tool_config_path={tools}",
        f"{ro}.multi_turn.max_assistant_turns=3",
        f"custom_reward_function.path={tmp_path / 'reward.py'}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "trainer.total_training_steps=2",
        "trainer.val_before_train=false",
        f"data.val_files={data}",
        "trainer.test_freq=2",
        f"trainer.validation_data_dir={tmp_path / 'val'}",
        "trainer.logger=[jsonl]",
        f"trainer.rollout_data_dir={tmp_path / 'rollout'}",
        tiny=False,
    )
    assert result.exit_code == 0, result.stderr
    metrics = result.metrics
    assert [m["step"] for m in metrics] == [1, 2]
    # The fitted model calls the tool in most conversations, not all: count over the run.
    assert sum(m["multi_turn/tool_calls/mean"] for m in metrics) > 0, metrics
    assert all(m.get("multi_turn/tool/saw_ground_truth/mean", 1.0) == 1.0 for m in metrics)
    assert any(m["multi_turn/tool_tokens/mean"] > 0 for m in metrics)
    assert all(m["multi_turn/model_tokens/mean"] > 0 for m in metrics)
    assert all(m["rollout/logprob_diff_max"] < 1e-3 for m in metrics)
    assert max(m["critic/score/mean"] for m in metrics) > 0
    # The dumps show whole conversations: the model's turns and the tool's results.
    dumped = [
        json.loads(line)
        for step in (1, 2)
        for line in (tmp_path / "rollout" / f"{step}.jsonl").read_text().splitlines()
    ]
    assert any("<tool_response>" in s["output"] for s in dumped)
    # Validation runs the same conversations (greedy): the fitted model calls the calculator.
    assert "val-core/calc/reward/mean@1" in metrics[-1]
    validated = [json.loads(line) for line in (tmp_path / "val" / "2.jsonl").read_text().splitlines()]
    assert any("<tool_response>" in s["output"] for s in validated)


@pytest.mark.parametrize(
    ("name", "vocab_size", "culprit"),
    [
        ("phi3", 32_064, "drops or mangles a `tool` message"),
        ("mistral-nemo", 131_072, "only with a tool call id"),
    ],
)
def test_a_template_that_hides_tool_results_stops_at_start_up(train, tmp_path, name, vocab_size, culprit):
    """Phi-3's template writes nothing for a tool message and Mistral-Nemo's needs call ids: `relm train`
    with tools stops before its first rollout, exit 2, one line naming custom_chat_template."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import yaml

    if not (REALWORLD / name).is_dir():
        pytest.skip(f"../shared/realworld/tokenizers/{name} is not here")
    tok = AutoTokenizer.from_pretrained(str(REALWORLD / name))
    tiny = {**SHAPE, "hidden_size": 16, "intermediate_size": 32}
    Qwen2ForCausalLM(
        Qwen2Config(vocab_size=vocab_size, **tiny, eos_token_id=tok.eos_token_id)
    ).save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    tools = tmp_path / "tools.yaml"
    tools.write_text(yaml.safe_dump({"tools": [{"class_name": "relm.rollout.multi_turn.tools.Calculator"}]}))
    rows = [
        {
            "data_source": "calc",
            "prompt": QUESTION,
            "reward_model": {"ground_truth": "84"},
            "extra_info": {"index": 0},
        }
    ] * 4
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    result = train(
        f"actor_rollout_ref.model.path={tmp_path / 'model'}",
        f"data.train_files={tmp_path / 'train.parquet'}",
        "data.max_prompt_length=512",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools}",
    )
    assert result.exit_code == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert (
        len(lines) == 1 and culprit in lines[0] and "actor_rollout_ref.model.custom_chat_template" in lines[0]
    )
