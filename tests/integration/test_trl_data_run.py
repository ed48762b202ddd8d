"""A TRL user's own jsonl trains as it is, and the run is then evaluated from its folder alone."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.integration


def test_trl_jsonl_trains_one_step_then_val_only_reads_the_run_folder(train, tmp_path, write_reward) -> None:
    # TRL's standard format: the prompt as text, the answer in a top-level `solution` column. The reward
    # returns the answer it was handed, so the score shows that column reached it.
    data = tmp_path / "trl.jsonl"
    data.write_text("".join(json.dumps({"prompt": c, "solution": "0.25"}) + "\n" for c in "aeost" * 2))
    reward = write_reward(
        """
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            return float(ground_truth)
        """
    )
    result = train(
        f"data.train_files={data}",
        f"data.val_files={data}",
        "data.val_max_samples=3",
        f"custom_reward_function.path={reward}",
        "data.max_prompt_length=24",
        "trainer.total_training_steps=1",
        "trainer.save_freq=1",
    )
    assert result.exit_code == 0, result.stderr
    assert "the reward gets ground_truth from column 'solution'" in result.stderr
    assert [r["critic/score/mean"] for r in result.metrics] == [0.25]

    # Evaluation of that run names only its folder: model, data, reward and sizes come from its config.yaml.
    evaluated = train("trainer.val_only=true", run_dir=result.run_dir, tiny=False)
    assert evaluated.exit_code == 0, evaluated.stderr
    assert "loading checkpoint" in evaluated.stderr and "global_step_1" in evaluated.stderr
    assert "data.val_files: kept 3 of 10 rows (data.val_max_samples=3" in evaluated.stderr
    last = evaluated.metrics[-1]
    assert last["step"] == 1 and any(k.startswith("val-core/") and v == 0.25 for k, v in last.items()), last
