"""Suite-wide fixtures: keep every test's writes out of the user's home folder; one CPU thread for the learning
tests."""

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


@pytest.fixture
def one_cpu_thread() -> Iterator[None]:
    """Run on one intra-op thread, then restore the count.

    Why: the float summation order of CPU kernels depends on the thread count, and sampling turns the
    smallest difference into another trajectory (2 threads part from 1 within ~13 steps), so only the
    thread count the seeds were measured with reproduces the measured margins. It is also faster for a
    model this small: 30 grpo steps took 8.5-8.9 s on one thread, and 12 s to over 90 s on two on the
    same 2-core machine, depending on how busy other processes kept the cores (threads wait on each
    other).
    """
    import torch  # here, not at the top: collecting the suite's torch-free tests should not import it

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)
