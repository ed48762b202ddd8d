"""Read checkpoint files without running code that a file might carry.

A `.pt` file is a pickle, and a pickle can name any function to call while it is read: a crafted
`trainer_state.pt` handed to `torch.load(..., weights_only=False)` runs whatever it names. relm saves
only tensors, dicts, lists, numbers and strings in its `.pt` files, so it reads them with
`weights_only=True` (torch's allowlisting unpickler) and refuses, with one line naming the file,
anything that asks for more.

A sharded (DCP) save's own pickles are read by `relm.distributed.safe_dcp`.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

import torch

from relm.errors import UserError


def refused(path: Path, why: str) -> UserError:
    """The one line for a checkpoint file relm will not read because reading it could run code."""
    return UserError(
        f"`{path}`: refused to load: it asks to run code when read ({why}); relm's own checkpoints never do, "
        "so this file was not written by relm or was altered: resume from a checkpoint relm wrote"
    )


def load_pt(path: Path) -> Any:
    """`torch.load` of a relm `.pt` file (tensors, dicts, lists, numbers, strings) that runs no code.

    Raises:
        UserError: the file names anything else (refused) or cannot be read at all.
    """
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise refused(path, first_line(exc)) from exc
    except Exception as exc:  # noqa: BLE001 - a damaged file is the user's checkpoint problem
        raise UserError(f"`{path}` cannot be read ({type(exc).__name__}); resume from another step") from exc


def first_line(exc: BaseException) -> str:
    """The part of an unpickling error that names what the file asked for (torch's message is a page)."""
    text = str(exc)
    found = re.search(r"GLOBAL (\S+)", text) or re.search(r"^`([^`]+)`$", text)
    if found:
        return f"it names {found.group(1)}"
    lines = text.strip().splitlines()
    return " ".join(lines[0].split())[:160] if lines else type(exc).__name__
