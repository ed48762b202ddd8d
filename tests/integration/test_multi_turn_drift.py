"""No drift in multi-turn rollouts, with the real Qwen2.5 tokenizer, in the native and hf engines.

A tiny Qwen2 (Qwen2.5's 151,936 embedding rows) is first fitted for a few seconds to one conversation
(call the calculator in Hermes format, read its result, answer), so that sampling at temperature 1
really produces tool calls. Then each rollout is checked turn by turn: the ids trained on are the
prompt, the ids the engine sampled and the tool turns' template ids, which equal the template's ids of
the whole conversation; the response mask is 1 exactly on sampled tokens; and the trainer's logprobs
of those tokens match the engine's.
"""

from __future__ import annotations

import pytest
import torch

from relm.rollout.base import SamplingParams
from relm.rollout.hf_engine import HFRolloutEngine
from relm.rollout.multi_turn.driver import MultiTurnLimits, MultiTurnRollout
from relm.rollout.native.engine import NativeRolloutEngine
from tests.tool_caller import QWEN, check_tool_turns, fit_tool_caller, trainer_logprob_gap


@pytest.fixture(scope="module")
def setup():
    if not QWEN.is_dir():
        pytest.skip("../shared/realworld/tokenizers/qwen2.5 is not here")
    return fit_tool_caller(QWEN)


@pytest.mark.parametrize("engine_name", ["native", "hf"])
def test_ids_trained_on_are_ids_sampled_plus_tool_ids(setup, engine_name):
    tok, prompt = setup.tokenizer, setup.prompt
    engine_cls = NativeRolloutEngine if engine_name == "native" else HFRolloutEngine
    # As in a run, no id past the tokenizer's is sampled, and the trainer's logprobs leave them out too.
    engine = engine_cls(
        setup.model,
        pad_token_id=tok.pad_token_id,
        eos_token_ids=[tok.eos_token_id],
        device="cpu",
        seed=3,
        vocab_limit=len(tok),
    )
    rollout = MultiTurnRollout(
        engine,
        tok,
        setup.renderer,
        {"calculator": setup.calculator},
        MultiTurnLimits(max_assistant_turns=3),
        tok.pad_token_id,
    )
    params = SamplingParams(n=6, max_new_tokens=96, temperature=1.0, seed=11)
    out = rollout.generate([prompt], params)
    assert out.metrics["multi_turn/tool_calls/mean"] > 0
    tool_turns, whole_checked = check_tool_turns(setup, out.generation)
    assert tool_turns > 0 and whole_checked > 0
    # Trainer logprobs of the model's tokens match the engine's; tool tokens are attended, not trained.
    trainer_logprob_gap(setup, [prompt], out.generation, n=6, dtype=torch.float32)


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


def test_a_run_with_tools_through_the_entry_point(setup, train, tmp_path):
    """Two GRPO steps through `relm train` with verl's multi-turn keys, tool config and tools_kwargs."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq
    import yaml

    tok, model, calc = setup.tokenizer, setup.model, setup.calculator
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
