"""Sample dumps and logged validation samples: verl's fields and choice, files a kill cannot cut."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

from relm.config.loader import load_config
from relm.config.specs import LoopSpec
from relm.config.translate import translate
from relm.learner.batch import Rollout, Scored
from relm.models.char_tokenizer import build_char_tokenizer
from relm.rollout.padding import left_pad
from relm.trainer.samples import (
    VAL_GENERATIONS_FILE,
    GenerationSample,
    ValidationSamples,
    console_lines,
    dump_folder,
    generations_table,
    pick_val_generations,
    rollout_samples,
    write_step_dump,
)


def _sample(text: str, score: float = 1.0, **extras: float) -> GenerationSample:
    return GenerationSample(input=f"Q {text}", output=f"A {text}", gts=text, score=score, extras=extras)


def test_record_has_verls_keys_in_order_and_only_valid_json():
    sample = GenerationSample("q", "a", "7", math.nan, {"acc": 1.0, "score": 5.0, "len": math.inf})
    record = sample.record(3)
    assert list(record) == ["input", "output", "gts", "score", "step", "acc", "len"]
    # NaN/inf are not JSON: they become null; an extra named like a verl field does not overwrite it.
    assert record == {
        "input": "q",
        "output": "a",
        "gts": "7",
        "score": None,
        "step": 3,
        "acc": 1.0,
        "len": None,
    }
    json.loads(json.dumps(record, allow_nan=False))


def test_step_dump_is_one_object_per_line_named_by_step_and_replaced_whole(tmp_path: Path):
    folder = tmp_path / "dumps" / "rollout"
    path = write_step_dump(folder, 12, [_sample("x"), _sample("naïve\nline", 0.5, acc=0.0)])
    assert path == folder / "12.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == [
        {"input": "Q x", "output": "A x", "gts": "x", "score": 1.0, "step": 12},
        {
            "input": "Q naïve\nline",
            "output": "A naïve\nline",
            "gts": "naïve\nline",
            "score": 0.5,
            "step": 12,
            "acc": 0.0,
        },
    ]
    assert "naïve" in lines[1]  # written as text, not \u escapes: readable with `head`
    write_step_dump(folder, 12, [_sample("y")])  # a resumed run writes the step again: replaced, not appended
    assert [json.loads(line)["gts"] for line in path.read_text().splitlines()] == ["y"]
    assert sorted(p.name for p in folder.iterdir()) == ["12.jsonl"]  # no temporary file left beside it


def test_dump_folder_expands_home(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert dump_folder("~/runs/dump") == tmp_path / "runs" / "dump"
    assert dump_folder(None) is None and dump_folder("") is None


def test_logged_samples_are_chosen_as_verl_chooses_them():
    samples = [_sample(f"{i:02d}", score=i) for i in (7, 3, 11, 0, 5, 9, 1, 4, 8, 2, 6, 10)]
    chosen = pick_val_generations(samples, 4)
    # verl: tuples (input, output, score) sorted by input, shuffled in place by RandomState(42), first N.
    tuples = sorted([(s.input, s.output, s.score) for s in samples], key=lambda x: x[0])
    np.random.RandomState(42).shuffle(tuples)
    assert [(s.input, s.output, s.score) for s in chosen] == tuples[:4]
    # The same prompts whatever order validation returned them in: the same ones come back every step.
    assert [s.input for s in pick_val_generations(samples[::-1], 4)] == [s.input for s in chosen]
    assert len(pick_val_generations(samples, 100)) == len(samples)


def test_rollout_samples_decode_what_the_model_saw_and_wrote():
    tokenizer = build_char_tokenizer()
    prompts = [
        tokenizer.encode("ab", add_special_tokens=False),
        tokenizer.encode("hello", add_special_tokens=False),
    ]
    prompt_ids, prompt_mask = left_pad(prompts, tokenizer.pad_token_id)
    responses = [
        tokenizer.encode("xyz", add_special_tokens=False),
        tokenizer.encode("q", add_special_tokens=False),
    ]
    response_ids = torch.full((2, 3), tokenizer.pad_token_id)
    response_mask = torch.zeros(2, 3, dtype=torch.long)
    for row, ids in enumerate(responses):
        response_ids[row, : len(ids)] = torch.tensor(ids)
        response_mask[row, : len(ids)] = 1
    token_scores = torch.tensor([[0.0, 0.0, 1.0], [-0.5, 0.0, 0.0]])
    rollout = Rollout(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids, response_mask=response_mask,
        response_attention_mask=response_mask, group_ids=torch.tensor([0, 1]), data_sources=["s", "s"],
        ground_truths=["g1", "g2"], extra_infos=[{}, {}], finish_reasons=["stop", "stop"],
        rollout_logprobs=torch.zeros(2, 3),
    )  # fmt: skip
    batch = Scored(rollout, token_scores, reward_extras=[{"acc": 1.0}, {"acc": 0.0}], baseline_scores=None)
    samples = rollout_samples(tokenizer, batch)
    assert [(s.input, s.output, s.gts, s.score, s.extras) for s in samples] == [
        ("ab", "xyz", "g1", 1.0, {"acc": 1.0}),
        ("hello", "q", "g2", -0.5, {"acc": 0.0}),
    ]
    # Rows selected for a mini-batch keep their own extras.
    assert rollout_samples(tokenizer, batch.select([1]))[0].extras == {"acc": 0.0}


def test_console_rows_keep_one_sample_text_per_line_and_cut_long_ones():
    lines = console_lines([_sample("two\nlines"), _sample("z" * 1000, score=0.25)], step=4, total=9)
    assert lines[0] == "validation samples at step 4 (2 of 9):"
    assert lines[1] == "  [1] score=1 gts='two\\nlines'"
    assert lines[2] == '      input:  "Q two\\nlines"'
    assert len(lines) == 7 and lines[5].endswith("...") and len(lines[5]) < 450


def test_wandb_table_layout_is_verls():
    columns, row = generations_table([_sample("a", 0.5), _sample("b", 1.0)], step=6)
    assert columns == ["step", "input_1", "output_1", "score_1", "input_2", "output_2", "score_2"]
    assert row == [6, "Q a", "A a", 0.5, "Q b", "A b", 1.0]


def _loop(*overrides: str) -> LoopSpec:
    return translate(load_config(list(overrides)))[0].loop


def test_validation_samples_dump_all_and_log_the_chosen_few(tmp_path: Path, capsys):
    trainer = _loop(
        "trainer.logger=[console]",
        "trainer.log_val_generations=2",
        f"trainer.validation_data_dir={tmp_path / 'val'}",
    )
    sink = ValidationSamples(trainer, tmp_path / "run")
    assert sink.wanted
    samples = [_sample(str(i), score=i / 10) for i in range(5)]
    sink.write(3, samples)
    sink.write(6, samples)
    sink.close()
    assert len((tmp_path / "val" / "3.jsonl").read_text().splitlines()) == 5
    assert (tmp_path / "val" / "6.jsonl").exists()
    logged = [json.loads(line) for line in (tmp_path / "run" / VAL_GENERATIONS_FILE).read_text().splitlines()]
    assert [r["step"] for r in logged] == [3, 3, 6, 6]
    assert [r["input"] for r in logged[:2]] == [r["input"] for r in logged[2:]]  # the same prompts each time
    assert set(logged[0]) == {"step", "input", "output", "score"}
    out = capsys.readouterr().out
    assert out.count("validation samples at step") == 2 and "(2 of 5)" in out
    assert not ValidationSamples(_loop(), tmp_path).wanted
