"""README's tour, run as written: the commands are read from README.md's text, not copied here.

Every command block of README is a `<!-- tour:NAME -->` block (or the set-up block of `make` targets), and
each block runs here: GSM8K, the verl command line and the reward file on the real files; the demo's
overrides, export, two processes, the bench and the mistake on the demo; vLLM's block in the vllm group
(`make setup-vllm`). They run in a folder laid out like a clone beside the workspace's `shared/` (examples/
linked in, the real files at `../shared/realworld`), with `.venv/bin/python` and `.venv/bin/relm` standing for
this interpreter. The GSM8K run must leave a sample dump a person can read: decoded prompt and response text,
the ground truth and a score, and the lines README shows must be what the run printed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
REALWORLD = SHARED / "realworld"


def tour_commands(name: str = "gsm8k") -> list[str]:
    """A README block's shell commands (`<!-- tour:NAME -->`), continuation lines joined."""
    block = re.compile(rf"<!-- tour:{name} -->\n```bash\n(?P<body>.*?)```\n<!-- /tour:{name} -->", re.DOTALL)
    match = block.search((REPO / "README.md").read_text(encoding="utf-8"))
    assert match, f"README.md has no <!-- tour:{name} --> bash block"
    return [line for line in match["body"].replace("\\\n", " ").splitlines() if line.strip()]


DEMO_BLOCKS = ("overrides", "export", "gpus", "bench")
"""Blocks on the demo (no files needed), run by test_readme_demo_tour_runs_as_written, in README's order."""
RUN_BLOCKS = {"gsm8k", "verl", "reward", "mistake", "vllm", *DEMO_BLOCKS}
"""Every tour block and the test that runs it; a block README adds must be added here, and run."""


def readme_blocks() -> list[tuple[str | None, str]]:
    """README's fenced command blocks (bash, or a console block starting `$ `): (tour name or None, body)."""
    fence = re.compile(r"(?:<!-- tour:(?P<name>[\w-]+) -->\n)?```(?P<lang>\w*)\n(?P<body>.*?)```", re.DOTALL)
    return [
        (match["name"], match["body"])
        for match in fence.finditer(_readme())
        if match["lang"] == "bash" or match["body"].startswith("$ ")
    ]


def test_every_readme_command_block_is_a_tour_block_that_a_test_runs():
    """README cannot grow a command that nothing runs: each block is set-up (`make` targets) or a tour block."""
    named = set()
    for name, body in readme_blocks():
        if name is None:
            assert all(line.startswith("make ") for line in body.splitlines() if line.strip()), body
        else:
            named.add(name)
    assert named == RUN_BLOCKS


def as_argv(command: str) -> list[str]:
    argv = shlex.split(command)
    if argv[0] in (".venv/bin/python", "python"):
        return [sys.executable, *argv[1:]]
    if argv[0] == ".venv/bin/relm":
        return [sys.executable, "-m", "relm.cli", *argv[1:]]
    return argv


def test_readme_gsm8k_tour_runs_as_written_and_its_dump_reads(tmp_path: Path):
    if not (REALWORLD / "data" / "gsm8k").is_dir() or not (REALWORLD / "tokenizers" / "qwen2.5").is_dir():
        pytest.skip(f"{REALWORLD} is not on this machine")
    clone = tmp_path / "relm"
    clone.mkdir()
    (clone / "examples").symlink_to(REPO / "examples")
    (tmp_path / "shared").symlink_to(SHARED)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("RELM_DEBUG", None)

    outputs = []
    for command in tour_commands():
        done = subprocess.run(
            as_argv(command), cwd=clone, env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        outputs.append(done.stdout)

    run_dir = clone / "outputs" / "gsm8k-grpo"
    # `.relm_dumps` marks the folder as this run's dump folder (docs/security.md)
    assert sorted(p.name for p in (run_dir / "rollout").iterdir() if not p.name.startswith(".")) == [
        "1.jsonl",
        "2.jsonl",
    ]
    questions = {
        json.loads(line)["question"]
        for line in (REALWORLD / "data" / "gsm8k" / "train.jsonl").read_text(encoding="utf-8").splitlines()
    }
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for step in (1, 2):
        rows = [json.loads(line) for line in (run_dir / "rollout" / f"{step}.jsonl").read_text().splitlines()]
        assert len(rows) == 4 * 2
        for row in rows:
            # The prompt decodes to the chat template's text around a real GSM8K question...
            assert row["input"].startswith("system\n") and row["input"].endswith("assistant\n")
            assert any(question in row["input"] for question in questions)
            # ...and the response to text (random weights: any text, but text of the real vocabulary).
            assert isinstance(row["output"], str) and row["output"]
            assert "\ufffd" not in row["input"]
            assert isinstance(row["score"], float) and row["gts"].lstrip("-").replace(".", "").isdigit()
            assert row["step"] == step
        assert sum(r["score"] for r in rows) / len(rows) == pytest.approx(
            steps[step - 1]["critic/score/mean"]
        )

    # What README shows under the commands is what `head` printed (README trims the long texts).
    printed = [json.loads(line) for line in outputs[-1].splitlines()]
    assert len(printed) == 2
    shown = re.search(
        r"in the real vocabulary \(trimmed here\):\n\n```\n(?P<text>.*?)```", _readme(), re.DOTALL
    )
    assert shown, "README shows no dump excerpt after the tour"
    shown_lines = shown["text"].splitlines()
    assert len(shown_lines) == len(printed)
    for line, row in zip(shown_lines, printed, strict=True):
        shown_input = re.search(r'"input": "(?P<prefix>[^"…]*)', line)["prefix"]
        assert json.dumps(row["input"], ensure_ascii=False)[1:].startswith(shown_input)
        assert f'"gts": "{row["gts"]}"' in line and f'"step": {row["step"]}' in line


def _readme() -> str:
    return (REPO / "README.md").read_text(encoding="utf-8")


def test_readme_verl_command_and_reward_file_run_as_written(tmp_path: Path):
    """The verl command line of "What relm is" and step 4's reward file and command, as README writes them:
    verl's paths under a home folder (the GSM8K parquet from the preprocess example, a model folder named as
    in the command), the reward file from README's python block."""
    if not (REALWORLD / "data" / "gsm8k").is_dir() or not (REALWORLD / "tokenizers" / "qwen2.5").is_dir():
        pytest.skip(f"{REALWORLD} is not on this machine")
    clone, home = tmp_path / "relm", tmp_path / "home"
    clone.mkdir()
    home.mkdir()
    (clone / "examples").symlink_to(REPO / "examples")
    (tmp_path / "shared").symlink_to(SHARED)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "HOME": str(home),
    }
    env.pop("RELM_DEBUG", None)

    def run(command: str) -> str:
        done = subprocess.run(
            as_argv(command), cwd=clone, env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        return done.stderr

    preprocess, tiny_model = tour_commands()[:2]
    run(preprocess)  # outputs/gsm8k and outputs/tiny-qwen2.5, as step 3 made them
    run(tiny_model)
    run(f"{preprocess.split(' --local_save_dir ')[0]} --local_save_dir {home}/data/gsm8k")
    run(tiny_model.replace("outputs/tiny-qwen2.5", f"{home}/models/Qwen2.5-0.5B-Instruct"))

    (verl_command,) = tour_commands("verl")
    run(verl_command)
    run_dir = clone / "outputs" / "verl-gsm8k"
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [1]

    reward_file = re.search(r"Bring your reward.*?```python\n(?P<code>.*?)```", _readme(), re.DOTALL)
    assert reward_file, "README shows no reward function"
    (clone / "my_reward.py").write_text(reward_file["code"], encoding="utf-8")
    (reward_command,) = tour_commands("reward")
    run(reward_command)
    steps = [
        json.loads(line)
        for line in (clone / "outputs" / "my-reward" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [s["step"] for s in steps] == [1] and steps[0][
        "critic/score/mean"
    ] == 0.0  # exact match: random text


def _clone(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    clone = tmp_path / "relm"
    clone.mkdir()
    (clone / "examples").symlink_to(REPO / "examples")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("RELM_DEBUG", None)
    return clone, env


def _steps(run_dir: Path) -> list[dict]:
    """A run's training steps (the validation before the first step is a record of its own, step 0)."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [record for record in map(json.loads, filter(str.strip, lines)) if "actor/pg_loss" in record]


def test_readme_demo_tour_runs_as_written(tmp_path: Path):
    """Steps 2, 6, 8 and 11 on the demo, as README writes them: dotted overrides, a saved checkpoint plotted,
    exported and loaded by transformers, two CPU processes (the demo's micro-batch of 32 follows each one's
    16 responses; before, the run stopped at `32 x 2 GPUs must divide`), the bench sized for a CPU; then
    step 5's mistake prints README's line and exits 2. Each run writes its own folder."""
    clone, env = _clone(tmp_path)
    printed = {}
    for block in DEMO_BLOCKS:
        for command in tour_commands(block):
            done = subprocess.run(
                as_argv(command), cwd=clone, env=env, capture_output=True, text=True, timeout=600
            )
            assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
            printed[command] = done.stdout

    grpo = _steps(clone / "outputs" / "demo-grpo")
    assert [r["step"] for r in grpo] == list(range(1, 6)) and all("actor/kl_loss" in r for r in grpo)
    saved = clone / "outputs" / "demo-saved"
    assert (saved / "global_step_4").is_dir() and (saved / "curves.png").is_file()
    assert (clone / "my-model" / "config.json").is_file()
    assert int(printed[tour_commands("export")[-1]].strip().splitlines()[-1]) > 0  # the loaded model's size
    assert [r["step"] for r in _steps(clone / "outputs" / "demo-2gpus")] == [1, 2]

    (mistake,) = [body for name, body in readme_blocks() if name == "mistake"]
    command, expected = mistake.splitlines()[:2]
    done = subprocess.run(
        as_argv(command.removeprefix("$ ")), cwd=clone, env=env, capture_output=True, text=True, timeout=600
    )
    assert (done.returncode, done.stderr.strip()) == (2, expected)


@pytest.mark.vllm
def test_readme_vllm_block_runs_as_written(tmp_path: Path):
    """Step 10 after `make setup-vllm` (the block's first line, done by the vllm group's own set-up)."""
    pytest.importorskip("vllm")
    clone, env = _clone(tmp_path)
    for command in tour_commands("vllm"):
        if command.startswith("make "):
            continue
        done = subprocess.run(
            as_argv(command), cwd=clone, env=env, capture_output=True, text=True, timeout=900
        )
        assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    steps = _steps(clone / "outputs" / "demo-vllm")
    assert [r["step"] for r in steps] == [1, 2] and all("rollout/logprob_diff_max" in r for r in steps)
