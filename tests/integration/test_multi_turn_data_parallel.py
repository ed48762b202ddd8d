"""Multi-turn rollouts in several processes: `relm train` with 1 and with 2 gloo CPU processes, greedy,
gives the same conversations and the same multi-turn metrics (docs/multi_turn.md, "Several processes").

The model is the lookup task's (`zoo:tiny/qwen2-lookup`), first fitted for a second to call the tool and
copy its letter, and to call it a second time when the letter is `f`. The training rows' letters put
every `f` on rank 1, so rank 0's conversations end after two model turns and rank 1's run a third: the
ranks finish at different turns and meet only at the one gather at the end. The validation set has
three prompts, so the ranks' shares differ in size too. The run uses ReMax, whose greedy baseline is a
second multi-turn rollout of the step, so training, the baseline and validation all go through it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM

from relm.models.lookup_tokenizer import LOOKUP_CALL, build_lookup_tokenizer
from relm.models.tokenizer import _template_turn_end
from relm.models.zoo import materialize_zoo
from relm.rollout.multi_turn.lookup import Lookup, lookup_rows
from relm.rollout.multi_turn.render import ToolTurnRenderer

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TRAIN_LETTERS, VAL_LETTERS = ("a", "c", "f", "b"), ("f", "d", "e")
"""Train: 4 prompts x n=2, prompts 0-1 on rank 0 and 2-3 (one `f`) on rank 1. Validation: 2 + 1 prompts."""
TIMERS = ("agent_loop/tool_calls/", "multi_turn/tool_time_s", "timing_s/", "perf/")


def _fit(model_dir: Path) -> None:
    """The zoo model fitted to call the tool, read the letter and answer it; for `f`, to call twice."""
    tok = build_lookup_tokenizer()
    schema = Lookup().schema
    turn_end = _template_turn_end(tok)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "?"}],
        tools=[schema],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    tool = ToolTurnRenderer(tok, turn_end, chat_template_kwargs={"tools": [schema]})
    call = [tok.convert_tokens_to_ids(LOOKUP_CALL), turn_end]
    sequences = []
    for letter in "abcdef":
        answer = [tok.convert_tokens_to_ids(letter), turn_end]
        turns = [(call, 1), (tool.suffix_ids([letter]), 0)]
        if letter == "f":
            turns += [(call, 1), (tool.suffix_ids([letter]), 0)]
        ids, labels = list(prompt), [-100] * len(prompt)
        for turn, trained in [*turns, (answer, 1)]:
            ids += turn
            labels += turn if trained else [-100] * len(turn)
        sequences.append((ids, labels))
    width = max(len(ids) for ids, _ in sequences)
    ids = torch.tensor([ids + [0] * (width - len(ids)) for ids, _ in sequences])
    labels = torch.tensor([labels + [-100] * (width - len(labels)) for _, labels in sequences])
    mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in sequences])
    source = materialize_zoo("zoo:tiny/qwen2-lookup")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(source)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)  # 1e-2 stalled at a loss of 2.5 (no copying)
    for _ in range(600):  # about 200 steps, 3 s
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        # Greedy follows the fit from here on, and the policy is not yet so sharp that every logprob
        # is 0: the engine-vs-trainer logprob check below still compares something.
        if loss.item() < 0.05:
            break
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(model_dir)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(Path(source) / name, model_dir / name)


def _rows(letters: tuple[str, ...], split: str) -> list[dict]:
    rows = lookup_rows(len(letters), split, seed=0)
    for row, letter in zip(rows, letters, strict=True):
        row["reward_model"]["ground_truth"] = letter
        row["extra_info"]["tools_kwargs"]["lookup"]["create_kwargs"]["letter"] = letter
    return rows


def _relm_train(work: Path, name: str, processes: int) -> tuple[Path, float]:
    run_dir = work / name
    ro = "actor_rollout_ref.rollout"
    command = [
        sys.executable, "-m", "relm.cli", "train", "--config", str(REPO / "examples" / "lookup_task.yaml"),
        f"actor_rollout_ref.model.path={work / 'model'}",
        f"data.train_files={work / 'train.parquet'}", f"data.val_files={work / 'val.parquet'}",
        f"{ro}.multi_turn.tool_config_path={work / 'tools.yaml'}", f"{ro}.multi_turn.max_assistant_turns=3",
        "data.shuffle=false", "data.train_batch_size=4", "data.max_response_length=24", f"{ro}.n=2",
        f"{ro}.do_sample=false", "algorithm.adv_estimator=remax",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_epochs=1",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "trainer.total_training_steps=1", "trainer.val_before_train=true", "trainer.test_freq=-1",
        f"trainer.n_gpus_per_node={processes}", "trainer.device=cpu", "trainer.logger=[jsonl]",
        f"trainer.default_local_dir={run_dir}", f"trainer.rollout_data_dir={run_dir / 'rollout'}",
        f"trainer.validation_data_dir={run_dir / 'val'}",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("RELM_DEBUG", None)
    started = time.monotonic()
    done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir, time.monotonic() - started


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[int, Path]:
    work = tmp_path_factory.mktemp("multi-turn-dp")
    _fit(work / "model")
    for name, letters in (("train", TRAIN_LETTERS), ("val", VAL_LETTERS)):
        pq.write_table(pa.Table.from_pylist(_rows(letters, name)), work / f"{name}.parquet")
    tools = {"tools": [{"class_name": f"{Lookup.__module__}.{Lookup.__name__}", "config": {}}]}
    (work / "tools.yaml").write_text(yaml.safe_dump(tools))
    out = {}
    for processes in (1, 2):
        out[processes], seconds = _relm_train(work, f"run-{processes}", processes)
        print(f"relm train, {processes} process(es): {seconds:.1f} s")
    return out


def _metrics(run_dir: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row for row in rows}


def _dump(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_two_processes_give_one_process_conversations_and_metrics(runs):
    one, two = _metrics(runs[1]), _metrics(runs[2])
    assert sorted(one) == sorted(two) == [0, 1]  # validation before training, then the step
    # The conversations, as the reward function and a person read them, row for row, with their scores.
    for dump in ("rollout/1.jsonl", "val/0.jsonl"):
        assert _dump(runs[1] / dump) == _dump(runs[2] / dump), dump
    step_one, step_two = one[1], two[1]
    multi_turn = [k for k in step_one if k.startswith(("num_turns/", "multi_turn/", "agent_loop/"))]
    assert {k for k in step_two if k.startswith(("num_turns/", "multi_turn/", "agent_loop/"))} == set(
        multi_turn
    )
    for key in multi_turn:
        if not key.startswith(TIMERS):
            assert step_one[key] == step_two[key], key
    for key in ("critic/score/mean", "response_length/mean", "response_length/max"):
        assert step_one[key] == step_two[key], key
    assert {k: v for k, v in one[0].items() if k.startswith("val-core/")} == {
        k: v for k, v in two[0].items() if k.startswith("val-core/")
    }


def test_two_processes_finish_a_step_whose_conversations_call_the_tool(runs):
    step = _metrics(runs[2])[1]
    # Every conversation calls the tool; the `f` rows twice (rank 1 ran one turn more than rank 0).
    assert step["multi_turn/tool_calls/mean"] == (6 * 1 + 2 * 2) / 8
    assert (step["num_turns/min"], step["num_turns/max"]) == (4.0, 6.0)
    assert step["multi_turn/tool_errors"] == 0.0 and step["multi_turn/tool_tokens/mean"] > 0
    assert step["critic/score/mean"] == 1.0, "the fitted model copies the tool's letter"
    # The gathered logprobs belong to the gathered ids: the trainer recomputes them on the whole batch
    # (of a policy whose entropy says its logprobs are not all 0).
    assert step["rollout/logprob_diff_max"] < 1e-4 and step["actor/entropy"] > 1e-3
    outputs = [row["output"] for row in _dump(runs[2] / "rollout" / "1.jsonl")]
    assert [o.count("tool\n") for o in outputs] == [1, 1, 1, 1, 2, 2, 1, 1], outputs
