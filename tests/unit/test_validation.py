"""Validation: verl's metric names and values by hand, and whole passes with a real tiny model."""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from relm.config.loader import load_config
from relm.config.specs import RunSpec, SamplingSpec
from relm.config.translate import translate
from relm.data.dataset import PromptDataset
from relm.models.char_tokenizer import build_char_tokenizer
from relm.models.loading import load_causal_lm, resolve_model_dir
from relm.models.tokenizer import load_tokenizer
from relm.rewards.manager import RewardManager
from relm.rollout.base import SamplingParams
from relm.rollout.hf_engine import HFRolloutEngine
from relm.trainer.validation import (
    best_of_k,
    build_val_params,
    is_validation_step,
    make_val_dataset,
    run_validation,
    validation_metrics,
)

# --- metrics by hand --------------------------------------------------------------------------------


def test_best_of_k_is_the_exact_expectation():
    # Max of 2 draws from {0, 1, 2}: over the 9 equally likely pairs it is 0 once, 1 three times and
    # 2 five times, so its mean is 13/9 and its second moment 23/9.
    mean, std = best_of_k([2.0, 0.0, 1.0], 2)
    assert mean == pytest.approx(13 / 9)
    assert std == pytest.approx(math.sqrt(23 / 9 - (13 / 9) ** 2))
    assert best_of_k([0.0, 1.0], 1) == pytest.approx((0.5, 0.5))  # one draw: the plain mean and std
    assert best_of_k([3.0, 3.0, 3.0], 3) == pytest.approx((3.0, 0.0))


def test_validation_metrics_names_and_values_by_hand():
    # Source a: prompt 0 scored [1, 0], prompt 1 scored [1, 1]. Source b: prompt 2 scored [0.5, 0.5].
    metrics = validation_metrics(
        ["a", "a", "a", "a", "b", "b"], [0, 0, 1, 1, 2, 2], {"reward": [1.0, 0.0, 1.0, 1.0, 0.5, 0.5]}
    )
    best_std = math.sqrt(0.75 - 0.75**2)  # prompt 0's best of 2 is 1 with probability 3/4
    expected = {
        "val-core/a/reward/mean@2": (0.5 + 1.0) / 2,
        "val-aux/a/reward/std@2": (0.5 + 0.0) / 2,
        "val-core/a/reward/best@2/mean": (0.75 + 1.0) / 2,
        "val-core/a/reward/best@2/std": (best_std + 0.0) / 2,
        "val-aux/a/reward/worst@2/mean": (0.25 + 1.0) / 2,
        "val-aux/a/reward/worst@2/std": (best_std + 0.0) / 2,
        "val-core/b/reward/mean@2": 0.5,
        "val-aux/b/reward/std@2": 0.0,
        "val-core/b/reward/best@2/mean": 0.5,
        "val-core/b/reward/best@2/std": 0.0,
        "val-aux/b/reward/worst@2/mean": 0.5,
        "val-aux/b/reward/worst@2/std": 0.0,
    }
    assert metrics == pytest.approx(expected)


def test_validation_metrics_k_ladder_and_core_variable():
    # N = 5 samples: best/worst at k = 2, 4 and 5; only k = N is core. `acc`, when reported, is the core.
    rows = 5
    metrics = validation_metrics(["s"] * rows, [0] * rows, {"reward": [0.0] * rows, "acc": [1.0] * rows})
    assert sorted(name for name in metrics if name.startswith("val-core")) == [
        "val-core/s/acc/best@5/mean",
        "val-core/s/acc/best@5/std",
        "val-core/s/acc/mean@5",
    ]
    assert {name.split("/")[-2] if name.count("/") == 4 else name.split("/")[-1] for name in metrics} == {
        "mean@5",
        "std@5",
        "best@2",
        "best@4",
        "best@5",
        "worst@2",
        "worst@4",
        "worst@5",
    }
    assert metrics["val-aux/s/reward/mean@5"] == 0.0 and metrics["val-core/s/acc/mean@5"] == 1.0


def test_validation_metrics_single_sample_and_missing_values():
    # N = 1: only mean@1. A NaN (no value for that response) is left out of its prompt.
    metrics = validation_metrics(["s", "s"], [0, 1], {"reward": [0.2, 0.6], "acc": [math.nan, 1.0]})
    assert metrics == pytest.approx({"val-core/s/acc/mean@1": 1.0, "val-aux/s/reward/mean@1": 0.4})


def test_validation_schedule_follows_verl():
    assert is_validation_step(10, 100, test_freq=10)
    assert not is_validation_step(11, 100, test_freq=10)
    assert is_validation_step(100, 100, test_freq=30)  # after the last step too
    assert not is_validation_step(100, 100, test_freq=-1)
    assert not is_validation_step(10, 100, test_freq=0)


def _val(temperature: float = 0.0, top_p: float = 1.0, do_sample: bool = False, n: int = 1) -> SamplingSpec:
    """`rollout.val_kwargs` as the run's spec holds it (verl's defaults: greedy, one sample)."""
    return SamplingSpec(temperature=temperature, top_p=top_p, top_k=-1, do_sample=do_sample, n=n)


def test_build_val_params_greedy_and_sampled():
    greedy = build_val_params(_val(), max_new_tokens=7)
    assert greedy.greedy and greedy.n == 1 and greedy.max_new_tokens == 7
    assert build_val_params(_val(do_sample=True, temperature=0.0), 7).greedy
    sampled = build_val_params(_val(do_sample=True, temperature=0.7, top_p=0.9, n=4), 7, seed=3)
    assert (sampled.greedy, sampled.n, sampled.temperature, sampled.top_p, sampled.seed) == (
        False,
        4,
        0.7,
        0.9,
        3,
    )


# --- which prompts ----------------------------------------------------------------------------------


def _spec(*overrides: str) -> RunSpec:
    return translate(load_config(list(overrides)))[0]


def test_make_val_dataset_picks_files_or_the_demo(tmp_path, monkeypatch):
    monkeypatch.setenv("RELM_CACHE", str(tmp_path / "cache"))
    tokenizer = build_char_tokenizer()
    demo = make_val_dataset(_spec(), tokenizer)  # no train_files: the demo task's 32 val prompts
    assert demo is not None and len(demo) == 32 and demo[0]["data_source"] == "relm/letters"
    assert (tmp_path / "cache" / "demo" / "val.parquet").is_file()

    train = f"data.train_files=[{tmp_path / 'train.parquet'}]"
    assert make_val_dataset(_spec(train), tokenizer) is None  # own training data, no val_files: no validation

    val = _write_prompts(tmp_path / "val.parquet", [("q", "src", "1")])
    own = make_val_dataset(_spec(train, f"data.val_files=[{val}]"), tokenizer)
    assert own is not None and len(own) == 1 and own[0]["ground_truth"] == "1"


# --- whole passes with a real model -----------------------------------------------------------------


def _write_prompts(path: Path, rows: list[tuple[str, str, str]]) -> str:
    """(content, data_source, ground_truth) rows as a verl parquet."""
    table = [
        {"prompt": [{"role": "user", "content": c}], "data_source": s, "reward_model": {"ground_truth": g}}
        for c, s, g in rows
    ]
    pq.write_table(pa.Table.from_pylist(table), path)
    return str(path)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = resolve_model_dir("zoo:tiny/qwen2")
    tokenizer = load_tokenizer(folder)
    model = load_causal_lm(folder, dtype=torch.float32, device="cpu")
    engine = HFRolloutEngine(
        model, pad_token_id=tokenizer.pad_token_id, eos_token_ids=[tokenizer.eos_token_id], device="cpu"
    )
    path = _write_prompts(
        tmp_path_factory.mktemp("val") / "val.parquet",
        [
            ("abc", "test/a", "1"),
            ("hello there", "test/b", "0.25"),
            ("z", "test/a", "0"),
            ("xy", "test/a", "1"),
        ],
    )
    dataset = PromptDataset([path], tokenizer, max_prompt_length=64, files_key="data.val_files")
    return tokenizer, engine, dataset


def score_is_ground_truth(data_source, solution_str, ground_truth, extra_info):
    """A score known in advance whatever the model writes: the ground truth itself."""
    return float(ground_truth)


def score_is_length(data_source, solution_str, ground_truth, extra_info):
    return {"score": len(solution_str) / 10, "acc": float(data_source == "test/b")}


@pytest.mark.parametrize("batch_size", [None, 1, 3])
def test_sampled_validation_means_are_exact_whatever_the_batching(setup, batch_size):
    tokenizer, engine, dataset = setup
    params = SamplingParams(n=3, max_new_tokens=6, do_sample=True, temperature=1.0, seed=5)
    metrics = run_validation(
        engine, RewardManager(tokenizer, score_is_ground_truth), dataset, params=params, batch_size=batch_size
    ).metrics
    # test/a prompts score 1, 0, 1 on every sample; test/b's one prompt 0.25.
    assert metrics["val-core/test/a/reward/mean@3"] == pytest.approx(2 / 3)
    assert metrics["val-core/test/b/reward/mean@3"] == pytest.approx(0.25)
    assert metrics["val-aux/test/a/reward/std@3"] == 0.0
    assert metrics["val-core/test/a/reward/best@3/mean"] == pytest.approx(2 / 3)
    assert 1.0 <= metrics["val/response_length/mean"] <= 6.0
    assert metrics["timing_s/testing"] > 0


def test_greedy_validation_is_deterministic_and_counts_one_response_n_times(setup):
    tokenizer, engine, dataset = setup
    reward = RewardManager(tokenizer, score_is_length)
    params = SamplingParams(n=4, max_new_tokens=6, do_sample=False)
    first = run_validation(engine, reward, dataset, params=params).metrics
    again = run_validation(engine, reward, dataset, params=params, batch_size=2).metrics
    first.pop("timing_s/testing"), again.pop("timing_s/testing")
    assert first == pytest.approx(again)

    # By hand from one greedy response per prompt: each counts 4 times, so the spread is 0.
    gen = engine.generate(
        [item["prompt_ids"] for item in dataset], SamplingParams(max_new_tokens=6, do_sample=False)
    )
    texts = tokenizer.batch_decode(
        [ids[mask.bool()].tolist() for ids, mask in zip(gen.response_ids, gen.response_mask, strict=True)],
        skip_special_tokens=True,
    )
    scores = [len(text) / 10 for text in texts]
    assert first["val-aux/test/a/reward/mean@4"] == pytest.approx((scores[0] + scores[2] + scores[3]) / 3)
    assert first["val-aux/test/b/reward/mean@4"] == pytest.approx(scores[1])
    assert first["val-core/test/b/acc/mean@4"] == 1.0  # `acc` reported: it is the core variable
    assert first["val-core/test/a/acc/mean@4"] == 0.0
    assert first["val-aux/test/a/reward/std@4"] == 0.0
    assert first["val/response_length/mean"] == pytest.approx(gen.response_lengths.float().mean().item())


def test_validation_leaves_the_training_sampler_where_it_was(setup):
    tokenizer, engine, dataset = setup
    engine.generator.manual_seed(123)
    before = engine.generator.get_state()
    params = SamplingParams(n=2, max_new_tokens=4, do_sample=True, seed=9)  # re-seeds the engine inside
    run_validation(engine, RewardManager(tokenizer, score_is_ground_truth), dataset, params=params)
    assert torch.equal(engine.generator.get_state(), before)


def test_kept_samples_are_the_decoded_prompts_and_responses_with_their_scores(setup):
    tokenizer, engine, dataset = setup
    reward = RewardManager(tokenizer, score_is_length)
    params = SamplingParams(n=2, max_new_tokens=6, do_sample=True, temperature=1.0, seed=3)
    assert run_validation(engine, reward, dataset, params=params).samples == []  # not asked for
    result = run_validation(engine, reward, dataset, params=params, batch_size=3, keep_samples=True)
    samples = result.samples
    assert len(samples) == len(dataset) * 2  # sampled: each of the n responses is its own sample
    for index, item in enumerate(dataset):
        prompt = tokenizer.decode(item["prompt_ids"], skip_special_tokens=True)
        for sample in samples[2 * index : 2 * index + 2]:
            assert sample.input == prompt and sample.gts == item["ground_truth"]
            assert sample.score == pytest.approx(len(sample.output) / 10)  # the function saw this text
            assert sample.extras == {"acc": float(item["data_source"] == "test/b")}
    # The samples' scores are the ones the metrics reduce: test/a's mean over its prompts' samples.
    a_scores = [
        s.score
        for s, item in zip(samples, [i for i in dataset for _ in range(2)], strict=True)
        if item["data_source"] == "test/a"
    ]
    assert result.metrics["val-aux/test/a/reward/mean@2"] == pytest.approx(sum(a_scores) / len(a_scores))


def test_greedy_validation_keeps_one_sample_per_prompt(setup):
    tokenizer, engine, dataset = setup
    params = SamplingParams(n=4, max_new_tokens=6, do_sample=False)
    result = run_validation(
        engine, RewardManager(tokenizer, score_is_ground_truth), dataset, params=params, keep_samples=True
    )
    assert [s.gts for s in result.samples] == [item["ground_truth"] for item in dataset]
