"""LoRA runs end to end on CPU: the engine's separate copy is synced with merged adapters and checked, a
sync that does not arrive ends the run with one line, and a LoRA checkpoint exports as a PEFT folder and,
merged, as a plain model, both computing the trained policy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from relm.learner.lora import LoraSettings, add_lora
from relm.models.loading import load_causal_lm
from relm.trainer import components
from relm.trainer.export import export_checkpoint
from relm.trainer.main_ppo import main

pytestmark = [pytest.mark.integration]
peft = pytest.importorskip("peft")

SMALL = [
    "data.train_batch_size=4",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "data.max_response_length=8",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "trainer.logger=[jsonl]",
    "actor_rollout_ref.model.lora_rank=8",
    "actor_rollout_ref.actor.use_kl_loss=true",
]


@pytest.fixture
def small(varied_reward: str) -> list[str]:
    """`SMALL` with a reward that varies between responses, so the adapters train from the first step at
    any seed (`tests.integration.conftest.VARIED_REWARD`)."""
    return [*SMALL, varied_reward]


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def bf16_engine_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Generate with a separate bf16 copy of the actor, as a GPU run does (CPU runs share the fp32 actor)."""
    monkeypatch.setattr(components, "generation_dtype", lambda *args: torch.bfloat16)


def test_a_separate_engine_copy_takes_every_sync(tmp_path: Path, small: list[str], bf16_engine_copy: None):
    run = [*small, "trainer.total_training_steps=3", f"trainer.default_local_dir={tmp_path / 'run'}"]
    assert main(run) == 0
    records = metrics(tmp_path / "run")
    assert [r["step"] for r in records] == [1, 2, 3]
    # The engine sampled with the merged bf16 weights of the policy the trainer scores in fp32: the gap is
    # bf16 rounding, the same after every sync (a stale copy would drift away from the trained adapters).
    assert all(r["rollout/logprob_diff_max"] < 0.1 for r in records), [
        r["rollout/logprob_diff_max"] for r in records
    ]
    assert records[-1]["actor/kl_loss"] > 0  # the adapters moved the policy off its base, the reference


def test_a_sync_that_does_not_arrive_ends_the_run_with_one_line(
    tmp_path: Path,
    small: list[str],
    bf16_engine_copy: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
):
    real = components.build_run_engine

    def engine_that_drops_syncs(*args, **kwargs):
        engine = real(*args, **kwargs)
        monkeypatch.setattr(engine, "sync_weights", lambda named: None)  # the adapter never arrives
        return engine

    monkeypatch.setattr(components, "build_run_engine", engine_that_drops_syncs)
    code = main([*small, "trainer.total_training_steps=2", f"trainer.default_local_dir={tmp_path / 'run'}"])
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("relm ")]
    assert code == 1
    assert len(err) == 1 and "AdapterNotSynced" in err[0] and "old policy" in err[0], err


def test_a_lora_checkpoint_exports_as_an_adapter_and_merged(tmp_path: Path, small: list[str]):
    run_dir = tmp_path / "run"
    run = [
        *small,
        "trainer.total_training_steps=2",
        "trainer.save_freq=2",
        f"trainer.default_local_dir={run_dir}",
    ]
    assert main(run) == 0
    actor_dir = run_dir / "global_step_2" / "actor"
    assert (actor_dir / "adapter_config.json").is_file() and not (actor_dir / "model.safetensors").exists()

    adapter_out, merged_out = tmp_path / "adapter", tmp_path / "merged"
    export_checkpoint(run_dir, adapter_out)
    export_checkpoint(run_dir, merged_out, merge=True)
    assert not (merged_out / "adapter_config.json").exists() and (merged_out / "model.safetensors").is_file()

    base = json.loads((actor_dir / "adapter_config.json").read_text())["base_model_name_or_path"]
    trained = load_causal_lm(base, dtype=torch.float32, device="cpu")
    add_lora(trained, LoraSettings(rank=8, alpha=16, adapter_path=str(actor_dir)))
    ids = torch.tensor([[2, 40, 41, 42, 3, 2, 50, 51]])
    with torch.no_grad():
        expected = trained(input_ids=ids).logits
        # transformers loads a PEFT folder onto the base it names (peft installed); the merged one is plain.
        via_peft = AutoModelForCausalLM.from_pretrained(adapter_out).eval()(input_ids=ids).logits
        merged = AutoModelForCausalLM.from_pretrained(merged_out).eval()(input_ids=ids).logits
        base_logits = load_causal_lm(base, dtype=torch.float32, device="cpu")(input_ids=ids).logits
    assert (expected - base_logits).abs().max() > 1e-4  # the adapters were trained
    torch.testing.assert_close(via_peft, expected, rtol=0, atol=0)
    torch.testing.assert_close(merged, expected, rtol=1e-5, atol=1e-5)
