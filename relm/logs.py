"""Console logging for the `relm` logger: short lines on stderr, warnings marked."""

from __future__ import annotations

import logging
import os
import warnings


def setup_logging() -> None:
    """One handler on the `relm` logger; `RELM_LOG_LEVEL` (default INFO) sets the level.

    transformers' own advisory warnings are quietened because relm reports what it decided itself.
    """
    log = logging.getLogger("relm")
    # Other code (pytest's capture, an embedding app) may add handlers too: look for relm's own.
    if not any(getattr(h, "_relm_console", False) for h in log.handlers):
        handler = logging.StreamHandler()
        handler._relm_console = True  # type: ignore[attr-defined]
        handler.setFormatter(logging.Formatter("relm %(levelname)s: %(message)s"))
        log.addHandler(handler)
        log.propagate = False
    log.setLevel(os.environ.get("RELM_LOG_LEVEL", "INFO").upper())
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")
    from transformers.utils import logging as hf_logging

    # Per-shard load/save bars are noise beside relm's own step bar.
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
