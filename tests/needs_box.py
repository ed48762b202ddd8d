"""Modules whose tool is built at import need the python tool's box (bubblewrap) to be collected at all.

Without bwrap on PATH, building a `PythonTool` stops with the one-line UserError a user gets, which at
import turns into a collection error that interrupts the whole session (seen on the GPU machine, whose
image has no bubblewrap, under `pytest -m gpu`). Such modules skip there instead; `make test` installs
bubblewrap first and sets RELM_REQUIRE_BOX=1, so in CI a missing box still fails loudly rather than skip.
"""

from __future__ import annotations

import os
import shutil

import pytest


def skip_module_without_box() -> None:
    if shutil.which("bwrap") is None and not os.environ.get("RELM_REQUIRE_BOX"):
        pytest.skip(
            "the python tool's box needs bubblewrap (`make setup-box` installs it)", allow_module_level=True
        )
