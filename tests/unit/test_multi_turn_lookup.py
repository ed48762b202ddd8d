"""The lookup task's pieces (tokenizer, tool, scorer, files) and the multi-turn metrics, with a scripted
engine: a `RolloutEngine` that writes given turns, so every count below is known in advance."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pyarrow.parquet as pq
import pytest
import torch

from relm.data.prompt_batch import PromptBatch
from relm.models.lookup_tokenizer import LOOKUP_CALL, LOOKUP_LETTERS, build_lookup_tokenizer
from relm.models.tokenizer import _template_turn_end
from relm.models.zoo import materialize_zoo
from relm.rewards.registry import default_compute_score
from relm.rollout.base import GenerationOutput, SamplingParams
from relm.rollout.multi_turn.driver import MultiTurnLimits, MultiTurnRollout
from relm.rollout.multi_turn.lookup import LOOKUP_DATA_SOURCE, Lookup, write_lookup_task
from relm.rollout.multi_turn.render import ToolTurnRenderer
from relm.rollout.multi_turn.tools import ToolContext, ToolResult, load_tools, run_tool
from relm.trainer.experience import build_rollout


@pytest.fixture(scope="module")
def tok():
    return build_lookup_tokenizer()


def test_the_call_and_role_lines_are_single_tokens_and_a_tool_turn_is_six(tok):
    call = tok.encode(LOOKUP_CALL, add_special_tokens=False)
    assert len(call) == 1 and tok.decode(call) == LOOKUP_CALL
    assert all(len(tok.encode(letter, add_special_tokens=False)) == 1 for letter in LOOKUP_LETTERS)
    turn_end = _template_turn_end(tok)
    assert turn_end == tok.eos_token_id
    suffix = ToolTurnRenderer(tok, turn_end).suffix_ids(["c"])
    assert tok.convert_ids_to_tokens(suffix) == [
        "<|im_start|>",
        "tool\n",
        "c",
        "<|im_end|>",
        "<|im_start|>",
        "assistant\n",
    ]
    # The folder the zoo writes loads (as transformers' Qwen2Tokenizer) to the same ids.
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(materialize_zoo("zoo:tiny/qwen2-lookup"))
    text = tok.apply_chat_template(
        [{"role": "user", "content": "?"}], add_generation_prompt=True, tokenize=False
    )
    assert loaded.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)
    assert len(loaded) == len(tok) == 16


def test_lookup_answers_the_rows_letter_and_says_when_it_has_none():
    tool = Lookup()
    context = ToolContext(row=0, kwargs={"create_kwargs": {"letter": "e"}})
    assert asyncio.run(run_tool(tool, {}, context)).text == "e"
    missing = asyncio.run(run_tool(tool, {}, ToolContext(row=0)))
    assert missing.error == "no_key" and missing.text.startswith("error:")


def test_the_score_is_one_only_for_the_right_letter_after_a_tool_turn():
    real = f"{LOOKUP_CALL}tool\ncassistant\nc"
    assert default_compute_score(LOOKUP_DATA_SOURCE, real, "c", {"num_turns": 4}) == 1.0
    assert default_compute_score(LOOKUP_DATA_SOURCE, real, "d", {"num_turns": 4}) == 0.0
    assert default_compute_score(LOOKUP_DATA_SOURCE, real + "c", "c", {"num_turns": 4}) == 0.0
    # A right guess with no tool turn scores 0, also when the model wrote the role lines itself.
    assert default_compute_score(LOOKUP_DATA_SOURCE, "c", "c", {"num_turns": 2}) == 0.0
    assert default_compute_score(LOOKUP_DATA_SOURCE, "tool\ncassistant\nc", "c", {"num_turns": 2}) == 0.0
    assert default_compute_score(LOOKUP_DATA_SOURCE, "c", "c", None) == 0.0


def test_the_task_files_hold_random_letters_only_the_tool_sees(tmp_path):
    paths = write_lookup_task(tmp_path, num_train=300, num_val=20)
    rows = pq.read_table(paths["train"]).to_pylist()
    letters = [row["reward_model"]["ground_truth"] for row in rows]
    assert {row["prompt"][0]["content"] for row in rows} == {"?"}  # the prompt tells nothing
    assert set(letters) == set(LOOKUP_LETTERS) and max(letters.count(x) for x in LOOKUP_LETTERS) < 80
    assert all(
        row["extra_info"]["tools_kwargs"]["lookup"]["create_kwargs"]["letter"] == letter
        for row, letter in zip(rows, letters, strict=True)
    )
    assert list(load_tools(str(paths["tools"]))) == ["lookup"]


class ScriptedEngine:
    """Writes `turns[row][k]` as row's k-th turn (rows in the order the driver passes them)."""

    def __init__(self, turns: list[list[list[int]]]) -> None:
        self.turns, self.calls = turns, 0
        self.open_rows: list[int] = list(range(len(turns)))

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> GenerationOutput:
        written = [self.turns[row][self.calls] for row in self.open_rows]
        self.calls += 1
        width = params.max_new_tokens
        ids = torch.zeros((len(written), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for k, turn in enumerate(written):
            ids[k, : len(turn)] = torch.tensor(turn)
            mask[k, : len(turn)] = 1
        self.open_rows = [
            r
            for r, turn in zip(self.open_rows, written, strict=True)
            if turn[-1] == 2 and len(turn) > 1 and turn[0] == 11
        ]
        return GenerationOutput(ids, mask, -mask.float(), ["stop"] * len(written))

    def sync_weights(self, named_tensors: Any) -> None: ...

    def release_memory(self) -> None: ...


class SlowLookup(Lookup):
    def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        time.sleep(0.05)
        if context.kwargs.get("create_kwargs", {}).get("letter") == "f":
            return ToolResult("error: timed out", error="timeout")
        return super().execute(arguments, context)


def test_turns_calls_errors_time_and_token_split_are_counted_and_reach_the_reward(tok):
    call, end = tok.convert_tokens_to_ids([LOOKUP_CALL, "<|im_end|>"])
    a, c = tok.convert_tokens_to_ids(["a", "c"])
    assert (call, end) == (11, 2)  # what ScriptedEngine's open-row rule reads
    turns = [
        [[call, end], [call, end], [c, end]],  # two calls, then an answer: 6 turns
        [[a, end]],  # answers at once: 2 turns
        [[call, end], [a, end]],  # one call (a timeout), then an answer: 4 turns
    ]
    engine = ScriptedEngine(turns)
    renderer = ToolTurnRenderer(tok, end)
    rollout = MultiTurnRollout(
        engine, tok, renderer, {"lookup": SlowLookup()}, MultiTurnLimits(), tok.pad_token_id
    )
    kwargs = [{"lookup": {"create_kwargs": {"letter": x}}} for x in ("c", "a", "f")]
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "?"}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    out = rollout.generate([prompt] * 3, SamplingParams(n=1, max_new_tokens=32), kwargs)
    m = out.metrics
    # model + tool turns + 1
    assert [extra["num_turns"] for extra in out.generation.extra_fields] == [6, 2, 4]
    assert (m["num_turns/min"], m["num_turns/max"], m["num_turns/mean"]) == (2.0, 6.0, 4.0)
    assert m["multi_turn/assistant_turns/max"] == 3.0 and m["multi_turn/tool_calls/mean"] == 1.0
    assert m["multi_turn/tool_errors"] == 1.0 and m["multi_turn/tool_timeouts"] == 1.0
    tool_ids = 6  # each tool turn: im_start, "tool\n", the text, im_end, im_start, "assistant\n"
    assert m["multi_turn/model_tokens/mean"] == (6 + 2 + 4) / 3
    assert (
        m["multi_turn/tool_tokens/mean"]
        == (2 * tool_ids + (tool_ids + len(tok.encode("error: timed out", add_special_tokens=False)) - 1)) / 3
    )
    # Per conversation, the seconds its tool calls took (verl's agent_loop/tool_calls timer).
    assert m["agent_loop/tool_calls/min"] == 0.0 and 0.1 <= m["agent_loop/tool_calls/max"] < 1.0
    assert 0.05 <= m["multi_turn/tool_time_s"] / 3 < 1.0

    # verl's extra_info["num_turns"] reaches the reward function, per response (the rows stay unshared).
    rows = [{"index": i} for i in range(3)]
    prompts = PromptBatch([prompt] * 3, [LOOKUP_DATA_SOURCE] * 3, ["c", "a", "f"], rows, list(range(3)))
    batch = build_rollout(prompts, out.generation, n=1, pad_token_id=tok.pad_token_id)
    assert [info["num_turns"] for info in batch.extra_infos] == [6, 2, 4] and "num_turns" not in rows[0]
    texts = tok.batch_decode(batch.response_ids * batch.response_attention_mask, skip_special_tokens=True)
    scores = [
        default_compute_score(s, t, g, i)
        for s, t, g, i in zip(batch.data_sources, texts, batch.ground_truths, batch.extra_infos, strict=True)
    ]
    assert scores == [1.0, 0.0, 0.0]  # right after a call; a right guess; a wrong answer after a timeout
