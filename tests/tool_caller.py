"""A tiny model fitted to call a tool, and the turn-by-turn drift checks, shared by the engines' tests.

tests/integration/test_multi_turn_drift.py (native, hf) and tests/vllm/test_vllm_multi_turn.py (vLLM) run
the same conversation through different engines: a tiny Qwen2 with a real tokenizer's vocabulary, fitted
for a few seconds to one conversation (call the calculator in Hermes format, read its result, answer), so
that sampling at temperature 1 really produces tool calls. The checks: the ids trained on are the prompt,
the ids the engine sampled and the tool turns' template ids, which equal the template's ids of the whole
conversation; the response mask is 1 exactly on sampled tokens; the trainer's logprobs of those tokens
match the engine's within `logprob_tolerance` of the engine's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import (
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from relm.data.records import PromptBatch
from relm.models.tokenizer import _template_turn_end, preflight_tokenizer
from relm.rollout.base import GenerationOutput, logprob_tolerance
from relm.rollout.multi_turn.hermes import parse_tool_calls
from relm.rollout.multi_turn.render import ToolTurnRenderer
from relm.rollout.multi_turn.tools import Calculator
from relm.trainer.experience import batched_logprobs, build_experience

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
    """A 2-layer Qwen2 (or Llama: `family`) with the tokenizer's vocabulary, fitted (Adam, lr 1e-2, `steps`
    full-batch steps) to the conversation QUESTION -> CALL -> RESULT -> ANSWER, trained on the model's turns only.

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
    ids = torch.tensor([prompt + turn1 + tool + turn2])
    trained = torch.zeros(ids.shape[1], dtype=torch.bool)
    trained[len(prompt) : len(prompt) + len(turn1)] = True
    trained[len(prompt) + len(turn1) + len(tool) :] = True
    positions = trained[1:].nonzero().squeeze(-1)  # the positions whose next token is the model's
    torch.manual_seed(0)
    config_class, model_class = MODELS[family]
    config = config_class(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=2,
        num_attention_heads=num_attention_heads, num_key_value_heads=num_key_value_heads,
        max_position_embeddings=1024, tie_word_embeddings=True, pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
    )  # fmt: skip
    model = model_class(config)
    embeddings = model.get_input_embeddings().weight
    nn.init.normal_(embeddings, std=EMBEDDING_STD)
    embeddings.requires_grad_(False)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(steps):
        # The LM head only where the loss is: 31 of about 250 positions.
        hidden = model.model(input_ids=ids).last_hidden_state[0, positions]
        loss = nn.functional.cross_entropy(model.lm_head(hidden), ids[0, positions + 1])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    embeddings.requires_grad_(True)  # trained as any weight from here on
    model.eval()
    return ToolCaller(tok, model, renderer, calc, list(prompt), turn_end)


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
    batch = build_experience(
        PromptBatch(prompts, ["t"] * num, [None] * num, [{}] * num, list(range(num))),
        gen,
        n=n,
        pad_token_id=tok.pad_token_id,
    )
    assert gen.model_mask is not None
    assert torch.equal(batch.response_mask, gen.model_mask)
    assert torch.equal(batch.response_tokens, gen.response_mask)
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
