"""Reward models in real runs through the entry point: a sequence classifier and a relm-exported critic
score rollouts, a reward model fitted in the test drives PPO on the demo task, and an LLM judge scores.

Every model is built here from the tiny zoo Qwen2's config and character tokenizer (no download).
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

from relm.data.demo_task import DEMO_LETTERS, letter_share_score
from relm.models.loading import resolve_model_dir
from relm.models.tokenizer import encode_prompt, load_tokenizer
from relm.rewards.reward_model import classifier_head
from relm.trainer.export import export_checkpoint

pytestmark = pytest.mark.integration

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")

REQUIRED_RISE = 0.05
"""Rise of the demo's rule score (mean of the last 5 steps minus the first 5, which is about 0.015) that the
fitted reward model must drive (grpo, 50 steps, one torch thread, the reward model fitted `RM_FIT_STEPS` steps).

Why the rise differs between machines (measured 2026-12-05 on the 2-core VM, AMD EPYC with AVX-512, with
the CPU inverse-CDF sampler): the reward model is fitted in the test, at a fixed seed, and the fit is
chaotic. Run as a CPU without AVX-512 runs it (`ATEN_CPU_CAPABILITY=avx2`: other vector kernels, logits
that differ by ~4e-7), its 800 optimizer steps end in another reward model (parameters up to 0.39 apart; so
does a float64 fit, tried: 0.30). The AVX2-fitted one pays the prompt-blind plateau more: responses of
8 times a wrong demo letter score 0.27 on average under it against 0.17 under the AVX-512 one (right
letter 0.95 and 0.96, held-out error 0.005 and 0.003). PPO climbs to that plateau first, and with the
AVX2 reward model it settles there. The PPO run itself is not what differs: the AVX-512 run of seed 1
with the AVX2-fitted reward model rose 0.168, with its own 0.64. Nothing in relm's numerics takes another
branch (no argmax, tie-break or threshold is involved; GRPO's std epsilon sees score spreads of ~1.5e-8
for identical responses under both).

Rises measured: AVX-512 seeds 1-3 0.64, 0.60, 0.50 (rule score by tens of steps for seed 1: 0.02, 0.06,
0.32, 0.60, 0.68); AVX2 seed 1 0.116 (0.02, 0.10, 0.13, 0.21, 0.17), seed 2 0.157 (measured earlier on
the same VM, issue 37). The bound sits below the smallest with margin; it still asks the rule score to more
than quadruple from its start.
Before (exponential-race sampler, reward model fitted 300 steps): seeds 1-5 rose 0.25, 0.13, 0.21, 0.03,
0.28, in seed 4 the reward model's score rising to 0.91 while the rule score fell back to 0.04.
Thread count: the tiny model's logits and gradients are bitwise equal with 1 and 2 torch threads."""
RM_FIT_STEPS = 800
"""Optimizer steps of the reward model's fit (64 examples each): 300 left it exploitable (see above)."""


def tiny_classifier(folder: Path, seed: int = 0) -> Path:
    """A random one-label Qwen2 sequence classifier shaped like the tiny zoo Qwen2, with its tokenizer."""
    source = Path(resolve_model_dir("zoo:tiny/qwen2"))
    config = AutoConfig.from_pretrained(source)
    config.num_labels = 1
    torch.manual_seed(seed)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(folder)
    for name in TOKENIZER_FILES:
        shutil.copy(source / name, folder / name)
    return folder


def _steps(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return sorted((json.loads(line) for line in lines if line.strip()), key=lambda r: r["step"])


def test_sequence_classifier_scores_rollouts(train: Callable, tmp_path: Path) -> None:
    rm = tiny_classifier(tmp_path / "rm")
    dumps = tmp_path / "dumps"
    result = train(
        "reward_model.enable=true",
        f"reward_model.model.path={rm}",
        "reward_model.micro_batch_size_per_gpu=3",  # 8 responses a step: 3 forwards, the last one short
        f"trainer.rollout_data_dir={dumps}",
    )

    assert result.exit_code == 0, result.stderr
    for record in result.metrics:
        # The model's score is the reward; the demo's rule score is logged beside it.
        assert record["critic/score/mean"] == pytest.approx(record["reward_extra/rm_score/mean"], abs=1e-6)
        assert 0.0 <= record["reward_extra/rule_score/mean"] <= 1.0
    rows = [json.loads(line) for line in (dumps / "1.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 8
    # A random classifier gives each response its own score, and the dumps carry the rule score per row.
    assert len({round(row["score"], 6) for row in rows}) > 1
    for row in rows:
        assert row["rm_score"] == pytest.approx(row["score"], abs=1e-6)
        assert row["rule_score"] == pytest.approx(letter_share_score(row["output"], row["gts"]), abs=1e-6)


def test_rerendered_input_matches_the_policys_ids_score(train: Callable, tmp_path: Path) -> None:
    """`input_tokenizer` set: the text is re-rendered in the reward model's template (here the same
    ChatML), which adds the closing `<|im_end|>\\n` the policy's ids may lack; the run still scores."""
    rm = tiny_classifier(tmp_path / "rm")
    result = train(
        "reward_model.enable=true",
        f"reward_model.model.path={rm}",
        "reward_model.model.input_tokenizer=zoo:tiny/qwen2",
        "reward_model.max_length=24",
    )

    assert result.exit_code == 0, result.stderr
    assert all("reward_extra/rm_score/mean" in record for record in result.metrics)


def test_exported_critic_scores_rollouts(train: Callable, tmp_path: Path, varied_reward: str) -> None:
    # A reward that varies between responses trains the critic: the demo's rule scored every response of
    # the two steps 0 at some seeds (the CPU sampler's draws at the default seed), leaving a critic whose
    # values are all equal.
    critic_run = train("algorithm.adv_estimator=gae", "trainer.save_freq=2", varied_reward)
    assert critic_run.exit_code == 0, critic_run.stderr
    exported = tmp_path / "exported"
    export_checkpoint(critic_run.run_dir / "global_step_2", exported, critic=True)

    result = train(
        "reward_model.enable=true",
        f"reward_model.model.path={exported / 'critic'}",
        "trainer.total_training_steps=1",
    )

    assert result.exit_code == 0, result.stderr
    (record,) = result.metrics
    # The trained critic's head is no longer the zero it starts at, so its values are not all 0.
    assert record["critic/score/max"] > record["critic/score/min"]
    assert record["critic/score/mean"] == pytest.approx(record["reward_extra/rm_score/mean"], abs=1e-6)


def fit_letter_reward_model(folder: Path, *, steps: int = 300, seed: int = 0) -> None:
    """Fit the classifier in `folder` to the demo's letter share by plain supervised regression.

    Inputs are what the run feeds it (`input_tokenizer` unset): the policy's ChatML prompt ids then the
    response ids. Responses mix the target letter, other demo letters and any token of the vocabulary
    (what a random policy writes), with and without the closing `<|im_end|>`; the target is
    `letter_share_score` of the decoded text, as the rule scorer computes it.
    """
    tokenizer = load_tokenizer(str(folder))
    model = AutoModelForSequenceClassification.from_pretrained(folder)
    prompts = {
        letter: encode_prompt(tokenizer, [{"role": "user", "content": letter}]) for letter in DEMO_LETTERS
    }
    letter_ids = {letter: tokenizer.convert_tokens_to_ids(letter) for letter in DEMO_LETTERS}
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    rng = random.Random(seed)
    torch.manual_seed(seed)

    def example() -> tuple[list[int], float]:
        letter, length = rng.choice(DEMO_LETTERS), rng.randint(1, 8)
        hits = rng.randint(0, length)
        others = [
            rng.randrange(len(tokenizer)) if rng.random() < 0.5 else letter_ids[rng.choice(DEMO_LETTERS)]
            for _ in range(length - hits)
        ]
        response = [letter_ids[letter]] * hits + others
        rng.shuffle(response)
        if rng.random() < 0.5:
            response.append(end)
        target = letter_share_score(tokenizer.decode(response, skip_special_tokens=True), letter)
        return prompts[letter] + response, target

    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(steps):
        sequences, targets = zip(*(example() for _ in range(64)), strict=True)
        width = max(len(ids) for ids in sequences)
        input_ids = torch.zeros((64, width), dtype=torch.long)  # [B, T]
        for row, ids in enumerate(sequences):
            input_ids[row, : len(ids)] = torch.tensor(ids)
        lengths = torch.tensor([len(ids) for ids in sequences])
        mask = (torch.arange(width) < lengths[:, None]).long()
        hidden = model.base_model(input_ids=input_ids, attention_mask=mask).last_hidden_state
        predicted = classifier_head(model)(hidden[torch.arange(64), lengths - 1])[:, 0]  # [B]
        loss = torch.nn.functional.mse_loss(predicted, torch.tensor(targets))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(folder)


def test_fitted_reward_model_drives_ppo_on_the_demo(
    train: Callable, tmp_path: Path, one_cpu_thread: None
) -> None:
    rm = tiny_classifier(tmp_path / "rm")
    fit_letter_reward_model(rm, steps=RM_FIT_STEPS)

    result = train(
        "algorithm.adv_estimator=grpo",
        "seed=1",
        "trainer.total_training_steps=50",
        "trainer.logger=[jsonl]",
        "data.max_response_length=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_epochs=2",
        "reward_model.enable=true",
        f"reward_model.model.path={rm}",
        "reward_model.micro_batch_size_per_gpu=64",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        tiny=False,
    )

    assert result.exit_code == 0, result.stderr
    records = _steps(result.run_dir)
    rule = [r["reward_extra/rule_score/mean"] for r in records]
    model_scores = [r["critic/score/mean"] for r in records]
    rise = sum(rule[-5:]) / 5 - sum(rule[:5]) / 5
    assert rise >= REQUIRED_RISE, (
        f"rule score rose {rise:.3f}; by tens of steps: rule {[round(sum(rule[i : i + 10]) / 10, 2) for i in range(0, 50, 10)]}, "
        f"reward model {[round(sum(model_scores[i : i + 10]) / 10, 2) for i in range(0, 50, 10)]}"
    )


JUDGE_TEMPLATE = "Score {response} for {prompt} (want {ground_truth}):"


def fit_constant_judge(folder: Path, verdict: str, *, steps: int = 60, seed: int = 0) -> None:
    """A tiny causal LM (the zoo Qwen2's shape and tokenizer) fitted to answer every judge prompt with
    `verdict` then `<|im_end|>`: the judge's whole path (template, chat template, engine, parser) is then
    checked against a known answer."""
    source = Path(resolve_model_dir("zoo:tiny/qwen2"))
    shutil.copytree(source, folder)
    tokenizer = load_tokenizer(str(folder))
    model = AutoModelForCausalLM.from_pretrained(folder)
    answer = tokenizer.encode(verdict, add_special_tokens=False) + [
        tokenizer.convert_tokens_to_ids("<|im_end|>")
    ]
    rng = random.Random(seed)
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(steps):
        sequences, starts = [], []
        for _ in range(16):
            letter = rng.choice(DEMO_LETTERS)
            response = "".join(rng.choice("aeostx<>|_ ") for _ in range(rng.randint(0, 8)))
            prompt = encode_prompt(
                tokenizer,
                [
                    {
                        "role": "user",
                        "content": JUDGE_TEMPLATE.format(
                            prompt=letter, response=response, ground_truth=letter
                        ),
                    }
                ],
            )
            sequences.append(prompt + answer)
            starts.append(len(prompt))
        width = max(len(ids) for ids in sequences)
        input_ids = torch.zeros((16, width), dtype=torch.long)  # [B, T]
        labels = torch.full((16, width), -100, dtype=torch.long)  # [B, T], loss on the answer only
        for row, ids in enumerate(sequences):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            labels[row, starts[row] : len(ids)] = torch.tensor(ids[starts[row] :])
        loss = model(input_ids=input_ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(folder)


@pytest.mark.parametrize("engine", ["native", "hf"])
def test_llm_judge_run_logs_parsed_scores(engine: str, train: Callable, tmp_path: Path) -> None:
    judge = tmp_path / "judge"
    fit_constant_judge(judge, "Score: 7")
    template = tmp_path / "judge.txt"
    template.write_text(JUDGE_TEMPLATE, encoding="utf-8")
    dumps = tmp_path / "dumps"
    result = train(
        "reward_model.enable=true",
        f"reward_model.model.path={judge}",
        f"reward_model.judge.prompt_template_path={template}",
        r"reward_model.judge.score_regex='Score: (\d+)'",  # quoted: unquoted, `key: value` reads as a mapping
        "reward_model.judge.default_score=-1",
        "reward_model.rollout.response_length=12",
        f"reward_model.rollout.name={engine}",
        f"trainer.rollout_data_dir={dumps}",
    )

    assert result.exit_code == 0, result.stderr
    for record in result.metrics:
        assert record["reward_extra/judge_parsed/mean"] == 1.0
        assert record["critic/score/mean"] == record["reward_extra/rm_score/mean"] == 7.0
    rows = [json.loads(line) for line in (dumps / "1.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [row["rm_score"] for row in rows] == [7.0] * 8
    assert all(0.0 <= row["rule_score"] <= 1.0 for row in rows)


def test_a_causal_lm_as_reward_model_is_one_error_line(train: Callable) -> None:
    result = train("reward_model.enable=true", "reward_model.model.path=zoo:tiny/qwen2")

    assert result.exit_code == 2
    (line,) = result.stderr_lines[-1:]
    assert line.startswith("error: `reward_model.model.path=zoo:tiny/qwen2` is neither")
    assert "reward_model.judge.prompt_template" in line
