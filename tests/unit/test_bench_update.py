"""`relm bench update` runs the trainer's actor update on a mixed-length batch and reports it."""

from __future__ import annotations

import json

import torch

from relm.bench.update import main, synthetic_batch


def test_synthetic_batch_spreads_response_lengths():
    batch = synthetic_batch(rows=200, prompt_len=4, response_len=40, vocab=50)
    lengths = batch.rollout.response_mask.sum(-1)
    assert lengths.min() >= 10 and lengths.max() <= 40 and lengths.float().std() > 5
    # the mask is a prefix of each response, and padding carries token id 0
    assert torch.equal(batch.rollout.response_mask, (torch.arange(40)[None] < lengths[:, None]).long())
    assert (batch.rollout.response_ids[batch.rollout.response_mask == 0] == 0).all()


def test_bench_update_runs_packed_on_cpu(tmp_path, capsys):
    out = tmp_path / "update.json"
    args = ["--model", "zoo:tiny/qwen2", "--rows", "6", "--prompt-len", "8", "--response-len", "16"]
    assert main([*args, "--max-tokens", "60", "--repeats", "1", "--device", "cpu", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["packed"] and result["tokens"] == int(
        synthetic_batch(6, 8, 16, 1).rollout.attention_mask.sum()
    )
    assert result["mfu"] is None and result["update_s"] > 0
    assert "relm bench update: zoo:tiny/qwen2, 6 responses" in capsys.readouterr().out


def test_bench_update_refuses_bad_sizes(capsys):
    assert main(["--rows", "0"]) == 2
    assert capsys.readouterr().err.startswith("error: --rows")
