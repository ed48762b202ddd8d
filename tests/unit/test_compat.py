"""`relm compat`: the output checks by hand, the stand-in reward, measuring, reporting, one real
four-stage run on zoo:tiny/qwen2, and the CLI's exit codes."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch
from transformers import BertConfig, LlavaConfig, T5Config

from relm.compat.checks import CompatOptions, check_model
from relm.compat.cli import main
from relm.compat.measure import MemoryMeter, StageTimeout, time_limit
from relm.compat.report import ModelReport, StageResult, exit_code, table_rows, to_markdown
from relm.compat.reward import compute_score
from relm.compat.verdicts import (
    CheckFailed,
    changed_fraction,
    check_generation,
    check_update_metrics,
    sample_weights,
)
from relm.models.char_tokenizer import build_char_tokenizer
from relm.rollout.base import GenerationOutput

PAD, EOS, VOCAB = 0, 3, 101


def generation(ids: list[list[int]], lengths: list[int], reasons: list[str], logprob: float = -1.0):
    """A width-4 engine output whose first `lengths[i]` tokens of row i are live."""
    response_ids = torch.tensor(ids)
    mask = (torch.arange(4)[None, :] < torch.tensor(lengths)[:, None]).long()
    logprobs = torch.where(mask.bool(), logprob, 0.0)
    return GenerationOutput(response_ids, mask, logprobs, reasons)


def test_well_formed_generation_passes():
    # row 0 stops on eos after 2 tokens (then pad); row 1 runs the full width.
    gen = generation([[7, EOS, PAD, PAD], [5, 6, 7, 8]], [2, 4], ["stop", "length"])
    check_generation(gen, VOCAB, PAD, [EOS], max_new_tokens=4)


@pytest.mark.parametrize(
    ("ids", "lengths", "reasons", "logprob", "message"),
    [
        ([[7, 101, 0, 0]], [2], ["length"], -1.0, "outside the vocabulary of 101"),
        ([[0, 0, 0, 0]], [4], ["length"], -1.0, "every generated token is the pad token 0"),
        ([[7, 8, 0, 0]], [2], ["stop"], -1.0, r"finished `stop` on token 8, not an eos id \[3\]"),
        ([[7, 8, 0, 0]], [2], ["length"], -1.0, "finished `length` after 2 < 4 tokens"),
        ([[7, 8, 9, 10]], [4], ["abort"], -1.0, "finish reason 'abort'"),
        ([[7, 8, 9, 10]], [4], ["length"], math.nan, "not all finite"),
        ([[7, 8, 9, 10]], [4], ["length"], 0.5, "not all finite and <= 0"),
        ([[0, 0, 0, 0]], [0], ["length"], -1.0, "has no tokens"),
    ],
)
def test_malformed_generation_is_named(ids, lengths, reasons, logprob, message):
    with pytest.raises(CheckFailed, match=message):
        check_generation(generation(ids, lengths, reasons, logprob), VOCAB, PAD, [EOS], max_new_tokens=4)


def test_a_gap_in_the_response_mask_fails():
    gen = generation([[5, 6, 7, 8]], [4], ["length"])
    gen.response_mask[0, 1] = 0
    with pytest.raises(CheckFailed, match="not ones followed by zeros"):
        check_generation(gen, VOCAB, PAD, [EOS], max_new_tokens=4)


GOOD_STEP = {"actor/pg_loss": 0.1, "actor/grad_norm": 2.0, "critic/vf_loss": 0.3, "critic/grad_norm": 1.0}


def test_update_metrics_must_be_present_finite_and_applied():
    check_update_metrics(GOOD_STEP | {"training/skipped_updates": 0.0}, step=1)
    with pytest.raises(CheckFailed, match="reported no critic/vf_loss, critic/grad_norm"):
        check_update_metrics({"actor/pg_loss": 0.1, "actor/grad_norm": 2.0}, step=1)
    with pytest.raises(CheckFailed, match=r"step 2: actor/kl_loss = inf"):
        check_update_metrics(GOOD_STEP | {"actor/kl_loss": math.inf}, step=2)
    with pytest.raises(CheckFailed, match="1 update\\(s\\) skipped"):
        check_update_metrics(GOOD_STEP | {"training/skipped_updates": 1.0}, step=1)


def test_stand_in_reward_by_hand():
    # ord mod 7: k=107 -> 2; a=97 -> 6; ' '=32 -> 4; e=101 -> 3.
    assert compute_score("compat", "k", None) == pytest.approx(2 / 6)
    assert compute_score("compat", "ka ", None) == pytest.approx((2 + 6 + 4) / 18)
    assert compute_score("compat", "k", "a") == pytest.approx((6 + 2) / 12)
    # Responses that decode to nothing still score by their prompt's ground truth.
    assert (compute_score("compat", "", "a"), compute_score("compat", "", "e")) == (1.0, 0.5)
    assert compute_score("compat", "", None) == 0.0


def test_changed_fraction_is_the_median_share_of_changed_elements():
    before = [torch.zeros(4), torch.zeros(4), torch.zeros(2)]
    after = [torch.tensor([1.0, 1, 1, 0]), torch.zeros(4), torch.tensor([1.0, 1])]
    assert changed_fraction(before, after) == 0.75  # median of (3/4, 0, 2/2)
    model = torch.nn.Linear(3000, 2)  # weight: 6000 elements, 1024 sampled; bias: 2
    samples = sample_weights(model)
    assert [t.numel() for t in samples] == [1024, 2]
    with torch.no_grad():
        model.weight.add_(1e-3)
    assert changed_fraction(samples, sample_weights(model)) == 0.5  # weight all, bias none
    # Past 2^24 elements a float32 index would round beyond the end; the last sample is the last element.
    big = torch.nn.Parameter(torch.arange(2**24 + 3, dtype=torch.float32))
    assert sample_weights(torch.nn.ParameterList([big]), per_tensor=3)[0].tolist() == [
        0.0,
        2**23 + 1,
        2**24 + 2,
    ]


def test_bf16_weights_swallow_a_small_adam_step():
    """Why the update stage looks at elements: at verl's lr 1e-6, a bf16 weight of ~0.02 does not
    move (its rounding step there is 2^-6 * 2^-7 ~ 1.2e-4), while the same step on fp32 moves it."""
    for dtype, expected in ((torch.bfloat16, 0.0), (torch.float32, 1.0)):
        weight = torch.nn.Parameter(torch.full((64,), 0.02, dtype=dtype))
        optimizer = torch.optim.AdamW([weight], lr=1e-6)
        before = sample_weights(torch.nn.ParameterList([weight]))
        weight.grad = torch.ones_like(weight)
        optimizer.step()
        assert changed_fraction(before, sample_weights(torch.nn.ParameterList([weight]))) == expected


def test_time_limit_turns_a_hang_into_an_error():
    start = time.perf_counter()
    with pytest.raises(StageTimeout, match="time limit of 0.2 s"), time_limit(0.2):
        while True:
            pass
    assert time.perf_counter() - start < 2.0
    with time_limit(5.0):
        pass  # and the alarm is disarmed afterwards
    time.sleep(0.01)


def test_cpu_memory_meter_sees_an_allocation():
    with MemoryMeter(torch.device("cpu")) as meter:
        block = torch.ones(64 * 2**20 // 4)  # 64 MiB of float32, touched by the fill
    assert meter.kind == "cpu peak rss growth"
    assert 60 <= meter.peak_mb < 200
    del block


def _report(name: str, status: str, stages: list[StageResult]) -> ModelReport:
    return ModelReport(model=name, status=status, classification="supported", reason="", stages=stages)


def test_report_rows_exit_code_and_markdown():
    ok = _report(
        "a", "pass", [StageResult("load", "pass", 1.0, 12.0), StageResult("rollout", "pass", 2.0, 30.0)]
    )
    ok.stages[1].metrics["tokens_per_s"] = 123.4
    ok.decisions.append("pad token '<|pad|>' (id 0)")
    bad = _report("b", "fail", [StageResult("load", "fail", error_class="UserError", error="no | config")])
    unsupported = ModelReport("c", "unsupported", "unsupported", "is an encoder-decoder model")
    rows = table_rows([ok, bad, unsupported])
    assert rows[0][2:] == [
        "pass",
        "-",
        "pass 1.0s",
        "pass 2.0s",
        "-",
        "123",
        "30",
        "pad token '<|pad|>' (id 0)",
    ]
    assert rows[1][4] == "FAIL (UserError)" and rows[1][-1] == "no | config"
    assert rows[2][-1] == "is an encoder-decoder model"
    assert exit_code([ok, unsupported]) == 0 and exit_code([ok, bad]) == 3
    markdown = to_markdown([bad], "t")
    assert "no \\| config" in markdown and markdown.count("\n") == 5
    assert _report("n", "pass", [StageResult("update", "pass", metrics={"x": math.nan})]).to_dict()["stages"][
        0
    ]["metrics"] == {"x": "nan"}


def test_tiny_qwen2_passes_all_four_stages():
    report = check_model("zoo:tiny/qwen2", CompatOptions(device="cpu"))
    assert report.status == "pass", [(s.name, s.error) for s in report.stages]
    assert [(stage.name, stage.status) for stage in report.stages] == [
        ("tokenizer", "pass"),
        ("load", "pass"),
        ("rollout", "pass"),
        ("update", "pass"),
    ]
    assert report.tokenizer is not None and (report.tokenizer.length, report.tokenizer.embedding_rows) == (
        101,
        101,
    )
    rollout, update = report.stage("rollout"), report.stage("update")
    assert rollout.metrics["logprob_max_abs_diff"] <= 2e-3
    # 3 prompts x 2 samples, each 1..16 tokens.
    assert 6 <= rollout.metrics["generated_tokens"] <= 96 and rollout.metrics["tokens_per_s"] > 0
    assert all(
        math.isfinite(update.metrics[key]) for key in ("actor/pg_loss", "critic/vf_loss", "actor/grad_norm")
    )
    assert update.metrics["actor/grad_norm"] > 0 and update.metrics["actor_weights_changed"] > 0.9
    assert all(stage.peak_memory_mb is not None for stage in report.stages)
    assert report.architecture is not None and report.architecture.family == "qwen2"


def _tiny_folder(config, folder) -> str:
    config.save_pretrained(folder)
    build_char_tokenizer().save_pretrained(folder)
    return str(folder)


def test_cli_reports_bert_t5_llava_unsupported_with_exit_0(tmp_path, capsys):
    small = dict(vocab_size=101, num_hidden_layers=1)
    folders = [
        _tiny_folder(BertConfig(**small, hidden_size=32, num_attention_heads=2), tmp_path / "bert"),
        _tiny_folder(T5Config(vocab_size=101, d_model=32, num_layers=1, num_heads=2), tmp_path / "t5"),
        _tiny_folder(LlavaConfig(), tmp_path / "llava"),
    ]
    assert main([*folders, "--out", str(tmp_path / "out"), "--json", str(tmp_path / "r.json")]) == 0
    reports = json.loads((tmp_path / "r.json").read_text())["models"]
    assert [r["status"] for r in reports] == ["unsupported"] * 3
    assert ["encoder-only" in reports[0]["reason"], "encoder-decoder" in reports[1]["reason"]] == [True, True]
    assert "vision-language" in reports[2]["reason"]
    assert (tmp_path / "out" / "compat.json").is_file() and "unsupported" in (
        tmp_path / "out" / "compat.md"
    ).read_text()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["/no/such/model"], "model folder `/no/such/model` does not exist"),
        ([], "name at least one MODEL"),
        (["--zoo", "full", "--device", "cpu"], "full-size zoo models need a GPU"),
        (["zoo:tiny/qwen2", "--register", "Foo"], "use ARCH=CLASS"),
        (["zoo:tiny/qwen2", "--steps", "0"], "--steps 0: at least 1"),
        (["zoo:tiny/qwen2", "--device", "tpu"], "invalid choice"),
    ],
)
def test_cli_usage_errors_exit_2(argv, message, capsys, tmp_path):
    assert main([*argv, "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


def test_compat_runs_its_update_stage_with_lora_as_a_condition(tmp_path):
    """`--lora-rank R`: actor and critic train adapters; a pass that needed them is `conditional`."""
    from relm.compat.checks import CompatOptions, check_model

    report = check_model("zoo:tiny/qwen2", CompatOptions(device="cpu", lora_rank=4))
    assert report.status == "conditional", report
    assert report.conditions == ["LoRA rank 4 in the update stage (--lora-rank)"]
    assert [stage.status for stage in report.stages] == ["pass"] * len(report.stages)


def test_a_model_whose_full_update_does_not_fit_passes_on_lora_as_a_condition(tmp_path, monkeypatch):
    """The plan's "does not fit ... LoRA would fit" line is a condition, not a failure: compat runs its
    update stage again with the offered rank, as a user following the line would. Here the host room
    lies between what the update stage needs with LoRA (rank 4) and without, for the real CPU check."""
    from relm.compat import checks
    from relm.config.loader import load_config
    from relm.config.translate import translate
    from relm.data.demo_task import write_demo_parquet
    from relm.memory import choices
    from relm.memory.plan import cpu_host_need
    from relm.models.loading import resolve_model_dir
    from relm.models.precision import pick_precision
    from relm.models.zoo import default_cache_dir

    cpu, options = torch.device("cpu"), CompatOptions(device="cpu")
    folder = resolve_model_dir("zoo:tiny/qwen2")
    train_file, _ = write_demo_parquet(default_cache_dir() / "demo")
    cfg = load_config(checks._update_overrides(folder, train_file, str(tmp_path), options, cpu))
    precision, moments = pick_precision("auto", cpu), {"actor": None, "critic": None}
    request = choices._plan_request(translate(cfg)[0], folder, cpu, precision, (0, 0), moments)
    full, lora = cpu_host_need(request), cpu_host_need(choices._with_lora(request, 4))
    assert lora < full
    monkeypatch.setattr(choices, "OFFERED_LORA_RANK", 4)
    monkeypatch.setattr(choices, "host_room", lambda budget: (full + lora) // 2)

    report = check_model("zoo:tiny/qwen2", options)

    assert report.status == "conditional", report
    assert len(report.conditions) == 1 and report.conditions[0].startswith(
        "LoRA rank 4 on actor and critic: full fine-tuning does not fit (training on CPU needs ~"
    ), report.conditions
    assert [stage.status for stage in report.stages] == ["pass"] * len(report.stages)
