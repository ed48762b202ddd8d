"""A user's verl dataset class (`data.custom_cls.path` + `.name`) as the source of prompt rows.

verl builds its dataset as `cls(data_files=..., tokenizer=..., processor=..., config=<data section>,
max_samples=...)` (verl 0.9.1's `create_rl_dataset`) and requires a `torch.utils.data.Dataset`
subclass; each item is a dict as its `RLHFDataset` returns: the chat messages in `raw_prompt` (or the
`data.prompt_key` column), `data_source`, `reward_model.ground_truth`, `extra_info`. relm makes the
same call and reads those fields into its own rows, which `PromptDataset` then renders, tokenizes and
filters as it does a file's. A path, class or signature that does not fit is one line naming it.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from torch.utils.data import Dataset
from transformers import PreTrainedTokenizerBase

from relm.errors import UserError

VERL_ARGUMENTS = ("data_files", "tokenizer", "config", "processor")
"""What verl passes every dataset class (and `max_samples` where its `__init__` takes it)."""


def load_dataset_class(path: str, name: str) -> type:
    """The class `name` of the Python file `path`, checked to be a Dataset that takes verl's arguments."""
    shown = f"`data.custom_cls.path={path}`"
    file = Path(path).expanduser()
    if not file.is_file():
        raise UserError(f"{shown}: no such file; give the Python file that defines the dataset class")
    module_name = f"relm_custom_dataset_{abs(hash(str(file.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise UserError(f"{shown}: not a Python file; give a `.py` file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look classes up by module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - the user's file: any error it raises is theirs to fix
        raise UserError(f"{shown}: importing it failed ({type(exc).__name__}: {exc})") from exc
    cls = getattr(module, name, None)
    if not isinstance(cls, type):
        raise UserError(f"`data.custom_cls.name={name}`: {path} defines no class of that name")
    if not issubclass(cls, Dataset):
        raise UserError(
            f"`data.custom_cls.name={name}`: must subclass torch.utils.data.Dataset, as verl requires"
        )
    try:
        inspect.signature(cls).bind(**{arg: None for arg in VERL_ARGUMENTS})
    except TypeError as exc:
        raise UserError(
            f"`data.custom_cls.name={name}`: its __init__ must take verl's ({', '.join(VERL_ARGUMENTS)}); {exc}"
        ) from exc
    return cls


def takes_max_samples(cls: type) -> bool:
    """Whether the class draws `max_samples` itself (verl 0.9's `RLHFDataset` does); else relm draws them."""
    return "max_samples" in inspect.signature(cls).parameters


def custom_rows(
    cls: type,
    files: list[str],
    tokenizer: PreTrainedTokenizerBase,
    config: dict[str, Any],
    *,
    max_samples: int,
    prompt_key: str,
    reward_fn_key: str,
) -> list[dict[str, Any]]:
    """Rows (`raw_prompt`, `data_source`, `ground_truth`, `extra_info`) of the class's items, in order."""
    kwargs: dict[str, Any] = {
        "data_files": list(files),
        "tokenizer": tokenizer,
        "config": OmegaConf.create(config),
        "processor": None,
    }
    if takes_max_samples(cls):
        kwargs["max_samples"] = max_samples
    name = cls.__name__
    try:
        dataset = cls(**kwargs)
        items = [dataset[index] for index in range(len(dataset))]
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's class: any error it raises is theirs to fix
        raise UserError(
            f"`data.custom_cls.name={name}`: reading {files} failed ({type(exc).__name__}: {exc})"
        ) from exc
    return [_row(item, index, name, prompt_key, reward_fn_key) for index, item in enumerate(items)]


def _row(item: Any, index: int, name: str, prompt_key: str, reward_fn_key: str) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise UserError(f"`data.custom_cls.name={name}`: item {index} is {type(item).__name__}, not a dict")
    prompt = item.get("raw_prompt", item.get(prompt_key))
    if prompt is None:
        raise UserError(
            f"`data.custom_cls.name={name}`: item {index} has neither `raw_prompt` nor `{prompt_key}`; return "
            "the chat messages as verl's RLHFDataset does"
        )
    reward_model = item.get("reward_model")
    ground_truth = reward_model.get("ground_truth") if isinstance(reward_model, dict) else None
    extra_info = item.get("extra_info")
    source = item.get(reward_fn_key)
    return {
        "raw_prompt": prompt,
        "data_source": str(source) if source is not None else "unknown",
        "ground_truth": ground_truth,
        "extra_info": dict(extra_info) if isinstance(extra_info, dict) else {},
    }
