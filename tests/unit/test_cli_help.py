"""`--help` on every command, `relm --version`, and `relm config KEY` read from the schema."""

from __future__ import annotations

import subprocess
import sys

import pytest

from relm import __version__
from relm.cli import main as relm_main
from relm.config.lookup import describe_key, train_help
from relm.trainer.main_ppo import main as main_ppo

COMMANDS = [
    [],
    ["train"],
    ["config"],
    ["compat"],
    ["export"],
    ["plot"],
    ["bench"],
    ["bench", "step"],
    ["bench", "rollout"],
    ["bench", "update"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_on_every_command_exits_0_with_a_usage_line(command, capsys):
    try:
        code = relm_main([*command, "--help"])
    except SystemExit as exc:  # argparse's --help
        code = exc.code
    out = capsys.readouterr().out
    assert code == 0
    assert "usage: relm " + (command[0] if command else "") in out


HELP_WITHOUT_TORCH = """
import sys
from relm.cli import main
try:
    main(sys.argv[1:] + ["--help"])
except SystemExit:
    pass
print(sorted({"torch", "transformers"} & set(sys.modules)))
"""


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_imports_neither_torch_nor_transformers(command):
    """`--help` answers in a fraction of a second: it never imports torch or transformers (18-31 s
    on a busy 2-core machine before, for `train`, `export` and `compat`). Checked in a fresh process."""
    run = subprocess.run(
        [sys.executable, "-c", HELP_WITHOUT_TORCH, *command], capture_output=True, text=True, check=True
    )
    assert run.stdout.strip().splitlines()[-1] == "[]", run.stdout[-500:]


def test_bench_rollout_compile_modes_are_the_native_engines():
    from relm.bench.rollout import COMPILE_MODES
    from relm.rollout.native.engine import COMPILE_MODES as ENGINE_MODES

    assert (None, *COMPILE_MODES) == ENGINE_MODES


def test_main_ppo_help_and_relm_version():
    assert main_ppo(["--help"]) == 0
    run = subprocess.run(
        [sys.executable, "-m", "relm.cli", "--version"], capture_output=True, text=True, check=False
    )
    assert (run.returncode, run.stdout.strip()) == (0, f"relm {__version__}")


def test_train_help_lists_every_section_and_the_lookup_command():
    text = train_help()
    for section in ("data", "actor_rollout_ref", "critic", "algorithm", "trainer", "custom_reward_function"):
        assert f"\n  {section} " in text
    assert "relm config KEY" in text


def test_config_key_prints_type_default_and_doc():
    text = describe_key("data.max_prompt_length")
    assert "type:    int" in text
    assert "default: 512" in text
    assert "Longest prompt in tokens" in text
    assert "default: native" in describe_key("actor_rollout_ref.rollout.name")


def test_config_section_lists_its_keys_and_verl_keys_say_they_are_unused():
    assert "  actor_rollout_ref.rollout.temperature" in describe_key("actor_rollout_ref.rollout")
    assert "does not use" in describe_key("actor_rollout_ref.model.use_liger")


def test_config_unknown_key_is_one_error_line_with_a_suggestion(capsys):
    assert relm_main(["config", "data.max_promt_length"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: unknown key `data.max_promt_length`; did you mean `data.max_prompt_length`?"


def test_bench_step_prompt_len_below_the_chat_template_is_one_line(tmp_path):
    from relm.bench.step import write_prompts
    from relm.errors import UserError
    from relm.models.loading import resolve_model_dir
    from relm.models.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(resolve_model_dir("zoo:tiny/qwen2"))
    with pytest.raises(UserError, match=r"--prompt-len 16 leaves no room .* use --prompt-len \d+ or more"):
        write_prompts(tmp_path / "p.parquet", tokenizer, 2, 16)


@pytest.mark.vllm  # without vLLM installed the run falls back to the native engine (one warning line)
def test_vllm_on_cpu_with_the_demo_models_head_size_is_one_line_before_loading(capsys):
    pytest.importorskip("vllm")
    assert main_ppo(["actor_rollout_ref.rollout.name=vllm", "trainer.device=cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: `actor_rollout_ref.rollout.name=vllm` on CPU: vLLM's CPU attention kernels")
    assert "head size 16" in err and "zoo:tiny/qwen2-hd64" in err and "\n" not in err
