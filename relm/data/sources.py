"""Open one source of prompts as an Arrow table, through the `datasets` library.

A source is what a user puts in `data.train_files` / `data.val_files`: a parquet, jsonl/json or csv file
(read by `datasets.load_dataset` with the builder its extension names, as verl's `RLHFDataset` and TRL's
scripts do), a folder written by `Dataset.save_to_disk` / `DatasetDict.save_to_disk`, or a Hub dataset
id (`org/name`, or `org/name:split`), downloaded by `datasets` (which honours `HF_ENDPOINT`, `HF_HOME`,
`HF_TOKEN` and `HF_HUB_OFFLINE`). Anything that cannot be opened becomes one `UserError` line naming
the source and the fix; a name that looks like a local path and does not exist is reported as a
missing path, never as a failed Hub download.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from relm.config.paths import looks_like_local_path
from relm.errors import UserError

FILE_BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv"}
"""File extension -> the `datasets` builder that reads it."""

_SAVED_MARKERS = ("state.json", "dataset_dict.json")
"""Files `save_to_disk` writes at the top of a `Dataset` / `DatasetDict` folder."""


def load_table(source: str, files_key: str, split: str) -> pa.Table:
    """The rows of `source` as one Arrow table.

    Args:
        source: A file, a `save_to_disk` folder or a Hub dataset id (`org/name[:split]`).
        files_key: Config key the source came from, named in error messages.
        split: Split taken from a Hub dataset or a saved `DatasetDict` when the source names none
            (TRL's defaults: `train` for training, `test` for validation).

    Raises:
        UserError: missing path, unknown extension, unreadable file, or a Hub id that cannot be loaded.
    """
    try:
        import datasets  # noqa: F401 - a dependency of relm's, absent only from a hand-made environment
    except ImportError as exc:
        raise UserError(
            f"{files_key}: relm reads prompts through the `datasets` package, which is not installed here; "
            "`pip install datasets` (bench/lib.sh installs carried wheels on a machine without network)"
        ) from exc
    path = Path(source).expanduser()
    if not path.exists() and (looks_like_local_path(source) or path.suffix.lower() in FILE_BUILDERS):
        raise UserError(f"{files_key}: file '{source}' does not exist; check the path")
    with _quiet():
        if path.is_dir():
            dataset = _load_saved(path, source, files_key, split)
        elif path.is_file():
            if _is_empty_parquet(path):
                return pq.read_schema(path).empty_table()  # datasets' reader fails on zero rows
            dataset = _load_file(path, source, files_key)
        else:
            dataset = _load_hub(source, files_key, split)
    table = dataset.with_format("arrow")[0 : len(dataset)]
    assert isinstance(table, pa.Table), "the arrow format slices to a table"
    return table


def _is_empty_parquet(path: Path) -> bool:
    if path.suffix.lower() != ".parquet":
        return False
    try:
        return bool(pq.read_metadata(path).num_rows == 0)
    except (pa.ArrowException, OSError):
        return False  # unreadable: datasets' reader reports it


def _load_file(path: Path, source: str, files_key: str) -> Any:
    import datasets

    builder = FILE_BUILDERS.get(path.suffix.lower())
    if builder is None:
        raise UserError(
            f"{files_key}: '{source}' has extension '{path.suffix}', which relm does not read; give a "
            f"{', '.join(FILE_BUILDERS)} file, a `save_to_disk` folder or a Hub dataset id"
        )
    try:
        return datasets.load_dataset(builder, data_files=str(path), split="train")
    except (datasets.exceptions.DatasetsError, pa.ArrowException, OSError, ValueError) as exc:
        # DatasetGenerationError says only "An error occurred"; the reader's error is its cause.
        cause = exc.__cause__ if isinstance(exc, datasets.exceptions.DatasetsError) and exc.__cause__ else exc
        reason = " ".join(str(cause).split())
        # pyarrow repeats the path ("Could not open Parquet input source '<path>': ..."); the line names it.
        reason = reason.split(f"{path}'", 1)[-1].lstrip(": ")[:200]
        kind = "json lines" if builder == "json" else builder
        raise UserError(
            f"{files_key}: '{source}' is not a readable {kind} file ({reason}); fix the file, or write it "
            "with pandas (DataFrame.to_parquet / to_json(lines=True) / to_csv) or datasets"
        ) from exc


def _load_saved(path: Path, source: str, files_key: str, split: str) -> Any:
    import datasets

    if not any((path / marker).is_file() for marker in _SAVED_MARKERS):
        raise UserError(
            f"{files_key}: '{source}' is a folder but not one `datasets`' save_to_disk wrote (no state.json "
            "or dataset_dict.json); name the data files in it, or save the dataset with save_to_disk"
        )
    try:
        loaded = datasets.load_from_disk(str(path))
    except (datasets.exceptions.DatasetsError, pa.ArrowException, OSError, ValueError) as exc:
        raise UserError(
            f"{files_key}: '{source}' cannot be read by datasets.load_from_disk "
            f"({' '.join(str(exc).split())[:200]}); save it again with save_to_disk"
        ) from exc
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise UserError(
                f"{files_key}: '{source}' has no split '{split}' (splits: {', '.join(loaded)}); name one's "
                f"folder, `{source}/<split>`"
            )
        return loaded[split]
    return loaded


def _load_hub(source: str, files_key: str, split: str) -> Any:
    import datasets
    from huggingface_hub import constants

    name, _, named_split = source.partition(":")
    split = named_split or split
    try:
        return datasets.load_dataset(name, split=split)
    except datasets.exceptions.DatasetNotFoundError as exc:
        raise UserError(
            f"{files_key}: '{source}' is neither a local file nor a dataset on {constants.ENDPOINT} (or it is "
            "private: log in with `hf auth login` or HF_TOKEN); check the path or the dataset id"
        ) from exc
    except ValueError as exc:
        if "split" not in str(exc).lower():
            raise _download_error(files_key, name, exc) from exc
        raise UserError(
            f"{files_key}: dataset '{name}' has no split '{split}' ({' '.join(str(exc).split())[:160]}); "
            f"name one as `{name}:<split>`"
        ) from exc
    except (datasets.exceptions.DatasetsError, pa.ArrowException, OSError) as exc:
        raise _download_error(files_key, name, exc) from exc


def _download_error(files_key: str, name: str, exc: Exception) -> UserError:
    from huggingface_hub import constants

    cause = exc.__cause__ or exc  # no network: huggingface_hub wraps the connection error
    reason = f"{type(cause).__name__}: {' '.join(str(cause).split())[:200]}"
    return UserError(
        f"{files_key}: cannot load dataset '{name}' from {constants.ENDPOINT} ({reason}); check the network "
        "or HF_ENDPOINT, or pass a local file (HF_HUB_OFFLINE=1: cache only)"
    )


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """No progress bars and no error logs from `datasets` while it reads: relm reports failures itself."""
    import datasets

    bars_were_on = datasets.is_progress_bar_enabled()
    verbosity = datasets.utils.logging.get_verbosity()
    datasets.disable_progress_bars()
    datasets.utils.logging.set_verbosity(logging.CRITICAL)
    try:
        yield
    finally:
        datasets.utils.logging.set_verbosity(verbosity)
        if bars_were_on:
            datasets.enable_progress_bars()
