"""A tiny model fitted to call a tool, and the turn-by-turn drift checks, shared by the engines' tests.

tests/integration/test_multi_turn_drift.py (native, hf) and tests/vllm/test_vllm_multi_turn.py (vLLM) run
the same conversation through different engines: a tiny Qwen2 with a real tokenizer's vocabulary, fitted
for a few seconds to one conversation (call the calculator in Hermes format, read its result, answer), so
that sampling at temperature 1 really produces tool calls. The checks: the ids trained on are the prompt,
the ids the engine sampled and the tool turns' template ids, which equal the template's ids of the whole
conversation; the response mask is 1 exactly on sampled tokens; the trainer's logprobs of those tokens
match the engine's within `logprob_tolerance` of the engine's dtype. `calc_task` writes the calculator task
that both run through `relm train`. `fit_conversations` is the one fit loop, also used by
tests/integration/test_verl_multiturn_gsm8k.py for its own conversations.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
import yaml
from torch import nn
from transformers import (
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from relm.data.prompt_batch import PromptBatch
from relm.models.tokenizer import _template_turn_end, preflight_tokenizer
from relm.rollout.base import GenerationOutput, logprob_tolerance
from relm.rollout.multi_turn.hermes import parse_tool_calls
from relm.rollout.multi_turn.render import ToolTurnRenderer
from relm.rollout.multi_turn.tools import Calculator
from relm.trainer.experience import batched_logprobs, build_rollout

REALWORLD = Path(__file__).resolve().parents[2] / "shared" / "realworld" / "tokenizers"
QWEN = REALWORLD / "qwen2.5"
QUESTION = "What is 12 * 7?"
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 7"}}\n</tool_call>'
RESULT = "84"
ANSWER = "The answer is 84."
DATE = {"date_string": "26 Jul 2024"}
"""Llama-3.2's template writes today's date into the prompt: a fixed one keeps the whole-conversation
rendering equal to the prompt's across midnight (relm's renderer stops its own clock). Other templates
ignore the variable."""
MODELS = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}


@dataclass(frozen=True)
class ToolCaller:
    """The fitted model and what its conversations are built from."""

    tokenizer: PreTrainedTokenizerBase
    model: nn.Module
    """In eval mode, fp32."""
    renderer: ToolTurnRenderer
    calculator: Calculator
    prompt: list[int]
    """QUESTION as the template's ids, tools listed, generation prompt added."""
    turn_end: int


EMBEDDING_STD = 0.3
"""The fit keeps the embeddings (tied: the LM head too) frozen at random values this wide and trains only the
layers: a step then takes about 0.1 s instead of 1-2 s (Adam over 151,936 x 128 embedding rows was most of
it), and the loss on the model's turns falls to about 0.03 per token in 40 steps. At transformers' 0.02
frozen rows give logits too flat to fit; trained ones made Adam at lr 1e-2 oscillate with head size 64
(loss 1.7-2.0 after 120 steps, measured)."""


def tiny_model(
    tok: PreTrainedTokenizerBase,
    *,
    family: str = "qwen2",
    vocab_size: int = 151_936,
    hidden_size: int = 64,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
) -> nn.Module:
    """A 2-layer Qwen2 (or Llama: `family`) with tied embeddings and the tokenizer's special ids, initialised
    from seed 0, so that each test that builds one gets the same one."""
    torch.manual_seed(0)
    config_class, model_class = MODELS[family]
    config = config_class(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=2,
        num_attention_heads=num_attention_heads, num_key_value_heads=num_key_value_heads,
        max_position_embeddings=1024, tie_word_embeddings=True, pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
    )  # fmt: skip
    return model_class(config)


def fit_conversations(
    model: nn.Module,
    conversations: list[tuple[list[int], list[int]]],
    *,
    steps: int,
    embedding_std: float | None = EMBEDDING_STD,
    stop_below: float | None = None,
) -> float:
    """Fit `model` (Adam, lr 1e-2, at most `steps` full-batch steps) to `conversations`, each (ids, trained):
    `trained[k]` is 1 where ids[k] is the model's to learn (its turns), 0 where it is only read (the prompt,
    tool and user turns). The loss is the sum over conversations of the mean cross-entropy of their trained
    tokens; the fit stops early once it is below `stop_below`.

    With `embedding_std`, the embeddings (tied: the LM head too) are drawn this wide and kept frozen during
    the fit (EMBEDDING_STD says why); with None they train. The model is left in eval mode with every weight
    trainable. Returns the last loss computed.
    """
    embeddings = model.get_input_embeddings().weight
    if embedding_std is not None:
        nn.init.normal_(embeddings, std=embedding_std)
        embeddings.requires_grad_(False)
    # The LM head only where the loss is (a few dozen of some hundreds of positions): the head over the
    # whole vocabulary at every position would be most of a step's time.
    batch = [
        (torch.tensor([ids]), torch.tensor(trained[1:], dtype=torch.bool).nonzero().squeeze(-1))
        for ids, trained in conversations
    ]  # the positions whose next token is trained
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    loss = torch.zeros(())
    for _ in range(steps):
        loss = torch.zeros(())
        for ids, positions in batch:
            hidden = model.model(input_ids=ids).last_hidden_state[0, positions]
            loss = loss + nn.functional.cross_entropy(model.lm_head(hidden), ids[0, positions + 1])
        if stop_below is not None and loss.item() < stop_below:
            break
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    embeddings.requires_grad_(True)  # trained as any weight from here on
    model.eval()
    return loss.item()


def fit_tool_caller(
    tokenizer_dir: Path = QWEN,
    *,
    hidden_size: int = 64,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    vocab_size: int = 151_936,
    family: str = "qwen2",
    steps: int = 40,
) -> ToolCaller:
    """A `tiny_model` with the tokenizer's vocabulary, fitted (`fit_conversations`, `steps` steps, embeddings
    frozen) to the conversation QUESTION -> CALL -> RESULT -> ANSWER, trained on the model's turns only.

    vLLM's CPU attention needs head size 64 or more: `hidden_size=128, num_attention_heads=2` gives it.
    `vocab_size` (embedding rows) defaults to Qwen2.5's, more than its tokenizer's length, as real models have.
    """
    tok = preflight_tokenizer(
        AutoTokenizer.from_pretrained(str(tokenizer_dir)), name=Path(tokenizer_dir).name
    )
    calc = Calculator()
    turn_end = _template_turn_end(tok)
    assert turn_end is not None, "the template closes assistant turns with a special token"
    renderer = ToolTurnRenderer(tok, turn_end, chat_template_kwargs={"tools": [calc.schema], **DATE})
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": QUESTION}],
        tools=[calc.schema],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
        **DATE,
    )
    turn1 = tok.encode(CALL, add_special_tokens=False) + [turn_end]
    tool = renderer.suffix_ids([RESULT])
    turn2 = tok.encode(ANSWER, add_special_tokens=False) + [turn_end]
    ids = prompt + turn1 + tool + turn2
    trained = [0] * len(prompt) + [1] * len(turn1) + [0] * len(tool) + [1] * len(turn2)
    model = tiny_model(
        tok, family=family, vocab_size=vocab_size, hidden_size=hidden_size,
        num_attention_heads=num_attention_heads, num_key_value_heads=num_key_value_heads,
    )  # fmt: skip
    fit_conversations(model, [(ids, trained)], steps=steps)
    return ToolCaller(tok, model, renderer, calc, list(prompt), turn_end)


REWARD_FILE = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    # The whole conversation arrives, tool result included: score the last assistant turn only.
    last = solution_str.rsplit("assistant\\n", 1)[-1]
    return float(ground_truth in last and "<tool_call>" not in last)
"""
"""The calculator task's reward: the answer in the last assistant turn, which calls no tool."""


def calc_task(
    folder: Path,
    model_dir: Path,
    *,
    tool_class: str = f"{Calculator.__module__}.{Calculator.__name__}",
    rows: int = 2,
    tools_kwargs: bool = False,
    steps: int = 1,
) -> list[str]:
    """Write the calculator task of a `relm train` run into `folder` (tools.yaml listing `tool_class` with the
    calculator's schema, `rows` rows asking QUESTION in train.parquet, REWARD_FILE in reward.py) and return
    the overrides of a GRPO run on it with verl's multi-turn keys: `steps` steps of 2 prompts x 4
    conversations, validated on the same rows after the last step.

    `tools_kwargs` gives each row verl's `tools_kwargs` for the calculator (create_kwargs ground_truth "84").
    The run folder and the engine are the caller's to add.
    """
    (folder / "reward.py").write_text(REWARD_FILE)
    tools = folder / "tools.yaml"
    entry = {"class_name": tool_class, "config": {}, "tool_schema": Calculator().schema}
    tools.write_text(yaml.safe_dump({"tools": [entry]}, sort_keys=False))
    extra = (
        {"tools_kwargs": {"calculator": {"create_kwargs": {"ground_truth": RESULT}}}} if tools_kwargs else {}
    )
    table = [
        {
            "data_source": "calc",
            "prompt": [{"role": "user", "content": QUESTION}],
            "reward_model": {"style": "rule", "ground_truth": RESULT},
            "extra_info": {"index": i, **extra},
        }
        for i in range(rows)
    ]
    data = folder / "train.parquet"
    pq.write_table(pa.Table.from_pylist(table), data)
    ro = "actor_rollout_ref.rollout"
    return [
        f"actor_rollout_ref.model.path={model_dir}",
        f"data.train_files={data}",
        f"data.val_files={data}",
        "data.max_prompt_length=256",
        "data.max_response_length=96",
        "data.train_batch_size=2",
        "algorithm.adv_estimator=grpo",
        f"{ro}.n=4",
        f"{ro}.multi_turn.enable=true",
        f"{ro}.multi_turn.tool_config_path={tools}",
        f"{ro}.multi_turn.max_assistant_turns=3",
        f"custom_reward_function.path={folder / 'reward.py'}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=false",
        f"trainer.test_freq={steps}",
        f"trainer.validation_data_dir={folder / 'val'}",
        "trainer.logger=[jsonl]",
        f"trainer.rollout_data_dir={folder / 'rollout'}",
    ]


def runs_of(ids: list[int], model_mask: list[int]) -> list[tuple[int, list[int]]]:
    """The response split into runs of sampled (1) and appended (0) tokens, in order."""
    runs, start = [], 0
    for t in range(1, len(ids) + 1):
        if t == len(ids) or model_mask[t] != model_mask[start]:
            runs.append((model_mask[start], ids[start:t]))
            start = t
    return runs


def check_tool_turns(caller: ToolCaller, gen: GenerationOutput) -> tuple[int, int]:
    """Assert, row by row, that each response is sampled turns and tool turns whose ids are the template's.

    Returns:
        (tool turns seen, rows whose whole conversation was checked against the template's rendering);
        a row is checked whole where each sampled turn re-encodes to itself and the tool was called right.
    """
    tok, renderer, turn_end = caller.tokenizer, caller.renderer, caller.turn_end
    tool_turns = whole_checked = 0
    for row in range(gen.response_ids.shape[0]):
        length = int(gen.response_mask[row].sum())
        ids = gen.response_ids[row, :length].tolist()
        assert gen.model_mask is not None
        model_mask = gen.model_mask[row, :length].tolist()
        assert gen.model_mask[row, length:].sum() == 0
        runs = runs_of(ids, model_mask)
        assert runs[0][0] == 1
        messages = [{"role": "user", "content": QUESTION}]
        tool_ok = False
        calls = []
        for k, (sampled, segment) in enumerate(runs):
            if sampled:
                text = tok.decode(segment, skip_special_tokens=True)
                messages.append({"role": "assistant", "content": text})
                if k + 1 < len(runs):  # a tool turn follows: the turn ended at the turn end with a call
                    assert segment[-1] == turn_end
                    calls = parse_tool_calls(text)
                    assert calls
            else:
                tool_turns += 1
                results = ["84" if c.name == "calculator" and c.error is None else None for c in calls[:1]]
                if results[0] is not None and calls[0].arguments.get("expression") == "12 * 7":
                    assert segment == renderer.suffix_ids(results)  # the tool's ids are the template's
                    tool_ok = True
                assert gen.logprobs[row, :length][torch.tensor(model_mask) == 0].abs().sum() == 0
        # Where every sampled turn re-encodes to itself (and Llama's template, which trims a message, has
        # nothing to trim), the whole equals the template's rendering.
        sampled_runs = [segment for sampled, segment in runs if sampled]
        said = [m["content"] for m in messages if m["role"] == "assistant"]
        stable = all(
            text == text.strip() and tok.encode(text, add_special_tokens=False) + [turn_end] == segment
            for text, segment in zip(said, sampled_runs, strict=True)
        )
        if stable and len(runs) == 3 and tool_ok:
            full = messages[:2] + [{"role": "tool", "content": RESULT}] + messages[2:]
            whole = tok.apply_chat_template(
                full, tools=[caller.calculator.schema], tokenize=True, return_dict=False, **DATE
            )
            assert caller.prompt + ids == whole[: len(caller.prompt) + length]
            whole_checked += 1
    return tool_turns, whole_checked


def trainer_logprob_gap(
    caller: ToolCaller, prompts: list[list[int]], gen: GenerationOutput, n: int, dtype: torch.dtype
) -> tuple[float, float]:
    """Assert that the trainer's logprobs of the model's tokens match the engine's within
    `logprob_tolerance(dtype)`, and that the trainer's masks are the rollout's: the loss covers the
    sampled tokens, the forward attends every response token.

    Returns:
        (max, mean) |trainer - engine| over the sampled tokens.
    """
    tok = caller.tokenizer
    num = len(prompts)
    batch = build_rollout(
        PromptBatch(prompts, ["t"] * num, [None] * num, [{}] * num, list(range(num))),
        gen,
        n=n,
        pad_token_id=tok.pad_token_id,
    )
    assert gen.model_mask is not None
    assert torch.equal(batch.response_mask, gen.model_mask)
    assert torch.equal(batch.response_attention_mask, gen.response_mask)
    trainer = batched_logprobs(
        caller.model,
        batch,
        rows_per_forward=num * n,
        temperature=1.0,
        device=torch.device("cpu"),
        vocab_limit=len(tok),
    )
    diff = (trainer - gen.logprobs)[batch.response_mask.bool()].abs()
    max_tol, mean_tol = logprob_tolerance(dtype)
    worst, mean = diff.max().item(), diff.mean().item()
    assert worst < max_tol and mean < mean_tol, (worst, mean)
    return worst, mean
