"""`PromptDataset`: chat prompts from verl-format parquet files, tokenized and length-filtered.

Every way a user's parquet can be wrong is checked here, at construction, and reported as one
line naming the file, column or row and the fix, because a malformed row found at step 300 costs
the user the 299 steps before it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from transformers import PreTrainedTokenizerBase

from relm.config.schema import RelmConfig
from relm.config.validate import TRUNCATION_MODES
from relm.errors import UserError
from relm.models.tokenizer import TemplateRefused, encode_prompt

logger = logging.getLogger(__name__)

MISSING_DATA_SOURCE = "unknown"
"""`data_source` of rows in files without the `data.reward_fn_key` column."""


class PromptDataset:
    """Prompts read from parquet, chat template applied and tokenized.

    Tokenization is eager (all rows at construction): RL prompt sets are small next to the
    rollouts they feed, and it turns every bad row or overlong prompt into an error or a count
    before the first step instead of in the middle of training. A prompt longer than
    `max_prompt_length` tokens is dropped when `filter_overlong_prompts` is on (the default: a
    truncated question may have another answer); otherwise `truncation` decides, as in verl:
    `error` stops with the row named, `left` keeps the last tokens, `right` the first, `middle` the
    first and last halves. Each item is a dict with `prompt_ids`, `data_source`, `ground_truth`,
    `extra_info`, `index` (position in this dataset), `file`, `row` (row in that file), `raw_prompt`
    (the row's chat messages) and `truncated` (whether the ids were cut).

    Args:
        files: Parquet files in verl's layout (`prompt`, `data_source`, `reward_model`, `extra_info`).
        tokenizer: Tokenizer whose chat template renders the prompts.
        prompt_key: Column of chat message lists (`data.prompt_key`).
        reward_fn_key: Column whose value selects the rule scorer (`data.reward_fn_key`).
        max_prompt_length: Longest prompt kept, in tokens after the chat template.
        custom_chat_template: A template replacing the tokenizer's own.
        chat_template_kwargs: Extra template variables (`data.apply_chat_template_kwargs`).
        filter_overlong_prompts: Drop overlong prompts (`data.filter_overlong_prompts`).
        truncation: What to do with an overlong prompt that is not dropped (`data.truncation`).
        return_raw_chat: Also hand the raw messages to the batch (`data.return_raw_chat`).
        files_key: Config key the files came from, named in error messages.
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
        for file in files:
            table = _read_table(file, files_key)
            for row, item in enumerate(_rows(table, file, prompt_key, reward_fn_key)):
                try:
                    ids = encode_prompt(
                        tokenizer, item["raw_prompt"], custom_chat_template, chat_template_kwargs
                    )
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
                item.update(index=len(self._items), file=str(file), row=row)
                self._items.append(item)
        if shortest is None:
            raise UserError(f"{files_key}: the files {list(map(str, files))} hold no rows; add prompts")
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
    def from_config(
        cls,
        cfg: RelmConfig,
        files: list[str],
        tokenizer: PreTrainedTokenizerBase,
        *,
        files_key: str = "data.train_files",
        tools: list[dict[str, Any]] | None = None,
    ) -> PromptDataset:
        """The dataset the run's `data.*` keys and `actor_rollout_ref.model.custom_chat_template` describe,
        so training and validation prompts are rendered and cut the same way. `tools`: the function
        schemas a multi-turn run's chat template lists in every prompt (as verl's agent loop does)."""
        data = cfg.data
        template_kwargs = dict(data.apply_chat_template_kwargs)
        if tools:
            template_kwargs["tools"] = tools
        return cls(
            files,
            tokenizer,
            prompt_key=data.prompt_key,
            reward_fn_key=data.reward_fn_key,
            max_prompt_length=data.max_prompt_length,
            custom_chat_template=cfg.actor_rollout_ref.model.custom_chat_template,
            chat_template_kwargs=template_kwargs,
            filter_overlong_prompts=data.filter_overlong_prompts,
            truncation=data.truncation,
            return_raw_chat=data.return_raw_chat,
            files_key=files_key,
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


def _read_table(file: str | Path, files_key: str) -> pa.Table:
    path = Path(file)
    if not path.is_file():
        raise UserError(f"{files_key}: file '{file}' does not exist; check the path")
    try:
        return pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        reason = " ".join(str(exc).split())
        # pyarrow repeats the path ("Could not open Parquet input source '<path>': ..."); the line
        # names it already.
        reason = reason.split(f"{path}'", 1)[-1].lstrip(": ")[:200]
        raise UserError(
            f"{files_key}: '{file}' is not a readable parquet file ({reason}); write it with "
            "pandas.DataFrame.to_parquet or pyarrow.parquet.write_table"
        ) from exc


def _rows(table: pa.Table, file: str | Path, prompt_key: str, reward_fn_key: str) -> list[dict[str, Any]]:
    """Rows of one file as dicts, each field checked; raises UserError on the first bad one."""
    columns = table.column_names
    if prompt_key not in columns:
        raise UserError(
            f"data.prompt_key: '{file}' has no column '{prompt_key}' (columns: {', '.join(columns)}); "
            "set data.prompt_key to the column holding the chat messages"
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
    reward_models = (
        table.column("reward_model").to_pylist() if "reward_model" in columns else [None] * num_rows
    )
    extra_infos = table.column("extra_info").to_pylist() if "extra_info" in columns else [None] * num_rows

    rows = []
    for row in range(num_rows):
        reward_model = reward_models[row]
        extra_info = extra_infos[row]
        rows.append(
            {
                "raw_prompt": _check_messages(prompts[row], file, row, prompt_key),
                "data_source": str(data_sources[row])
                if data_sources[row] is not None
                else MISSING_DATA_SOURCE,
                "ground_truth": reward_model.get("ground_truth") if isinstance(reward_model, dict) else None,
                "extra_info": dict(extra_info) if isinstance(extra_info, dict) else {},
            }
        )
    return rows


def _check_messages(cell: Any, file: str | Path, row: int, prompt_key: str) -> list[dict[str, str]]:
    where = f"data.prompt_key: '{file}' row {row} column '{prompt_key}'"
    fix = 'it must be a non-empty list of {"role": ..., "content": ...} messages'
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
