"""`relm bench rollout` end to end on CPU with a tiny model: it runs, and its numbers are consistent."""

from __future__ import annotations

import json
import math

from relm.bench.rollout import TABLE_HEADER, main, markdown_row


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
    assert "zoo:NAME" in capsys.readouterr().err
