"""Console logging for the `relm` logger: short lines on stderr, warnings marked."""

from __future__ import annotations

import logging
import os
import warnings


def setup_logging() -> None:
    """One handler on the `relm` logger; `RELM_LOG_LEVEL` (default INFO) sets the level.

    In a run of several processes (torchrun's `WORLD_SIZE` > 1) lines name their rank, and ranks other
    than 0, which would repeat rank 0's lines, log at `RELM_RANK_LOG_LEVEL` (default ERROR) instead.
    transformers' own advisory warnings are quietened because relm reports what it decided itself.
    """
    log = logging.getLogger("relm")
    rank = int(os.environ.get("RANK", "0")) if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None
    # Other code (pytest's capture, an embedding app) may add handlers too: look for relm's own.
    if not any(getattr(h, "_relm_console", False) for h in log.handlers):
        handler = logging.StreamHandler()
        handler._relm_console = True  # type: ignore[attr-defined]
        prefix = "relm" if rank is None else f"relm[rank {rank}]"
        handler.setFormatter(logging.Formatter(prefix + " %(levelname)s: %(message)s"))
        log.addHandler(handler)
        log.propagate = False
    if rank:
        log.setLevel(os.environ.get("RELM_RANK_LOG_LEVEL", "ERROR").upper())
    else:
        log.setLevel(os.environ.get("RELM_LOG_LEVEL", "INFO").upper())
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")
    from transformers.utils import logging as hf_logging

    # Per-shard load/save bars are noise beside relm's own step bar.
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
