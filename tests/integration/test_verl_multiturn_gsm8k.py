"""verl's multi-turn GSM8K examples (examples/verl_multiturn_gsm8k/) run one step with their paths and
sizes changed: the tool run (verl's `Gsm8kTool`, mapped to relm's) in the script's own 8 processes, and
the interaction run (verl's `Gsm8kInteraction`, mapped to relm's) in 2.

Real GSM8K rows (../shared/realworld) go through `examples/gsm8k_preprocess.py --multiturn ...`; the
model is a tiny Qwen2 with the real Qwen2.5 tokenizer, first fitted for a few seconds to one
conversation of each kind (call the tool then answer; answer wrong, hear "incorrect", answer right), so
that sampling at verl's temperature 1 really calls the tool and really talks to the interaction.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from transformers import AutoTokenizer

from relm.models.tokenizer import _template_turn_end
from relm.rollout.multi_turn.gsm8k import Gsm8kInteraction
from relm.rollout.multi_turn.render import ToolTurnRenderer
from tests.tool_caller import fit_conversations, tiny_model

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "verl_multiturn_gsm8k"
REALWORLD = REPO.parent / "shared" / "realworld"
QWEN, GSM8K = REALWORLD / "tokenizers" / "qwen2.5", REALWORLD / "data" / "gsm8k"
CALL = '<tool_call>\n{"name": "calc_gsm8k_reward", "arguments": {"answer": "72"}}\n</tool_call>'
SIZES = [
    "data.train_batch_size=1",
    "actor_rollout_ref.rollout.n=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=1",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
    "data.max_prompt_length=512",
    "data.max_response_length=128",
    "trainer.total_training_steps=1",
    "trainer.val_before_train=False",
    "trainer.test_freq=-1",
]
"""What changes beside the paths: one prompt, eight conversations, one step. The process count stays the
script's (`trainer.n_gpus_per_node=8`: 8 gloo CPU processes; the sizes are ones that split over 8 ranks,
8 responses and a micro-batch of 1 each, and the one prompt's conversations all run on rank 0, the other
seven ranks' shares being empty). Measured on 2 busy cores: the tool run took 153 s with 8 processes,
about 10 GB of memory at its peak; 45 s in one process."""
INTERACTION_PROCESSES = "trainer.n_gpus_per_node=2"
"""The interaction run in 2 processes instead of its script's 8: interactions across ranks at a third of
the time (54 s measured)."""


def _preprocess(mode: str, out: Path) -> Path:
    """The first GSM8K train row (Natalia's clips: 72) and two test rows, in verl's multi-turn layout."""
    source = out / "source"
    source.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", 1), ("test", 2)):
        lines = (GSM8K / f"{split}.jsonl").read_text().splitlines()[:count]
        (source / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    subprocess.run(
        [sys.executable, str(REPO / "examples" / "gsm8k_preprocess.py"), "--local_dataset_path", str(source),
         "--local_save_dir", str(out / mode), "--multiturn", mode],
        check=True, capture_output=True,
    )  # fmt: skip
    return out / mode


def _conversations(tok, data: dict[str, Path]) -> list[tuple[list[int], list[int]]]:
    """(ids, trained positions) of the two conversations the model is fitted to, rendered as relm renders them."""
    import pyarrow.parquet as pq

    turn_end = _template_turn_end(tok)
    tool_yaml = yaml.safe_load((EXAMPLE / "config" / "tool_config" / "gsm8k_tool_config.yaml").read_text())
    schemas = [entry["tool_schema"] for entry in tool_yaml["tools"]]

    def prompt(mode: str, tools) -> list[int]:
        messages = pq.read_table(data[mode] / "train.parquet").to_pylist()[0]["prompt"]
        return tok.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
        )

    def say(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False) + [turn_end]

    with_tools = ToolTurnRenderer(tok, turn_end, chat_template_kwargs={"tools": schemas})
    plain = ToolTurnRenderer(tok, turn_end)
    tool_turns = [
        (say(CALL), 1),
        (with_tools.suffix_ids(["Current parsed answer='72' reward=1.0"]), 0),
        (say("#### 72"), 1),
    ]
    user_turns = [
        (say("#### 71"), 1),
        (plain.suffix_ids([Gsm8kInteraction.INCORRECT], role="user"), 0),
        (say("#### 72"), 1),
    ]
    out = []
    for start, turns in ((prompt("tool", schemas), tool_turns), (prompt("interaction", None), user_turns)):
        ids, trained = list(start), [0] * len(start)
        for turn, learn in turns:
            ids += turn
            trained += [learn] * len(turn)
        out.append((ids, trained))
    return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    if not (QWEN.is_dir() and GSM8K.is_dir()):
        pytest.skip("../shared/realworld (Qwen2.5 tokenizer, GSM8K) is not here")
    work = tmp_path_factory.mktemp("verl-multiturn")
    data = {mode: _preprocess(mode, work / "data") for mode in ("tool", "interaction")}
    tok = AutoTokenizer.from_pretrained(str(QWEN))
    model = tiny_model(tok, vocab_size=len(tok))
    # Until the conversations are sampled as fitted at temperature 1. Embeddings frozen (the default), the
    # loss falls below 0.02 in about 140 steps, 15 s on 2 busy cores; trained, to 0.005 in 110 steps, 50 s.
    fit_conversations(model, _conversations(tok, data), steps=300, stop_below=0.02)
    model_dir = work / "model"
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    return work, data, model_dir


def _run(script: str, setup, mode: str, *overrides: str) -> tuple[subprocess.CompletedProcess, Path]:
    work, data, model_dir = setup
    run_dir = work / f"run-{mode}"
    env = {**os.environ, "PYTHON": sys.executable, "MODEL_PATH": str(model_dir), "DATA_DIR": str(data[mode])}
    env |= {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    extra = [f"trainer.default_local_dir={run_dir}", f"trainer.rollout_data_dir={run_dir}/rollout"]
    proc = subprocess.run(
        ["bash", str(EXAMPLE / script), *SIZES, *extra, *overrides],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, run_dir


def _step(run_dir: Path) -> tuple[dict, list[dict]]:
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    samples = [json.loads(line) for line in (run_dir / "rollout" / "1.jsonl").read_text().splitlines()]
    assert len(metrics) == 1
    return metrics[0], samples


def test_verls_gsm8k_tool_example_runs_one_step(setup):
    proc, run_dir = _run("run_qwen2.5-3b_gsm8k_multiturn.sh", setup, "tool")
    assert (
        "`actor_rollout_ref.rollout.name=sglang`: relm has no sglang engine; generating with relm's native"
        in proc.stderr
    )
    assert (
        "`verl.tools.gsm8k_tool.Gsm8kTool` runs as relm's built-in `relm.rollout.multi_turn.gsm8k.Gsm8kTool`"
        in proc.stderr
    )
    assert "starting 8 processes" in proc.stderr  # the script's own trainer.n_gpus_per_node=8
    metrics, samples = _step(run_dir)
    assert metrics["multi_turn/tool_calls/mean"] > 0, "the fitted model calls the tool"
    assert any("Current parsed answer='72' reward=1.0" in s["output"] for s in samples)
    assert metrics["critic/score/mean"] > 0, "a conversation that ends on `#### 72` scores"


def test_verls_gsm8k_interaction_example_runs_one_step(setup):
    proc, run_dir = _run(
        "run_qwen2.5-0.5b_gsm8k_multiturn_w_interaction.sh", setup, "interaction", INTERACTION_PROCESSES
    )
    assert (
        "Gsm8kInteraction` runs as relm's built-in `relm.rollout.multi_turn.gsm8k.Gsm8kInteraction`"
        in proc.stderr
    )
    assert "starting 2 processes" in proc.stderr
    metrics, samples = _step(run_dir)
    assert metrics["multi_turn/interaction_turns/mean"] > 0
    assert any(Gsm8kInteraction.INCORRECT in s["output"] for s in samples)
    assert any(Gsm8kInteraction.CORRECT in s["output"] for s in samples), [s["output"] for s in samples]
