"""`relm bench rollout` end to end on CPU with a tiny model: it runs, and its numbers are consistent."""

from __future__ import annotations

import json
import math

from relm.bench.cpu_estimate import CpuEstimate, rollout_flops
from relm.bench.rollout import TABLE_HEADER, main, markdown_row
from tests.tiny_models import tiny_lm


def test_bench_rollout_runs_both_engines_on_cpu(tmp_path, capsys):
    out = tmp_path / "rows.json"
    args = ["--model", "zoo:tiny/qwen2", "--batch", "2", "--prompt-len", "8", "--response-len", "8"]
    assert main([*args, "--engine", "both", "--device", "cpu", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [row["engine"] for row in rows] == ["native", "hf"]
    for row in rows:
        assert row["new_tokens_per_s"] > 0 and row["ttft_s"] > 0 and row["peak_gb"] is None
        # 16 new tokens in the timed call; the step time is (call - TTFT) / 7 steps
        assert abs(row["new_tokens_per_s"] * row["total_s"] - 16) < 1e-6
        # Decode figures derive from the two timings (NaN when the call was not longer than its prefill).
        if row["total_s"] > row["ttft_s"]:
            assert abs(row["decode_step_s"] * 7 - (row["total_s"] - row["ttft_s"])) < 1e-9
            assert row["bandwidth_fraction"] > 0
        else:
            assert math.isnan(row["decode_step_s"])
        assert markdown_row(row).count("|") == TABLE_HEADER.splitlines()[0].count("|")
    assert rows[0]["fallback_reason"] is None
    printed = capsys.readouterr().out
    assert "native / hf" in printed and TABLE_HEADER.splitlines()[0] in printed


def test_bench_rollout_refuses_bad_arguments(capsys):
    assert (
        main(["--model", "zoo:tiny/qwen2", "--batch", "0", "--prompt-len", "8", "--response-len", "8"]) == 2
    )
    assert "--batch must be >= 1" in capsys.readouterr().err
    assert main(["--model", "/some/folder", "--batch", "1", "--prompt-len", "8", "--response-len", "8"]) == 2
    assert "model folder `/some/folder` does not exist" in capsys.readouterr().err


def test_bench_rollout_takes_a_local_model_folder(tmp_path, capsys):
    tiny_lm().save_pretrained(tmp_path / "model")
    args = ["--model", str(tmp_path / "model"), "--batch", "2", "--prompt-len", "4", "--response-len", "4"]
    assert main([*args, "--engine", "hf", "--device", "cpu", "--warmup", "0"]) == 0
    assert str(tmp_path / "model") in capsys.readouterr().out


def test_bench_rollout_with_eos_and_fewer_slots_than_rows(tmp_path, capsys):
    args = ["--model", "zoo:tiny/qwen2", "--batch", "6", "--prompt-len", "5", "--response-len", "12"]
    args += ["--device", "cpu", "--eos-rate", "0.1", "--max-num-seqs", "4", "--warmup", "0"]
    for extra, label in (([], "native, 4 slots"), (["--waves"], "native, waves of 4")):
        out = tmp_path / "rows.json"
        assert main([*args, *extra, "--json", str(out)]) == 0
        (row,) = json.loads(out.read_text())
        assert row["slots"] == 4 and row["eos_rate"] == 0.1
        # A tenth of the vocabulary ends a response: lengths vary, and the count is of real tokens.
        assert 6 <= row["new_tokens"] < 6 * 12 and row["max_response_len"] <= 12
        assert abs(row["new_tokens_per_s"] * row["total_s"] - row["new_tokens"]) < 1e-6
        assert math.isnan(row["bandwidth_fraction"])
        assert f"| {label} |" in markdown_row(row) and "(eos 0.1: mean" in markdown_row(row)
    assert "eos active (rate 0.1)" in capsys.readouterr().out


def test_bench_rollout_refuses_waves_without_max_num_seqs(capsys):
    args = ["--model", "zoo:tiny/qwen2", "--batch", "2", "--prompt-len", "8", "--response-len", "8"]
    assert main([*args, "--waves"]) == 2
    assert "--waves needs --max-num-seqs" in capsys.readouterr().err
    assert main([*args, "--eos-rate", "1.5"]) == 2
    assert "--eos-rate must be in [0, 1)" in capsys.readouterr().err


def test_bench_rollout_measures_fp8_beside_the_models_own_weights(tmp_path, capsys):
    out = tmp_path / "rows.json"
    args = ["--model", "zoo:tiny/qwen2-hd64", "--batch", "4", "--prompt-len", "8", "--response-len", "8"]
    assert main([*args, "--device", "cpu", "--quantization", "none", "fp8", "--json", str(out)]) == 0
    plain, fp8 = json.loads(out.read_text())
    assert (plain["quantization"], fp8["quantization"]) == (None, "fp8")
    assert plain["logprob_gap_max"] < 1e-4 < fp8["logprob_gap_max"] < 0.25  # fp8's rounding, nothing else
    assert fp8["bytes_per_step"] < plain["bytes_per_step"]  # a step reads 1-byte weights for the products
    assert fp8["fp8_products"] == "8 with 128x128 blocks, 0 per channel"  # 2 layers: qkv, o, gate_up, down
    assert "native, fp8" in markdown_row(fp8)
    printed = capsys.readouterr().out
    assert "native fp8 / native:" in printed and "native, fp8: logprob gap" in printed


def test_bench_rollout_of_a_gpu_shape_on_cpu_refuses_at_once(monkeypatch, capsys):
    # The README's 1.5B shape on a CPU printed nothing for minutes (building 1.5B random weights, then
    # decoding for hours); now the plan and estimate come first and the run stops before any weight.
    def no_weights(*args, **kwargs):
        raise AssertionError("weights were built for a run the estimate refuses")

    monkeypatch.setattr("relm.bench.rollout_measure.build_random_model", no_weights)
    args = ["--model", "zoo:Qwen/Qwen2.5-1.5B-Instruct", "--batch", "256", "--prompt-len", "256"]
    assert main([*args, "--response-len", "256", "--device", "cpu"]) == 2
    captured = capsys.readouterr()
    assert "plan: 1.54B parameters (6.2 GB of weights), 404.7 TFLOP" in captured.out
    (line,) = captured.err.strip().splitlines()
    assert line.startswith("error: relm bench rollout: zoo:Qwen/Qwen2.5-1.5B-Instruct at batch 256")
    assert "--device cuda" in line and "--model zoo:tiny/qwen2 --batch 32" in line


def test_cpu_estimate_by_hand():
    # 1e9 parameters, 2 prompts of 3 + 5 tokens: 2 * 1e9 * 2 * 8 = 3.2e10 FLOPs at 1e10/s = 3.2 s,
    # plus 5 decode steps reading 4e9 bytes at 2e10 B/s = 1 s
    estimate = CpuEstimate(
        num_params=10**9,
        flops=rollout_flops(10**9, 2, 3, 5),
        flops_per_s=1e10,
        weight_bytes=4 * 10**9,
        copy_bytes_per_s=2e10,
        response_len=5,
    )
    assert estimate.flops == 3.2e10 and abs(estimate.seconds - 4.2) < 1e-9
    assert estimate.describe().endswith("estimate ~4 s")
