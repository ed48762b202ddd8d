"""Suite-wide fixtures: keep every test's writes out of the user's home folder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def relm_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Point `RELM_CACHE` (zoo models, demo parquet) at one folder per test session.

    One folder for the whole session, not per test, because materializing a zoo model costs about a
    second and every integration test needs one; subprocesses inherit the variable.
    """
    cache = tmp_path_factory.mktemp("relm-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RELM_CACHE", str(cache))
        yield cache
