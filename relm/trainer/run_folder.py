"""Who owns a run folder: one run at a time (a lock), and only relm's own files (a manifest).

verl uses the same default run folder layout (`global_step_N/`, `latest_checkpointed_iteration.txt`), and
users point `trainer.default_local_dir` at folders that hold their own files. relm must never delete or
replace what it did not write, and two runs started on one folder must not interleave their checkpoints.

- `relm.lock` is held with `fcntl.flock` for the whole run and holds the PID and command of the run
  holding it. A second run on the folder stops with exit 2 naming them. The kernel drops the lock when
  its process dies (kill -9 included), so a stale file left by a dead run is simply taken over. A
  torchrun run holds it in one process: `relm train`'s own when it started torchrun (the workers see
  `RELM_RUN_LOCK_HELD`), global rank 0 otherwise.
- `relm_run.json` says the folder is relm's and lists the checkpoint steps relm wrote there; only those
  are ever replaced or pruned (`relm.trainer.checkpoint`). A folder with files but no manifest is taken
  only when everything in it is relm's by name and it holds a relm run's metrics or checkpoints (a run
  folder from before the manifest existed: each `global_step_N` with relm's `trainer_state.pt`, a
  `config.yaml` that is relm's resolved config); anything else (verl's checkpoints, a user's files,
  a user's own `config.yaml`) is refused before anything is written.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from relm.errors import UserError
from relm.trainer.durable import write_atomic_text

logger = logging.getLogger("relm")

LOCK_FILE = "relm.lock"
MANIFEST_FILE = "relm_run.json"
LOCK_HELD_ENV = "RELM_RUN_LOCK_HELD"
"""`PID:FOLDER` of the lock this process holds, inherited by the processes it starts (torchrun's workers)."""

RELM_NAMES = re.compile(
    r"(config\.yaml(\.partial)?|curves\.png|metrics(\.[\w.-]+)?\.jsonl|val_generations\.jsonl"
    r"|latest_checkpointed_iteration\.txt(\.tmp)?|tensorboard(\.[\w.-]+)?|wandb"
    r"|\.global_step_\d+\.(tmp|old|deleting)|relm\.lock|relm_run\.json(\.tmp)?)"
)
"""Names relm writes in a run folder besides `global_step_N/` (which must hold `trainer_state.pt`)."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return True


@contextmanager
def run_folder_lock(run_dir: Path, command: str | None = None) -> Iterator[None]:
    """Hold `run_dir/relm.lock` for the body; another holder makes it raise `UserError` at once.

    Raises:
        UserError: another live run holds the folder (named by PID and command).
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    held = f"{os.getpid()}:{run_dir.resolve()}"
    if os.environ.get(LOCK_HELD_ENV, "").partition(":")[2] == str(run_dir.resolve()):
        yield  # the process that started this one (`relm train` -> torchrun) holds it
        return
    path = run_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
            pid = holder[0] if holder else "?"
            what = holder[1] if len(holder) > 1 else "?"
            if pid.isdigit() and not _pid_alive(int(pid)):
                raise UserError(
                    f"trainer.default_local_dir: {run_dir} is held by a process left behind by the run of PID "
                    f"{pid} ({what}), which has ended; stop it (`fuser {path}` names it) or use another folder"
                ) from None
            raise UserError(
                f"trainer.default_local_dir: {run_dir} is in use by another run (PID {pid}: {what}); wait for "
                "it to end or stop it, or give this run another trainer.default_local_dir"
            ) from None
        previous = os.pread(fd, 4096, 0).decode("utf-8", errors="replace").split("\n", 1)[0].strip()
        if previous.isdigit() and int(previous) != os.getpid():
            logger.info("took over %s from PID %s, which has ended", path, previous)
        text = f"{os.getpid()}\n{command or ' '.join(sys.argv)}\n".encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, text, 0)
        os.environ[LOCK_HELD_ENV] = held
        try:
            yield
        finally:
            os.environ.pop(LOCK_HELD_ENV, None)
            os.ftruncate(fd, 0)  # a PID left in the file means its run died holding the folder
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def recorded_steps(run_dir: Path) -> set[int]:
    """The checkpoint steps relm wrote in `run_dir` (empty without a manifest)."""
    path = run_dir / MANIFEST_FILE
    if not path.is_file():
        return set()
    try:
        return {int(step) for step in json.loads(path.read_text(encoding="utf-8"))["checkpoints"]}
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(
            f"{path}: not readable ({type(exc).__name__}); it lists the checkpoints relm wrote there: restore "
            "it, or give this run another trainer.default_local_dir"
        ) from exc


def _write_manifest(run_dir: Path, steps: set[int]) -> None:
    text = json.dumps({"owner": "relm", "checkpoints": sorted(steps)}) + "\n"
    write_atomic_text(run_dir / MANIFEST_FILE, text)


def record_checkpoint(run_dir: Path, step: int) -> None:
    """Add `step` to the manifest (before its folder is renamed into place, so no relm folder is unlisted)."""
    _write_manifest(run_dir, recorded_steps(run_dir) | {step})


def forget_checkpoint(run_dir: Path, step: int) -> None:
    """Drop `step` from the manifest once its folder is gone."""
    _write_manifest(run_dir, recorded_steps(run_dir) - {step})


def _is_relm_checkpoint(path: Path) -> bool:
    return path.is_dir() and (path / "trainer_state.pt").is_file()


def foreign_entries(run_dir: Path) -> list[str]:
    """Entries of `run_dir` relm would not have written there (sorted names)."""
    foreign = []
    for path in run_dir.iterdir():
        if re.fullmatch(r"global_step_\d+", path.name):
            if not _is_relm_checkpoint(path):
                foreign.append(path.name)
        elif not RELM_NAMES.fullmatch(path.name):
            foreign.append(path.name)
    return sorted(foreign)


def _empty(run_dir: Path) -> bool:
    return all(path.name in (LOCK_FILE, MANIFEST_FILE) for path in run_dir.iterdir())


def _was_relm_run(run_dir: Path, checkpoints: set[int]) -> bool:
    """A folder a relm run wrote before the manifest existed: its metrics or checkpoints, and a config.yaml
    (if any) that is relm's resolved config rather than a user's file of the same name."""
    if not checkpoints and not (run_dir / "metrics.jsonl").is_file():
        return False
    config = run_dir / "config.yaml"
    if not config.is_file():
        return True
    try:
        saved = yaml.safe_load(config.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError):
        return False
    return isinstance(saved, dict) and "default_local_dir" in (saved.get("trainer") or {})


def claim_run_folder(run_dir: Path) -> None:
    """Make `run_dir` relm's (under the lock): new or empty, already relm's, or refused.

    Raises:
        UserError: the folder holds files relm did not write (another tool's checkpoints, a user's files).
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    if (run_dir / MANIFEST_FILE).is_file():
        recorded_steps(run_dir)  # readable, or one line saying so
        return
    foreign = foreign_entries(run_dir)
    if foreign:
        shown = ", ".join(f"`{name}`" for name in foreign[:3]) + (" ..." if len(foreign) > 3 else "")
        raise UserError(
            f"trainer.default_local_dir: {run_dir} holds files relm did not write ({shown}) and relm never "
            "replaces or deletes those: give this run an empty or new trainer.default_local_dir"
        )
    legacy = {int(p.name.removeprefix("global_step_")) for p in run_dir.glob("global_step_*")}
    if not _empty(run_dir) and not _was_relm_run(run_dir, legacy):
        raise UserError(
            f"trainer.default_local_dir: {run_dir} holds files that do not look like a relm run's (no "
            f"{MANIFEST_FILE}, no metrics.jsonl or checkpoint beside them) and relm never replaces those: give "
            "this run an empty or new trainer.default_local_dir"
        )
    if legacy:
        logger.info(
            "%s: a relm run folder from before %s existed; its checkpoints (steps %s) are recorded as relm's",
            run_dir, MANIFEST_FILE, ", ".join(map(str, sorted(legacy))),
        )  # fmt: skip
    _write_manifest(run_dir, legacy)
