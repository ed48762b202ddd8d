"""Samples a person can read: what the model was asked, what it answered, and what that scored.

verl's `trainer.rollout_data_dir` and `trainer.validation_data_dir` write one `{step}.jsonl` per step (the
training responses) or per validation (every validation response), one object per response with verl's
field names: `input` (the prompt as text), `output` (the response as text), `gts` (the ground truth),
`score`, `step`, then the reward function's extra values. Texts are decoded with special tokens skipped,
as verl does. Each file is written to a temporary name and renamed into place, so a run killed at any
moment leaves only complete files behind. A dump folder is marked as one run's at the start
(`claim_dump_folders`): a folder holding a user's files or another run's dumps is refused rather than
written over, and validation dumps sharing the rollout dumps' folder are named `validation_{step}.jsonl`.

`trainer.log_val_generations=N` shows N validation samples at every validation, chosen as verl chooses
them (sorted by input, shuffled with seed 42, the first N), so the same prompts come back at every step
and a reader watches one answer change: printed on the console, appended to `RUN_DIR/val_generations.jsonl`,
and as a table in W&B (`val/generations`, one row per validation) or text in TensorBoard where those
loggers are on.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from relm.config.specs import LoopSpec
from relm.errors import UserError
from relm.learner.batch import Scored
from relm.trainer.durable import write_atomic_text

logger = logging.getLogger("relm")

VAL_GENERATIONS_FILE = "val_generations.jsonl"
"""Where the jsonl logger appends the `log_val_generations` samples, in the run folder."""

VAL_GENERATIONS_SEED = 42
"""verl's fixed shuffle seed for choosing the logged validation samples."""

DUMP_MARK_FILE = ".relm_dumps"
"""In each dump folder: the run folder whose run writes there (see `claim_dump_folders`)."""

SHARED_FOLDER_PREFIX = "validation_"
"""Prefix of the validation dumps when they share the rollout dumps' folder."""

CONSOLE_TEXT_CHARS = 400
"""Longest prompt or response text the console shows in full; the files keep everything."""


@dataclass
class GenerationSample:
    """One response as a person reads it."""

    input: str
    """The prompt, decoded (special tokens skipped)."""
    output: str
    """The response, decoded (special tokens skipped)."""
    gts: Any
    """The row's ground truth (`reward_model.ground_truth`)."""
    score: float
    """The response's total score (the reward function's, plus any shaping such as the overlong penalty)."""
    extras: dict[str, float] = field(default_factory=dict)
    """The numbers the reward function returned beside the score (NaN where it gave none)."""

    def record(self, step: int) -> dict[str, Any]:
        """The jsonl object, verl's keys first; non-finite numbers become null so every line is valid JSON."""
        row = {"input": self.input, "output": self.output, "gts": self.gts, "score": _finite(self.score)}
        row["step"] = step
        for name, value in self.extras.items():
            row.setdefault(name, _finite(value))
        return row


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def decode_rows(tokenizer: PreTrainedTokenizerBase, ids: torch.Tensor, mask: torch.Tensor) -> list[str]:
    """The text of each row's masked tokens: [N, T] ids and mask -> N strings."""
    rows = [ids[row][mask[row].bool()].tolist() for row in range(ids.shape[0])]
    return tokenizer.batch_decode(rows, skip_special_tokens=True)


def rollout_samples(tokenizer: PreTrainedTokenizerBase, batch: Scored) -> list[GenerationSample]:
    """A step's responses from its scored batch, in the batch's row order."""
    rollout = batch.rollout
    inputs = decode_rows(tokenizer, rollout.prompt_ids, rollout.prompt_mask)
    # tool results included
    outputs = decode_rows(tokenizer, rollout.response_ids, rollout.response_attention_mask)
    scores = batch.token_scores.sum(-1).tolist()
    extras = batch.reward_extras
    return [
        GenerationSample(inputs[row], outputs[row], rollout.ground_truths[row], scores[row], extras[row])
        for row in range(len(batch))
    ]


def write_step_dump(folder: Path, step: int, samples: list[GenerationSample], prefix: str = "") -> Path:
    """Write `folder/{prefix}{step}.jsonl` (one object per sample) atomically; returns its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{prefix}{step}.jsonl"
    # default=str: a ground truth of an unusual type (a date, a numpy scalar) is shown rather than fatal
    text = "".join(
        json.dumps(sample.record(step), ensure_ascii=False, default=str) + "\n" for sample in samples
    )
    write_atomic_text(path, text)
    return path


def dump_folder(setting: str | None) -> Path | None:
    """The folder a `*_data_dir` setting names (`~` expanded; relative to the working folder, as in verl)."""
    return Path(setting).expanduser() if setting else None


def validation_dump_prefix(trainer: LoopSpec) -> str:
    """`validation_` when both dump settings name one folder (the two would share `{step}.jsonl`), else ``."""
    rollout, validation = dump_folder(trainer.rollout_data_dir), dump_folder(trainer.validation_data_dir)
    if rollout is None or validation is None or rollout.resolve() != validation.resolve():
        return ""
    return SHARED_FOLDER_PREFIX


def claim_dump_folders(trainer: LoopSpec, run_dir: Path) -> None:
    """Make the dump folders this run's before anything is written: new or empty, or already this run's.

    A folder relm dumps into gets `.relm_dumps` naming the run folder. A folder with other files and no
    such mark (a user's `1.jsonl`, dumps of a run from before the mark existed) or marked by another run
    is refused, so no dump ever replaces a file this run did not write.

    Raises:
        UserError: a dump folder holds files that are not this run's.
    """
    owner = str(run_dir.resolve())
    for key, setting in (
        ("trainer.rollout_data_dir", trainer.rollout_data_dir),
        ("trainer.validation_data_dir", trainer.validation_data_dir),
    ):
        folder = dump_folder(setting)
        if folder is None:
            continue
        mark = folder / DUMP_MARK_FILE
        if mark.is_file():
            marked = json.loads(mark.read_text(encoding="utf-8") or "{}").get("run")
            if marked != owner:
                raise UserError(
                    f"{key}: {folder} holds the samples of the run in {marked}; give this run its own folder"
                )
            continue
        others = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
        if others:
            shown = ", ".join(f"`{name}`" for name in others[:3]) + (" ..." if len(others) > 3 else "")
            raise UserError(
                f"{key}: {folder} holds files relm did not write for this run ({shown}); relm never replaces "
                "them: give an empty or new folder"
            )
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic_text(mark, json.dumps({"run": owner}) + "\n")
    if validation_dump_prefix(trainer):
        logger.info(
            "trainer.rollout_data_dir and trainer.validation_data_dir are one folder: validation samples "
            "are written as %s{step}.jsonl beside the training ones ({step}.jsonl)",
            SHARED_FOLDER_PREFIX,
        )


def pick_val_generations(samples: list[GenerationSample], count: int) -> list[GenerationSample]:
    """verl's choice of the samples to log: sorted by input (stably), shuffled with seed 42, the first `count`.

    The validation prompts are the same at every validation, so the same ones are chosen each time.
    """
    ordered = sorted(samples, key=lambda sample: sample.input)
    order = np.arange(len(ordered))
    np.random.RandomState(VAL_GENERATIONS_SEED).shuffle(order)
    return [ordered[i] for i in order[:count]]


def generations_table(samples: list[GenerationSample], step: int) -> tuple[list[str], list[Any]]:
    """verl's W&B table layout: columns `step, input_1, output_1, score_1, ...`, one row for this validation."""
    row: list[Any]  # the step, then strings and scores
    columns, row = ["step"], [step]
    for index, sample in enumerate(samples, start=1):
        columns += [f"input_{index}", f"output_{index}", f"score_{index}"]
        row += [sample.input, sample.output, sample.score]
    return columns, row


def generations_markdown(samples: list[GenerationSample]) -> str:
    """The samples as a markdown list, for TensorBoard's text tab."""
    parts = []
    for index, sample in enumerate(samples, start=1):
        parts.append(
            f"**sample {index}** (score {sample.score:.4g})\n\n**input**\n\n```\n{sample.input}\n```\n\n"
            f"**output**\n\n```\n{sample.output}\n```"
        )
    return "\n\n".join(parts)


def console_lines(samples: list[GenerationSample], step: int, total: int) -> list[str]:
    """Plain rows for the console: one header, then score, input and output of each sample on its own line."""
    lines = [f"validation samples at step {step} ({len(samples)} of {total}):"]
    for index, sample in enumerate(samples, start=1):
        lines.append(f"  [{index}] score={sample.score:.4g} gts={sample.gts!r}")
        lines.append(f"      input:  {_one_line(sample.input)}")
        lines.append(f"      output: {_one_line(sample.output)}")
    return lines


def _one_line(text: str) -> str:
    shown = json.dumps(text, ensure_ascii=False)  # newlines as \n: one sample stays on one line
    if len(shown) > CONSOLE_TEXT_CHARS:
        shown = shown[: CONSOLE_TEXT_CHARS - 3] + "..."
    return shown


class ValidationSamples:
    """Where validation samples go: `trainer.validation_data_dir` and `trainer.log_val_generations`.

    Call `write` on the main process only; the W&B table and TensorBoard text go to the run those
    loggers opened (W&B's current run; a writer of its own in `RUN_DIR/tensorboard`).
    """

    def __init__(self, trainer: LoopSpec, run_dir: Path) -> None:
        self.dump_dir = dump_folder(trainer.validation_data_dir)
        self.dump_prefix = validation_dump_prefix(trainer)
        self.num_logged = max(0, trainer.log_val_generations)
        self.loggers = list(trainer.loggers)
        self.run_dir = run_dir
        self._wandb_rows: list[list[Any]] = []
        self._tensorboard: Any = None

    @property
    def wanted(self) -> bool:
        """Whether validation needs to keep its samples (decoding prompts costs a little)."""
        return self.dump_dir is not None or self.num_logged > 0

    def write(self, step: int, samples: list[GenerationSample]) -> None:
        """Dump every sample to `{step}.jsonl` and log the chosen few."""
        if self.dump_dir is not None:
            logger.info(
                "validation samples in %s", write_step_dump(self.dump_dir, step, samples, self.dump_prefix)
            )
        if self.num_logged > 0 and samples:
            self._log(step, pick_val_generations(samples, self.num_logged), len(samples))

    def _log(self, step: int, chosen: list[GenerationSample], total: int) -> None:
        if "console" in self.loggers:
            print("\n".join(console_lines(chosen, step, total)), flush=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with (self.run_dir / VAL_GENERATIONS_FILE).open("a", encoding="utf-8") as file:
            for sample in chosen:
                record = sample.record(step)
                file.write(json.dumps({k: record[k] for k in ("step", "input", "output", "score")}) + "\n")
        if "wandb" in self.loggers:
            import wandb

            columns, row = generations_table(chosen, step)
            self._wandb_rows.append(row)
            # A logged W&B table is frozen: log a new one holding every validation so far, as verl does.
            if wandb.run is not None:
                wandb.run.log(
                    {"val/generations": wandb.Table(columns=columns, data=self._wandb_rows)}, step=step
                )
        if "tensorboard" in self.loggers:
            if self._tensorboard is None:
                from torch.utils.tensorboard import SummaryWriter

                self._tensorboard = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))
            self._tensorboard.add_text("val/generations", generations_markdown(chosen), global_step=step)
            self._tensorboard.flush()

    def close(self) -> None:
        if self._tensorboard is not None:
            self._tensorboard.close()


def dump_rollout(setting: str, tokenizer: PreTrainedTokenizerBase, batch: Scored, step: int) -> Path:
    """`trainer.rollout_data_dir`: the step's responses into `{step}.jsonl`; returns its path."""
    folder = dump_folder(setting)
    assert folder is not None, "called only when trainer.rollout_data_dir is set"
    return write_step_dump(folder, step, rollout_samples(tokenizer, batch))
