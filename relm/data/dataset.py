"""`PromptDataset`: chat prompts from verl- or TRL-format data, tokenized and length-filtered.

The sources (parquet, jsonl/json, csv, `save_to_disk` folders, Hub ids) are opened by
`relm.data.sources`; this module reads their rows. Every way a user's data can be wrong is checked
here, at construction, and reported as one line naming the file, column or row and the fix, because
a malformed row found at step 300 costs the user the 299 steps before it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from transformers import PreTrainedTokenizerBase

from relm.config.specs import DataSpec
from relm.config.validate import TRUNCATION_MODES
from relm.data.custom_dataset import custom_rows, load_dataset_class, takes_max_samples
from relm.data.sources import load_table
from relm.errors import UserError
from relm.models.tokenizer import TemplateRefused, encode_prompt

logger = logging.getLogger(__name__)

MISSING_DATA_SOURCE = "unknown"
"""`data_source` of rows in files without the `data.reward_fn_key` column."""

VERL_ANSWER = "reward_model.ground_truth"
ANSWER_COLUMNS = ("ground_truth", "solution", "answer")
"""Top-level columns (TRL's datasets) that hand the reward its `ground_truth` when a file has no verl
`reward_model.ground_truth`, in this order of preference."""


class PromptDataset:
    """Prompts read from files, folders or Hub datasets, chat template applied and tokenized.

    Tokenization is eager (all rows at construction): RL prompt sets are small next to the
    rollouts they feed, and it turns every bad row or overlong prompt into an error or a count
    before the first step instead of in the middle of training. A prompt longer than
    `max_prompt_length` tokens is dropped when `filter_overlong_prompts` is on (the default: a
    truncated question may have another answer); otherwise `truncation` decides, as in verl:
    `error` stops with the row named, `left` keeps the last tokens, `right` the first, `middle` the
    first and last halves. Each item is a dict with `prompt_ids`, `data_source`, `ground_truth`,
    `extra_info`, `index` (position in this dataset), `file`, `row` (row in that file), `raw_prompt`
    (the row's chat messages) and `truncated` (whether the ids were cut).

    A row's prompt is a list of chat messages (verl, TRL's conversational format) or a string (TRL's
    standard format), which becomes one user message. Its `ground_truth` is verl's
    `reward_model.ground_truth`, or where a file has none, its first column among `ANSWER_COLUMNS`.
    `max_samples` keeps that many rows of all files together before tokenizing, as verl 0.9's
    `data.train_max_samples` / `data.val_max_samples`: a seeded random subset when `shuffle` is on,
    else the first rows.

    Args:
        files: Sources (`relm.data.sources`): parquet/jsonl/json/csv files, `save_to_disk` folders,
            Hub dataset ids; verl's layout (`prompt`, `data_source`, `reward_model`, `extra_info`) or TRL's.
        tokenizer: Tokenizer whose chat template renders the prompts.
        prompt_key: Column of chat message lists or prompt strings (`data.prompt_key`).
        reward_fn_key: Column whose value selects the rule scorer (`data.reward_fn_key`).
        max_prompt_length: Longest prompt kept, in tokens after the chat template.
        custom_chat_template: A template replacing the tokenizer's own.
        chat_template_kwargs: Extra template variables (`data.apply_chat_template_kwargs`).
        filter_overlong_prompts: Drop overlong prompts (`data.filter_overlong_prompts`).
        truncation: What to do with an overlong prompt that is not dropped (`data.truncation`).
        return_raw_chat: Also hand the raw messages to the batch (`data.return_raw_chat`).
        files_key: Config key the files came from, named in error messages.
        split: Split of a Hub dataset or saved `DatasetDict` that names none.
        max_samples: Rows kept (-1 or 0: all).
        shuffle: `max_samples` draws a random subset (else the first rows).
        seed: Seed of that draw.
        answer_needed_by: What reads `ground_truth` for sure (the built-in scorers): a file without an
            answer column is then an error; None makes it a warning (a custom reward may not need one).
    """

    def __init__(
        self,
        files: list[str],
        tokenizer: PreTrainedTokenizerBase,
        *,
        prompt_key: str = "prompt",
        reward_fn_key: str = "data_source",
        max_prompt_length: int,
        custom_chat_template: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        filter_overlong_prompts: bool = True,
        truncation: str = "error",
        return_raw_chat: bool = False,
        files_key: str = "data.train_files",
        split: str = "train",
        max_samples: int = -1,
        shuffle: bool = False,
        seed: int = 0,
        answer_needed_by: str | None = None,
        custom_cls: tuple[str, str] | None = None,
        verl_config: Any = None,
    ) -> None:
        if isinstance(files, (str, Path)):
            files = [files]  # verl accepts a single path where a list is expected
        if not files:
            raise UserError(f"{files_key}: no files given; pass one or more parquet files")
        if truncation not in TRUNCATION_MODES:
            raise UserError(f"data.truncation={truncation!r}: must be one of {', '.join(TRUNCATION_MODES)}")
        self.return_raw_chat = return_raw_chat
        self.max_prompt_length = max_prompt_length
        self.num_filtered = 0
        self.num_truncated = 0
        self._items: list[dict[str, Any]] = []
        longest_filtered = 0
        shortest = None
        rows: list[dict[str, Any]] = []
        answers: dict[str, str | None] = {}
        if custom_cls is not None:
            # The user's verl dataset class reads the files (and draws `max_samples` where it takes it).
            cls = load_dataset_class(*custom_cls)
            read = custom_rows(
                cls, list(map(str, files)), tokenizer, dict(verl_config or {}),
                max_samples=max_samples, prompt_key=prompt_key, reward_fn_key=reward_fn_key,
            )  # fmt: skip
            source = f"{cls.__name__} item"
            rows = [
                dict(
                    item,
                    raw_prompt=_check_messages(item["raw_prompt"], source, row, prompt_key),
                    file=source,
                    row=row,
                )
                for row, item in enumerate(read)
            ]
            if takes_max_samples(cls):
                max_samples = -1  # drawn by the class already
        for file in files if custom_cls is None else []:
            file_rows, answers[str(file)] = _rows(
                load_table(str(file), files_key, split), file, prompt_key, reward_fn_key
            )
            rows += [dict(item, file=str(file), row=row) for row, item in enumerate(file_rows)]
        if not rows:
            raise UserError(f"{files_key}: the files {list(map(str, files))} hold no rows; add prompts")
        if custom_cls is None:
            _report_answer_columns(answers, files_key, answer_needed_by)
        kept = sample_rows(len(rows), max_samples, shuffle=shuffle, seed=seed)
        if len(kept) < len(rows):
            logger.info(
                "%s: kept %d of %d rows (%s=%d, %s)",
                files_key,
                len(kept),
                len(rows),
                files_key.replace("_files", "_max_samples"),
                max_samples,
                f"a random subset, seed {seed}" if shuffle else "the first rows: data.shuffle=false",
            )
        for item in (rows[i] for i in kept):
            file, row = item["file"], item["row"]
            try:
                ids = encode_prompt(tokenizer, item["raw_prompt"], custom_chat_template, chat_template_kwargs)
            except TemplateRefused as exc:
                raise exc.prefixed(f"data.prompt_key: '{file}' row {row}") from exc
            length = len(ids)
            if length == 0:
                # Only without a chat template: empty contents joined make an empty text.
                raise UserError(
                    f"data.prompt_key: '{file}' row {row}: the prompt encodes to no tokens; give it "
                    "text, or a chat template (actor_rollout_ref.model.custom_chat_template)"
                )
            shortest = length if shortest is None else min(shortest, length)
            if length > max_prompt_length and filter_overlong_prompts:
                self.num_filtered += 1
                longest_filtered = max(longest_filtered, length)
                continue
            if length > max_prompt_length and truncation == "error":
                raise UserError(
                    f"data.truncation=error: '{file}' row {row} is {length} tokens (chat template "
                    f"included), longer than data.max_prompt_length={max_prompt_length}; raise "
                    "data.max_prompt_length, set data.filter_overlong_prompts=true to drop such prompts, "
                    "or data.truncation=left|right|middle to cut them"
                )
            item["prompt_ids"] = truncate_prompt(ids, max_prompt_length, truncation)
            item["truncated"] = length > max_prompt_length
            self.num_truncated += item["truncated"]
            item["index"] = len(self._items)
            self._items.append(item)
        if not self._items:
            raise UserError(
                f"data.max_prompt_length: all {self.num_filtered} prompts in {files_key} are longer than "
                f"{max_prompt_length} tokens (shortest {shortest}, chat template included); raise "
                f"data.max_prompt_length to at least {shortest}"
            )
        if self.num_filtered:
            logger.warning(
                "dropped %d of %d prompts in %s longer than data.max_prompt_length=%d tokens (longest %d)",
                self.num_filtered,
                self.num_filtered + len(self._items),
                files_key,
                max_prompt_length,
                longest_filtered,
            )
        if self.num_truncated:
            logger.warning(
                "cut %d of %d prompts in %s to data.max_prompt_length=%d tokens (data.truncation=%s)",
                self.num_truncated,
                len(self._items),
                files_key,
                max_prompt_length,
                truncation,
            )

    @classmethod
    def from_spec(
        cls,
        data: DataSpec,
        files: list[str],
        tokenizer: PreTrainedTokenizerBase,
        *,
        chat_template: str | None = None,
        builtin_scorers: bool = True,
        files_key: str = "data.train_files",
        tools: list[dict[str, Any]] | None = None,
    ) -> PromptDataset:
        """The dataset the run's data spec (`data.*`) and `chat_template` (the actor's
        `custom_chat_template`) describe, so training and validation prompts are rendered and cut the same
        way. `builtin_scorers`: the rule scorers score the run (no custom function, no reward model), so
        each row needs its answer. `tools`: the function schemas a multi-turn run's chat template lists in
        every prompt (as verl's agent loop does).

        Validation (`files_key="data.val_files"`) takes `data.val_max_samples` and a Hub dataset's
        `test` split; training `data.train_max_samples` and `train` (TRL's default splits). Both draw
        their subset with `data.shuffle` and `data.seed`, as verl's `RLHFDataset` does."""
        validation = files_key == "data.val_files"
        template_kwargs = dict(data.chat_template_kwargs)
        if tools:
            template_kwargs["tools"] = tools
        return cls(
            files,
            tokenizer,
            prompt_key=data.prompt_key,
            reward_fn_key=data.reward_fn_key,
            max_prompt_length=data.max_prompt_length,
            custom_chat_template=chat_template,
            chat_template_kwargs=template_kwargs,
            filter_overlong_prompts=data.filter_overlong_prompts,
            truncation=data.truncation,
            return_raw_chat=data.return_raw_chat,
            files_key=files_key,
            split="test" if validation else "train",
            max_samples=data.val_max_samples if validation else data.train_max_samples,
            shuffle=data.shuffle,
            seed=data.seed,
            answer_needed_by="the built-in scorers (no custom_reward_function.path)"
            if builtin_scorers
            else None,
            custom_cls=data.custom_cls,
            verl_config=data.verl_config,
        )

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self._items[index]


def truncate_prompt(ids: list[int], max_length: int, mode: str) -> list[int]:
    """At most `max_length` of `ids`, cut as verl's `data.truncation` says.

    `left` keeps the last tokens (the end of the question and the generation prompt), `right` the
    first, `middle` the first `max_length // 2` and the last `max_length - max_length // 2`
    (verl's `postprocess_data`). `error` leaves the ids as they are: the caller raises.
    """
    if len(ids) <= max_length or mode == "error":
        return list(ids)
    if mode == "left":
        return list(ids[len(ids) - max_length :])
    if mode == "right":
        return list(ids[:max_length])
    if mode == "middle":
        left = max_length // 2
        return list(ids[:left]) + list(ids[len(ids) - (max_length - left) :])
    raise ValueError(f"unknown truncation mode {mode!r}")


def sample_rows(total: int, max_samples: int, *, shuffle: bool, seed: int) -> list[int]:
    """Row positions kept by verl 0.9's `max_samples`: all when it is <= 0 or >= `total`; else a
    subset drawn without replacement by `numpy.random.default_rng(seed).choice` when `shuffle` is on (in
    the drawn order, as verl's `Dataset.select(indices)`), or the first `max_samples` rows."""
    if max_samples <= 0 or max_samples >= total:
        return list(range(total))
    if shuffle:
        return [int(i) for i in np.random.default_rng(seed).choice(total, size=max_samples, replace=False)]
    return list(range(max_samples))


def _report_answer_columns(answers: dict[str, str | None], files_key: str, needed_by: str | None) -> None:
    """One line saying where the reward's `ground_truth` comes from; an error or a warning where nowhere."""
    missing = [file for file, column in answers.items() if column is None]
    if missing and needed_by is not None:
        raise UserError(
            f"{files_key}: '{missing[0]}' has no answer for the reward (no {VERL_ANSWER} and no "
            f"{' / '.join(ANSWER_COLUMNS)} column), which {needed_by} compare responses with; add one, or "
            "set custom_reward_function.path to a reward that needs none"
        )
    if missing:
        logger.warning(
            "%s: %s %s no %s and no %s column: the reward gets ground_truth None for %s rows",
            files_key,
            ", ".join(f"'{file}'" for file in missing),
            "has" if len(missing) == 1 else "have",
            VERL_ANSWER,
            " / ".join(ANSWER_COLUMNS),
            "its" if len(missing) == 1 else "their",
        )
    found = {column for column in answers.values() if column is not None}
    if len(found) == 1:
        logger.info("%s: the reward gets ground_truth from column '%s'", files_key, found.pop())
    elif found:
        logger.info(
            "%s: the reward gets ground_truth from %s",
            files_key,
            ", ".join(f"column '{column}' of '{file}'" for file, column in answers.items() if column),
        )


def _rows(
    table: pa.Table, file: str | Path, prompt_key: str, reward_fn_key: str
) -> tuple[list[dict[str, Any]], str | None]:
    """Rows of one file as dicts, each field checked (raises UserError on the first bad one), and the
    column their `ground_truth` came from (None: no answer column)."""
    columns = table.column_names
    if prompt_key not in columns:
        raise UserError(
            f"data.prompt_key: '{file}' has no column '{prompt_key}' (columns: {', '.join(columns)}); "
            "set data.prompt_key to the column holding the prompt (chat messages or text)"
        )
    prompts = table.column(prompt_key).to_pylist()
    num_rows = len(prompts)
    if reward_fn_key in columns:
        data_sources = table.column(reward_fn_key).to_pylist()
    else:
        logger.warning(
            "'%s' has no column '%s' (data.reward_fn_key): its rows get data_source '%s', so only a "
            "custom_reward_function can score them",
            file,
            reward_fn_key,
            MISSING_DATA_SOURCE,
        )
        data_sources = [MISSING_DATA_SOURCE] * num_rows
    answer_column, ground_truths = _answers(table)
    extra_infos = table.column("extra_info").to_pylist() if "extra_info" in columns else [None] * num_rows

    rows = []
    for row in range(num_rows):
        extra_info = extra_infos[row]
        rows.append(
            {
                "raw_prompt": _check_messages(prompts[row], file, row, prompt_key),
                "data_source": str(data_sources[row])
                if data_sources[row] is not None
                else MISSING_DATA_SOURCE,
                "ground_truth": ground_truths[row],
                "extra_info": dict(extra_info) if isinstance(extra_info, dict) else {},
            }
        )
    return rows, answer_column


def _answers(table: pa.Table) -> tuple[str | None, list[Any]]:
    """Each row's ground truth and the column it comes from: verl's `reward_model.ground_truth` where the
    file has it, else the first of `ANSWER_COLUMNS` the file has, else (None, all None)."""
    columns = table.column_names
    if "reward_model" in columns:
        cells = table.column("reward_model").to_pylist()
        values = [cell.get("ground_truth") if isinstance(cell, dict) else None for cell in cells]
        if any(value is not None for value in values):
            return VERL_ANSWER, values
    for name in ANSWER_COLUMNS:
        if name in columns:
            return name, table.column(name).to_pylist()
    return None, [None] * table.num_rows


def _check_messages(cell: Any, file: str | Path, row: int, prompt_key: str) -> list[dict[str, str]]:
    where = f"data.prompt_key: '{file}' row {row} column '{prompt_key}'"
    fix = 'it must be a text or a non-empty list of {"role": ..., "content": ...} messages'
    if isinstance(cell, str):  # TRL's standard format: the prompt text, asked by the user
        return [{"role": "user", "content": cell}]
    if not isinstance(cell, list) or not cell:
        raise UserError(f"{where} is {_describe(cell)}; {fix}")
    messages = []
    for position, message in enumerate(cell):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise UserError(f"{where}: message {position} is {_describe(message)}; {fix}")
        if not isinstance(message["role"], str) or not isinstance(message["content"], str):
            raise UserError(
                f"{where}: message {position} has role {_describe(message['role'])} and content "
                f"{_describe(message['content'])}; both must be strings"
            )
        messages.append({"role": message["role"], "content": message["content"]})
    return messages


def _describe(value: Any) -> str:
    """A short, one-line rendering of a bad value for an error message."""
    text = " ".join(repr(value).split())
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"
