"""Run verl's example scripts through relm: each `main_ppo` (or DAPO `main_dapo`) command line, with only its
data and model paths and its sizes changed, for one step on CPU.

    python bench/verl_scripts.py --verl-dir DIR [--only SUBSTRING ...] [--jsonl OUT] [--markdown]

`DIR` holds verl's `examples/` (and `recipe/dapo/`), e.g. from a checkout of verl's release branch and
its `recipe` submodule (verl-project/verl-recipe). Each script runs under bash with `python`, `python3`,
`ray` and the usual GPU-side commands replaced by a stub that records the command line instead of running
it, so the shell expands the script's own variables. The recorded overrides are then rewritten: data
files become relm's built-in task, model paths (the distillation teachers' too) `zoo:tiny/qwen2`, batch sizes
and lengths tiny, one step, no validation or checkpoints, one process. A multi-teacher distillation routes each
row by its data_source; the built-in task has one, so the first teacher's `key` becomes it (the others keep theirs
and score no row). On a machine without CUDA a `trainer.device=cuda` pin (the script's, or that of verl's
default file a `--config-path` composes) becomes `auto`; an Ascend `npu` pin stays. A `main_dapo` line that
names only `--config-name` gets main_dapo's own `config/` folder, where Hydra would look, and a value
the script leaves as a `<placeholder>` for its user a path. Everything else
(estimator, losses, loggers, engine names, the keys relm does not have) stays as the script wrote it. Each is run as `python -m relm.trainer.main_ppo`
with the verl folder as the working folder (so relative `--config-path`s resolve), and recorded as

- `ran`: exit 0 with one step in metrics.jsonl;
- `stopped`: exit 2 with one `error:` line (a feature relm does not have, named in the line);
- `failed`: anything else (a traceback, a timeout, no step).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import verl_script_fixtures as fixtures  # noqa: E402  (a sibling file: bench/ is no package)

ENTRY_MODULES = ("verl.trainer.main_ppo", "recipe.dapo.main_dapo")
STUBBED_COMMANDS = (
    "python", "python3", "ray", "nvidia-smi", "huggingface-cli", "hf", "wget", "curl", "pip", "pip3", "git",
    "sleep", "torchrun", "npu-smi", "ifconfig", "hostname",
)  # fmt: skip
TINY_MODEL = "zoo:tiny/qwen2"
PLACEHOLDER = "/path/filled/in/by/the/user"
DEMO_DATA_SOURCE = "relm/letters"
"""The built-in task's data_source (`relm.data.demo_task.DEMO_DATA_SOURCE`)."""
PROMPT_LEN, RESPONSE_LEN, BATCH, MINI_BATCH, MICRO_BATCH, MAX_TOKENS = 32, 16, 4, 2, 2, 256
OWN_PROMPT_LEN, OWN_MAX_TOKENS = 512, 1024
"""With a script's own data (`own_family`): a DAPO-Math prompt under a real chat template, or in characters,
fits in 512 tokens (the family models hold 1024 positions)."""

_STUB = """#!/bin/bash
for arg in "$@"; do
  case "$arg" in
    *main_ppo*|*main_dapo*) printf '%s\\0' "$@" > "$RELM_CAPTURE/$(date +%s%N).args"; exit 0;;
  esac
done
exit 0
"""


@dataclasses.dataclass
class ScriptRun:
    """One command line of one script and what relm made of it."""

    script: str
    index: int
    result: str = "failed"
    """`ran`, `stopped` or `failed`."""
    detail: str = ""
    """The `error:` line, or the last lines of output for a failure."""
    argv: list[str] = dataclasses.field(default_factory=list)


def find_scripts(verl_dir: Path) -> list[Path]:
    """Shell scripts under examples/ and recipe/dapo/ that start one of the entry modules."""
    found = []
    for root in ("examples", "recipe/dapo", "recipe/gspo"):
        for path in sorted((verl_dir / root).rglob("*.sh")):
            text = path.read_text(errors="replace")
            if any(module in text for module in ENTRY_MODULES):
                found.append(path)
    return found


def capture_command_lines(script: Path, verl_dir: Path, work: Path) -> list[list[str]]:
    """Run the script with stubs on PATH; the argv of each entry-module command it would have started."""
    stubs, capture, home = work / "stubs", work / "capture", work / "home"
    for folder in (stubs, capture, home):
        folder.mkdir(parents=True, exist_ok=True)
    for name in STUBBED_COMMANDS:
        stub = stubs / name
        stub.write_text(_STUB)
        stub.chmod(0o755)
    # `set -e`/`-u` would stop a script at its first unset variable (a user's WANDB key, a data folder).
    body = re.sub(r"^\s*set -[a-zA-Z]+.*$", "true", script.read_text(errors="replace"), flags=re.MULTILINE)
    # The copy runs from `work`; a script that finds the repository from its own place (gdpo_trainer's
    # `$(dirname "${BASH_SOURCE[0]}")/../..` for its reward file) must still see where it lives.
    body = body.replace("${BASH_SOURCE[0]}", str(script.resolve()))
    copy = work / script.name
    copy.write_text(body)
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "HOME": str(home), "RELM_CAPTURE": str(capture)}
    with contextlib.suppress(subprocess.TimeoutExpired):  # whatever it recorded until then counts
        subprocess.run(
            ["bash", str(copy)], cwd=verl_dir, env=env, timeout=30, capture_output=True, check=False
        )
    lines = []
    for record in sorted(capture.glob("*.args")):
        args = record.read_bytes().decode(errors="replace").split("\0")[:-1]
        record.unlink()
        for position, arg in enumerate(args):
            if arg == "-m" and position + 1 < len(args) and args[position + 1] in ENTRY_MODULES:
                lines.append(args[position + 1 :])
                break
    return lines


def _key(arg: str) -> str:
    return arg.partition("=")[0].lstrip("+~")


def _raw_key(arg: str) -> str:
    return arg.partition("=")[0]


def rewrite(
    module_and_args: list[str],
    verl_dir: Path,
    data: tuple[Path, Path],
    run_dir: Path,
    model_for: Callable[[str], str] = lambda path: TINY_MODEL,
    files_for: Callable[[str, int], str] | None = None,
    data_source: str = DEMO_DATA_SOURCE,
    reward_model_for: Callable[[str], str] | None = None,
    prompt_len: int = PROMPT_LEN,
    max_tokens: int = MAX_TOKENS,
) -> list[str]:
    """The overrides with paths and sizes replaced, plus what one step on CPU needs.

    `model_for` maps a script's model path to the one run instead, `files_for` a data-files value (and 0
    for train, 1 for val) to its stand-in; by default every model is `zoo:tiny/qwen2` and all data the
    built-in task (`data`). `data_source` is the one the data's rows name (for multi-teacher routing);
    `reward_model_for` maps a reward model's path (by default as `model_for` does)."""
    module, *args = module_and_args
    replace_files = files_for or (lambda value, split: str(data[split]))
    out: list[str] = []
    skip_next = False
    routed = (
        False  # a multi-teacher line: the first teacher's key is renamed to the built-in task's data_source
    )
    for position, arg in enumerate(args):
        if skip_next:
            skip_next = False
            continue
        if arg in ("--config-path", "-cp") and position + 1 < len(args):
            out += [arg, _config_path(args[position + 1], module, verl_dir)]
            skip_next = True
            continue
        if arg.startswith(("--config-path=", "-cp=")):
            flag, _, value = arg.partition("=")
            out.append(f"{flag}={_config_path(value, module, verl_dir)}")
            continue
        if arg.startswith("-") or "=" not in arg:
            out.append(arg)
            continue
        replaced = _replace(arg, model_for, reward_model_for or model_for, replace_files, max_tokens)
        if not routed and re.fullmatch(r"\+?distillation\.teacher_models\.[^.]+\.key", _raw_key(arg)):
            replaced, routed = f"{_raw_key(arg)}={data_source}", True
        if replaced is not None:
            out.append(replaced)
        # None: dropped (a size relm derives, or a path relm has no use for)
    forced = {
        "trainer.total_training_steps": "1",
        "trainer.total_epochs": "1",
        "trainer.val_before_train": "False",
        "trainer.test_freq": "-1",
        "trainer.save_freq": "-1",
        "trainer.n_gpus_per_node": "1",
        "trainer.nnodes": "1",
        "trainer.resume_mode": "disable",
        "trainer.default_local_dir": str(run_dir),
        "data.train_files": replace_files(_value(args, "data.train_files"), 0),
        "data.val_files": replace_files(_value(args, "data.val_files"), 1),
        "data.train_batch_size": str(BATCH),
        "data.max_prompt_length": str(prompt_len),
        "data.max_response_length": str(RESPONSE_LEN),
        "actor_rollout_ref.model.path": model_for(_value(args, "actor_rollout_ref.model.path")),
        "actor_rollout_ref.actor.ppo_mini_batch_size": str(MINI_BATCH),
    }
    if _value(args, "trainer.device") in ("", "cuda") and not _cuda():
        # A GPU pin (the script's, or verl's default file's `device: cuda` under `--config-path`) on a machine
        # without one: measure relm, not the host. An Ascend pin (`npu`) stays.
        forced["trainer.device"] = "auto"
    names_config = any(arg.startswith(("--config-name", "-cn")) for arg in args)
    names_path = any(arg.startswith(("--config-path", "-cp")) for arg in args)
    if module != ENTRY_MODULES[0] and names_config and not names_path:
        # Hydra looks a bare `--config-name` up in the entry module's own `config_path` (main_dapo's
        # `config/`); relm's main_ppo, standing in for it, would look in verl's trainer config.
        out = ["--config-path", _config_path("config", module, verl_dir), *out]
    # Appended after the script's own values, so they win (a later override replaces an earlier one).
    return out + [f"{key}={value}" for key, value in forced.items()]


def _config_path(value: str, module: str, verl_dir: Path) -> str:
    """Hydra resolves a relative `--config-path` against the entry module's folder; relm against the cwd."""
    if Path(value).is_absolute() or (verl_dir / value).is_dir():
        return value
    module_dir = verl_dir / Path(*module.split(".")[:-1])
    return str(module_dir / value) if (module_dir / value).is_dir() else value


def _value(args: list[str], key: str) -> str:
    """The last value the script gave `key` ("" when none)."""
    values = [arg.partition("=")[2] for arg in args if "=" in arg and _key(arg) == key]
    return values[-1] if values else ""


def _replace(
    arg: str,
    model_for: Callable[[str], str],
    reward_model_for: Callable[[str], str],
    files_for: Callable[[str, int], str],
    max_tokens: int,
) -> str | None:
    raw_key, _, value = arg.partition("=")
    key = raw_key.lstrip("+")
    leaf = key.rsplit(".", 1)[-1]
    if re.fullmatch(r"<[^<>]*>", value):
        # A placeholder the script leaves for its user (`<path_to_dist_ckpt>`); Hydra cannot parse it.
        return f"{raw_key}={PLACEHOLDER}"
    if key == "data.train_files":
        return f"{raw_key}={files_for(value, 0)}"
    if key == "data.val_files":
        return f"{raw_key}={files_for(value, 1)}"
    if key in ("actor_rollout_ref.model.path", "critic.model.path"):
        return f"{raw_key}={model_for(value)}"
    if key in ("reward_model.model.path", "reward.reward_model.model_path"):
        return f"{raw_key}={reward_model_for(value)}"
    if key.startswith("distillation.teacher_models.") and leaf == "model_path":
        return f"{raw_key}={model_for(value)}"
    if key in ("critic.model.tokenizer_path", "actor_rollout_ref.model.tokenizer_path", "data.tokenizer"):
        return None
    if key in ("data.train_batch_size", "data.val_batch_size", "data.gen_batch_size"):
        return f"{raw_key}={BATCH}"
    if key == "data.max_prompt_length":
        return None  # the forced value below
    if key in (
        "data.max_response_length",
        "reward_model.reward_kwargs.max_resp_len",
        "reward.reward_kwargs.max_resp_len",
    ):
        return f"{raw_key}={RESPONSE_LEN}"
    if key.endswith("overlong_buffer_cfg.len") or key == "reward_model.overlong_buffer.len":
        return f"{raw_key}={RESPONSE_LEN // 4}"
    if leaf == "ppo_mini_batch_size":
        return f"{raw_key}={MINI_BATCH}"
    if "micro_batch_size" in leaf:
        return f"{raw_key}={MICRO_BATCH}"
    if leaf == "fsdp_size":
        return f"{raw_key}=-1"  # one process: shard over all of it
    if "max_token_len" in leaf:
        return f"{raw_key}={max_tokens}"
    if key == "actor_rollout_ref.rollout.n":
        return f"{raw_key}={min(int(value), 2)}" if value.isdigit() else arg
    if key in (
        "actor_rollout_ref.rollout.max_num_batched_tokens",
        "actor_rollout_ref.rollout.max_model_len",
        "actor_rollout_ref.rollout.prompt_length",
        "actor_rollout_ref.rollout.response_length",
        "actor_rollout_ref.rollout.tensor_model_parallel_size",
        "actor_rollout_ref.rollout.max_num_seqs",
    ):
        return None
    return arg


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def run_one(argv: list[str], verl_dir: Path, run_dir: Path, timeout_s: int) -> tuple[str, str]:
    """(result, detail) of `python -m relm.trainer.main_ppo argv` in `verl_dir`."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RELM_DEBUG": ""}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "relm.trainer.main_ppo", *argv],
            cwd=verl_dir,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "failed", f"timed out after {timeout_s} s"
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    metrics = run_dir / "metrics.jsonl"
    if proc.returncode == 0 and metrics.is_file() and metrics.read_text().strip():
        return "ran", ""
    if proc.returncode == 2 and len(errors) == 1:
        return "stopped", errors[0]
    tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
    return "failed", f"exit {proc.returncode}: {tail}"


def check_config(argv: list[str], verl_dir: Path) -> tuple[str, str]:
    """(result, detail) of loading and validating the config alone, in this process: `ran` means it got
    as far as the run itself. Seconds instead of a minute per command line, for a first pass over all."""
    from relm.config.loader import load_config_with_warnings
    from relm.config.validate import validate_config
    from relm.errors import UserError

    cwd = Path.cwd()
    os.chdir(verl_dir)
    try:
        cfg, _ = load_config_with_warnings(argv)
        validate_config(cfg)
    except UserError as err:
        return "stopped", f"error: {err}"
    except Exception as err:  # a bug in relm: the table must show it, not stop the pass
        return "failed", f"{type(err).__name__}: {err}"
    finally:
        os.chdir(cwd)
    return "ran", "(config only)"


def run_scripts(
    verl_dir: Path,
    only: list[str] | None = None,
    timeout_s: int = 600,
    work: Path | None = None,
    config_only: bool = False,
    own_family: bool = False,
    progress: Path | None = None,
) -> list[ScriptRun]:
    """Every command line of every script (those whose path contains one of `only`, when given).

    `own_family`: each line gets a tiny model of its own architecture and data in its own format
    (`verl_script_fixtures`), vision-language lines are not run; otherwise `zoo:tiny/qwen2` and the
    built-in task for all. `progress`: each line's record is appended there as it is measured."""
    from relm.data.demo_task import write_demo_parquet

    work = work or Path(tempfile.mkdtemp(prefix="relm-verl-scripts-"))
    data = write_demo_parquet(work / "data", num_train=64, num_val=8)
    runs = []
    for script in find_scripts(verl_dir):
        name = str(script.relative_to(verl_dir))
        if only and not any(part in name for part in only):
            continue
        for index, command in enumerate(capture_command_lines(script, verl_dir, work / "capture")):
            run_dir = work / "runs" / f"{len(runs)}"
            if own_family:
                stand_ins = _own_family(command, work)
                if stand_ins is None:
                    runs.append(ScriptRun(name, index, fixtures.VISION_LANGUAGE, "", command))
                    print(f"{fixtures.VISION_LANGUAGE} {name}#{index}", flush=True)
                    if progress is not None:
                        with progress.open("a") as out:
                            out.write(json.dumps(dataclasses.asdict(runs[-1])) + "\n")
                    continue
                argv = rewrite(
                    command,
                    verl_dir,
                    data,
                    run_dir,
                    *stand_ins,
                    prompt_len=OWN_PROMPT_LEN,
                    max_tokens=OWN_MAX_TOKENS,
                )
            else:
                argv = rewrite(command, verl_dir, data, run_dir)
            # The config alone first (in-process, a fraction of a second): most stops happen there.
            result, detail = check_config(argv, verl_dir)
            if result == "ran" and not config_only:
                result, detail = run_one(argv, verl_dir, run_dir, timeout_s)
            runs.append(ScriptRun(name, index, result, detail, argv))
            print(f"{result:8} {name}#{index} {detail}", flush=True)
            if progress is not None:  # a long table keeps what it measured if stopped part-way
                with progress.open("a") as out:
                    out.write(json.dumps(dataclasses.asdict(runs[-1])) + "\n")
    return runs


def _files(value: str) -> list[str]:
    """The paths of a data-files value: one path, or a list as Hydra writes it (`['a', 'b']`)."""
    value = value.strip()
    if value.startswith("["):
        return [part.strip().strip("'\"") for part in value[1:-1].split(",") if part.strip()]
    return [value] if value else []


def _own_family(
    command: list[str], work: Path
) -> tuple[Callable[[str], str], Callable[[str, int], str], str, Callable[[str], str]] | None:
    """(model_for, files_for, data_source, reward_model_for) of the line's own family and data, or None
    for a vision-language line."""
    args = command[1:]
    model_paths = [
        arg.partition("=")[2]
        for arg in args
        if "=" in arg and (_key(arg).endswith("model.path") or _key(arg).endswith(".model_path"))
    ]
    data_files = _files(_value(args, "data.train_files")) + _files(_value(args, "data.val_files"))
    if fixtures.is_vision_language(model_paths, data_files):
        return None

    def model_for(path: str) -> str:
        family = fixtures.family_of(path)
        if family is None:
            return TINY_MODEL
        return str(fixtures.write_family_model(family, work / "models" / family.name))

    def reward_model_for(path: str) -> str:
        family = fixtures.family_of(path) or fixtures.family_of("qwen2")
        assert family is not None
        folder = work / "models" / f"{family.name}-reward"
        return str(fixtures.write_family_model(family, folder, reward=True))

    def files_for(value: str, split: int) -> str:
        paths = [
            str(fixtures.write_data(fixtures.data_kind(path), work / "data")[split]) for path in _files(value)
        ]
        if not paths:
            return str(fixtures.write_data("demo", work / "data")[split])
        return paths[0] if len(paths) == 1 else "[" + ",".join(paths) + "]"

    kinds = [fixtures.data_kind(path) for path in _files(_value(args, "data.train_files"))] or ["demo"]
    return model_for, files_for, fixtures.DATA_SOURCES[kinds[0]], reward_model_for


def markdown(runs: list[ScriptRun]) -> str:
    """The table docs/configuration.md shows: script, result, the line it stopped with."""
    lines = ["| Script | Result | Line |", "| --- | --- | --- |"]
    for run in runs:
        suffix = f" #{run.index + 1}" if run.index else ""
        detail = run.detail.replace("|", "\\|")
        lines.append(f"| `{run.script}`{suffix} | {run.result} | {detail} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verl-dir", type=Path, required=True)
    parser.add_argument("--only", nargs="*", help="run scripts whose path contains one of these")
    parser.add_argument("--jsonl", type=Path, help="write one JSON record per command line here")
    parser.add_argument("--markdown", action="store_true", help="print the table for docs/configuration.md")
    parser.add_argument("--timeout", type=int, default=600)
    parser.add_argument(
        "--config-only", action="store_true", help="load and validate each config, do not train"
    )
    parser.add_argument(
        "--demo",
        action="store_true",
        help="zoo:tiny/qwen2 and the built-in task for every line (the old table)",
    )
    args = parser.parse_args()
    runs = run_scripts(
        args.verl_dir.resolve(),
        args.only,
        args.timeout,
        config_only=args.config_only,
        own_family=not args.demo,
        progress=args.jsonl.with_suffix(".partial.jsonl") if args.jsonl else None,
    )
    if args.jsonl:
        args.jsonl.write_text("".join(json.dumps(dataclasses.asdict(run)) + "\n" for run in runs))
    if args.markdown:
        print(markdown(runs))
    results = ("ran", "stopped", "failed", fixtures.VISION_LANGUAGE)
    counts = {result: sum(run.result == result for run in runs) for result in results}
    print(f"{len(runs)} command lines: {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
