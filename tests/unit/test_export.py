"""`relm export`: a checkpoint's actor (and critic) reload with transformers' Auto classes, same outputs."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

from relm.cli import main as relm_main
from relm.config.loader import load_config
from relm.config.translate import translate
from relm.models.loading import resolve_model_dir
from relm.models.value_model import load_value_model
from relm.trainer.checkpoint import save_checkpoint
from relm.trainer.components import RunComponents, build_components

TOKENS = torch.tensor([[3, 7, 11, 5, 2, 9], [1, 4, 4, 8, 6, 2]])


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> RunComponents:
    """A run's components with weights moved off their initial values, saved as global_step_3."""
    run_dir = tmp_path_factory.mktemp("run")
    cfg = load_config(["data.train_batch_size=4", "actor_rollout_ref.rollout.n=2",
                       "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                       "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
                       f"trainer.default_local_dir={run_dir}"])  # fmt: skip
    c = build_components(translate(cfg)[0], resolve_model_dir(cfg.actor_rollout_ref.model.path))
    # Weights that differ from the zoo's initial ones: an export that re-read the base model would fail.
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for module in (c.actor.module, c.critic.module):
            for param in module.parameters():
                param.add_(0.02 * torch.randn(param.shape, generator=generator))
    save_checkpoint(c, 3)
    return c


def test_actor_reloads_with_identical_logits(run: RunComponents, tmp_path: Path):
    out = tmp_path / "hf"
    assert relm_main(["export", str(run.run_dir / "global_step_3"), str(out)]) == 0
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer_config.json"} <= names
    assert "optimizer.pt" not in names
    model = AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        assert torch.equal(model(TOKENS).logits, run.actor.module(TOKENS).logits)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer("ab")["input_ids"] == run.tokenizer("ab")["input_ids"]


def test_critic_export_reloads_backbone_and_value_head(run: RunComponents, tmp_path: Path):
    out = tmp_path / "hf"
    out.mkdir()  # an empty folder is fine
    assert relm_main(["export", str(run.run_dir), str(out), "--critic"]) == 0  # run folder: its latest step
    assert sorted(p.name for p in out.iterdir()) == ["actor", "critic"]
    assert (out / "critic" / "tokenizer_config.json").is_file()
    assert not (out / "critic" / "optimizer.pt").exists()
    mask = torch.ones_like(TOKENS)
    positions = torch.arange(TOKENS.shape[1]).expand_as(TOKENS)
    with torch.no_grad():
        hidden = AutoModel.from_pretrained(out / "critic")(TOKENS).last_hidden_state
        assert torch.equal(hidden, run.critic.module.backbone(input_ids=TOKENS).last_hidden_state)
        values = load_value_model(str(out / "critic"), dtype=torch.float32, device="cpu")(
            TOKENS, mask, positions
        )
        assert torch.equal(values, run.critic.module(TOKENS, mask, positions))
        assert values.abs().sum() > 0  # the trained head was read, not a fresh zero head


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:"), err
    return err[0]


def test_bad_inputs_are_one_line_exit_2(run: RunComponents, tmp_path: Path, capsys):
    checkpoint = run.run_dir / "global_step_3"
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    assert relm_main(["export", str(checkpoint), str(busy)]) == 2
    assert "already exists and is not empty" in one_error_line(capsys)
    assert [p.name for p in busy.iterdir()] == ["keep.txt"]

    assert relm_main(["export", str(tmp_path / "nothing"), str(tmp_path / "a")]) == 2
    assert "is not a relm checkpoint" in one_error_line(capsys)

    half = tmp_path / "global_step_9"
    (half / "actor").mkdir(parents=True)
    assert relm_main(["export", str(half), str(tmp_path / "b")]) == 2
    assert "incomplete checkpoint" in one_error_line(capsys)

    staging = tmp_path / ".global_step_9.tmp"
    staging.mkdir()
    assert relm_main(["export", str(staging), str(tmp_path / "c")]) == 2
    assert "never finished" in one_error_line(capsys)


def test_a_pruned_actor_is_named(tmp_path: Path, capsys):
    checkpoint = tmp_path / "global_step_1"
    (checkpoint / "critic").mkdir(parents=True)
    (checkpoint / "trainer_state.pt").write_bytes(b"")
    assert relm_main(["export", str(checkpoint), str(tmp_path / "out")]) == 2
    assert "max_actor_ckpt_to_keep" in one_error_line(capsys)
    assert not (tmp_path / "out").exists()


def test_critic_of_a_run_without_one_says_so(tmp_path: Path, capsys):
    checkpoint = tmp_path / "global_step_1"
    (checkpoint / "actor").mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "../trainer_state.pt"):  # only looked at, not read
        (checkpoint / "actor" / name).write_bytes(b"")
    assert relm_main(["export", str(checkpoint), str(tmp_path / "out"), "--critic"]) == 2
    line = one_error_line(capsys)
    assert "the run trained without one" in line and "max_critic_ckpt_to_keep" not in line


def test_exported_files_are_readable_by_others(run: RunComponents, tmp_path: Path):
    weights = run.run_dir / "global_step_3" / "actor" / "model.safetensors"
    weights.chmod(0o600)  # as a checkpoint written through a private temporary file is
    previous = os.umask(0o022)
    try:
        assert relm_main(["export", str(run.run_dir / "global_step_3"), str(tmp_path / "hf")]) == 0
    finally:
        os.umask(previous)
    for file in (tmp_path / "hf").iterdir():
        assert stat.S_IMODE(file.stat().st_mode) == 0o644, file.name
