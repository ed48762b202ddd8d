"""Two GRPO steps on real GSM8K rows with each of the four real tokenizers (../shared/realworld), through
the real entry point: the prompt ids are the chat template's, an end-of-turn token the model really
emits ends a response with finish reason `stop`, and no response holds an id the tokenizer lacks.

The model is a 2-layer random model of the family's architecture with the family's embedding rows
(Qwen2.5 151,936 for 151,665 tokens; Phi-3 32,064 for 32,011) and special-token ids, rigged so its
next-token distribution is the same at every position: the attention and MLP outputs are zeroed and
every embedding row is the same vector, so the last hidden state is one fixed vector and the output
head alone sets the logits. The head gives the end-of-turn token about a quarter of the probability
and every embedding row past the tokenizer's length a logit far above the rest: a sampler that did
not clamp the vocabulary would draw those ids at nearly every step.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    MistralConfig,
    Phi3Config,
    PretrainedConfig,
    Qwen2Config,
)

from relm.rollout.base import FINISH_STOP, GenerationOutput
from relm.rollout.hf_engine import HFRolloutEngine
from relm.rollout.native.engine import NativeRolloutEngine

REALWORLD = Path(__file__).resolve().parents[3] / "shared" / "realworld"
LLAMA_DATE = "26 Jul 2024"
"""Llama 3's template writes today's date unless given one; a fixed date keeps the prompts reproducible."""
END_OF_TURN_SHARE = 0.25
"""Probability of the end-of-turn token at each step, so most 16-token responses stop and some do not."""
PAST_VOCABULARY_LOGIT = 30.0
"""Logit of every embedding row past the tokenizer's length: unclamped, they would win every draw."""


@dataclass(frozen=True)
class Family:
    folder: str
    config: type[PretrainedConfig]
    embedding_rows: int
    """The published checkpoints' vocab_size (rows of the embedding and output head)."""
    end_of_turn: str
    """The token the chat template closes an assistant turn with."""
    chat_template_kwargs: dict[str, str]
    generation_eos: list[str] | None = None
    """Tokens written as a list into generation_config.json's eos_token_id (None: the tokenizer's eos)."""


FAMILIES = {
    "qwen2.5": Family("qwen2.5", Qwen2Config, 151_936, "<|im_end|>", {}),
    # Llama 3.2's generation_config.json lists three stop ids; the template's turn end is one of them.
    "llama3.2": Family(
        "llama3.2",
        LlamaConfig,
        128_256,
        "<|eot_id|>",
        {"date_string": LLAMA_DATE},
        ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"],
    ),
    # Phi-3's eos is <|endoftext|>; its turns end with <|end|>, found only by reading the template.
    "phi3": Family("phi3", Phi3Config, 32_064, "<|end|>", {}),
    "mistral-nemo": Family("mistral-nemo", MistralConfig, 131_072, "</s>", {}),
}


def gsm8k_rows(num_rows: int = 8) -> list[dict[str, Any]]:
    """The first GSM8K train rows in verl's parquet layout (as verl's gsm8k preprocessing writes them)."""
    rows = []
    with (REALWORLD / "data" / "gsm8k" / "train.jsonl").open(encoding="utf-8") as lines:
        for index, line in zip(range(num_rows), lines, strict=False):
            record = json.loads(line)
            instruction = 'Let\'s think step by step and output the final answer after "####".'
            rows.append(
                {
                    "data_source": "openai/gsm8k",
                    "prompt": [{"role": "user", "content": f"{record['question']} {instruction}"}],
                    "ability": "math",
                    "reward_model": {
                        "style": "rule",
                        "ground_truth": record["answer"].split("####")[-1].strip(),
                    },
                    "extra_info": {"split": "train", "index": index},
                }
            )
    return rows


def template_ids(tokenizer: Any, messages: list[dict[str, str]], **kwargs: str) -> list[int]:
    return list(
        tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False, **kwargs
        )
    )


def build_model_folder(family: Family, folder: Path, *, head_dim: int = 64) -> Any:
    """Save the family's tokenizer and a rigged 2-layer random model beside it; returns the tokenizer."""
    tokenizer = AutoTokenizer.from_pretrained(REALWORLD / "tokenizers" / family.folder)
    num_tokens = len(tokenizer)
    end_of_turn = tokenizer.convert_tokens_to_ids(family.end_of_turn)
    config = family.config(
        vocab_size=family.embedding_rows,
        hidden_size=2 * head_dim,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                parameter.zero_()  # the residual stream stays the token's embedding
        model.get_input_embeddings().weight.fill_(1.0)  # ... which is the same for every token
        head = (
            model.get_output_embeddings().weight
        )  # logit of id i = sum(head[i]) * norm(ones) = sum(head[i])
        head.zero_()
        # softmax share of end-of-turn p among (num_tokens - 1) zero logits: e^L = p / (1 - p) * (num_tokens - 1)
        logit = math.log(END_OF_TURN_SHARE / (1 - END_OF_TURN_SHARE) * (num_tokens - 1))
        head[end_of_turn] = logit / config.hidden_size
        head[num_tokens:] = PAST_VOCABULARY_LOGIT / config.hidden_size
    if family.generation_eos is not None:
        model.generation_config = GenerationConfig(
            eos_token_id=tokenizer.convert_tokens_to_ids(family.generation_eos),
            bos_token_id=tokenizer.bos_token_id,
        )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return tokenizer


@dataclass
class Generated:
    prompts: list[list[int]]
    output: GenerationOutput


def record_generations(monkeypatch: pytest.MonkeyPatch, engine_class: type) -> list[Generated]:
    """Every `generate` call of `engine_class` during the run, with its prompts and outputs (the real
    engine runs; this only keeps what it was given and returned)."""
    calls: list[Generated] = []
    original = engine_class.generate

    def generate(self: Any, prompts: list[list[int]], params: Any) -> GenerationOutput:
        output = original(self, prompts, params)
        calls.append(Generated([list(p) for p in prompts], output))
        return output

    monkeypatch.setattr(engine_class, "generate", generate)
    return calls


@pytest.fixture(scope="module")
def model_folders(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Family], tuple[Path, Any]]:
    """`folder_of(family)` -> (model folder, tokenizer), built once a module per family: loading a real
    tokenizer takes seconds, and both engines' runs read the same folder."""
    built: dict[str, tuple[Path, Any]] = {}

    def folder_of(family: Family) -> tuple[Path, Any]:
        if not (REALWORLD / "tokenizers" / family.folder).is_dir():
            pytest.skip(f"{REALWORLD} is not on this machine")
        if family.folder not in built:
            folder = tmp_path_factory.mktemp(family.folder)
            built[family.folder] = folder, build_model_folder(family, folder)
        return built[family.folder]

    return folder_of


def run_two_grpo_steps(
    train: Callable[..., Any], tmp_path: Path, model_dir: Path, tokenizer: Any, family: Family, engine: str
) -> tuple[Any, list[list[int]]]:
    """GSM8K parquet and the run; returns (run result, expected prompt ids)."""
    rows = gsm8k_rows()
    data = tmp_path / "gsm8k.parquet"
    pq.write_table(pa.Table.from_pylist(rows), data)
    kwargs = [f"data.apply_chat_template_kwargs.{k}={v}" for k, v in family.chat_template_kwargs.items()]
    result = train(
        f"actor_rollout_ref.model.path={model_dir}",
        f"data.train_files={data}",
        "data.max_prompt_length=512",
        "data.max_response_length=16",
        "data.train_batch_size=4",
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.n=2",
        f"actor_rollout_ref.rollout.name={engine}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "trainer.total_training_steps=2",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.logger=[jsonl]",
        f"trainer.rollout_data_dir={tmp_path / 'rollout'}",
        *kwargs,
        tiny=False,
    )
    expected = [template_ids(tokenizer, row["prompt"], **family.chat_template_kwargs) for row in rows]
    return result, expected


def check_generations(
    calls: list[Generated], tokenizer: Any, family: Family, expected: list[list[int]]
) -> None:
    """What every engine must show: template prompt ids, stop at the turn's end, decodable responses."""
    assert len(calls) == 2  # one rollout per GRPO step, no validation
    end_of_turn = tokenizer.convert_tokens_to_ids(family.end_of_turn)
    stopped = 0
    for call in calls:
        for prompt in call.prompts:
            assert prompt in expected, tokenizer.decode(prompt)
        out = call.output
        for row, reason in enumerate(out.finish_reasons):
            ids = out.response_ids[row][out.response_mask[row].bool()].tolist()
            assert max(ids) < len(tokenizer), f"id {max(ids)} is past the tokenizer's {len(tokenizer)}"
            assert isinstance(tokenizer.decode(ids), str)
            if reason == FINISH_STOP:
                assert ids[-1] == end_of_turn, tokenizer.convert_ids_to_tokens(ids[-3:])
                stopped += 1
            else:
                assert len(ids) == out.response_ids.shape[1] and end_of_turn not in ids
    # 16 rows of 16 steps at a 1/4 chance a step: all 16 running to length has odds 1e-32.
    assert stopped > 0


@pytest.mark.parametrize("engine", ["native", "hf"])
@pytest.mark.parametrize("name", list(FAMILIES))
def test_two_grpo_steps_on_gsm8k_with_a_real_tokenizer(
    train, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_folders, name: str, engine: str
) -> None:
    family = FAMILIES[name]
    model_dir, tokenizer = model_folders(family)
    calls = record_generations(monkeypatch, NativeRolloutEngine if engine == "native" else HFRolloutEngine)

    result, expected = run_two_grpo_steps(train, tmp_path, model_dir, tokenizer, family, engine)

    assert result.exit_code == 0, result.stderr
    assert [record["step"] for record in result.metrics] == [1, 2]
    assert all(math.isfinite(record["actor/pg_loss"]) for record in result.metrics)
    # The trainer's logprobs normalise over the tokenizer's ids as the engine samples them; unclamped, the
    # rows past the tokenizer (logit 30) would put it tens of nats apart for Qwen2.5 and Phi-3.
    assert all(record["rollout/logprob_diff_max"] < 1e-3 for record in result.metrics)
    check_generations(calls, tokenizer, family, expected)
    if family.chat_template_kwargs:
        assert LLAMA_DATE in tokenizer.decode(calls[0].prompts[0])
    if tokenizer.bos_token_id is not None and expected[0][0] == tokenizer.bos_token_id:
        assert all(prompt[1] != tokenizer.bos_token_id for call in calls for prompt in call.prompts)
    if name in ("llama3.2", "mistral-nemo"):  # they name no pad token: relm chose one and said which
        assert "has no pad token: padding with" in result.stderr
    # The sample dumps a person reads: the prompt as the template rendered it around the GSM8K question,
    # the response as text, the score; one file a step, one line a response.
    questions = [row["prompt"][0]["content"][:80] for row in gsm8k_rows()]
    for step in (1, 2):
        lines = (tmp_path / "rollout" / f"{step}.jsonl").read_text(encoding="utf-8").splitlines()
        assert len(lines) == 4 * 2
        for line in map(json.loads, lines):
            assert any(question in line["input"] for question in questions), line["input"][:200]
            assert isinstance(line["output"], str) and "\ufffd" not in line["input"]
            assert isinstance(line["score"], float) and line["step"] == step
