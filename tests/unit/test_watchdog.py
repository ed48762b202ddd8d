"""The stall watchdog on real engines: progress keeps it quiet, no progress raises naming the stage and the
engine's state, and a thread stuck inside one C call ends the process with the same message."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import pytest
import torch
from torch import nn

from relm.rollout.base import SamplingParams
from relm.rollout.hf_engine import HFRolloutEngine
from relm.rollout.native.engine import NativeRolloutEngine
from relm.rollout.watchdog import RolloutStalled, WatchedEngine, engine_stage
from tests.tiny_models import tiny_lm

PROMPTS = [[1, 2, 3, 4], [5, 6], [7, 8, 9]]
ENGINES = {"hf": HFRolloutEngine, "native": NativeRolloutEngine}


def slowed(model: nn.Module, seconds: float) -> nn.Module:
    """Every forward of `model` takes `seconds` more, spent in Python (so an interrupt can land)."""

    def wait(module: nn.Module, args: tuple) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(0.005)

    model.register_forward_pre_hook(wait)
    return model


@pytest.fixture
def model() -> Iterator[nn.Module]:
    yield tiny_lm(seed=0)


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_steady_progress_is_not_a_stall(name: str, model: nn.Module) -> None:
    # 12 forwards of 100 ms each: 1.2 s in all, twice the timeout, but never 0.6 s without a token.
    engine = ENGINES[name](slowed(model, 0.1), pad_token_id=0, eos_token_ids=[], device="cpu")
    watched = WatchedEngine(engine, timeout_s=0.6)

    out = watched.generate(PROMPTS, SamplingParams(n=2, max_new_tokens=12, seed=0))

    assert out.response_ids.shape == (6, 12)
    assert watched.watchdog.num_beats == 12  # one beat per decoding step, from the engine's own loop


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_no_progress_raises_naming_the_stage_and_the_call(name: str, model: nn.Module) -> None:
    engine = ENGINES[name](slowed(model, 30.0), pad_token_id=0, eos_token_ids=[], device="cpu")
    watched = WatchedEngine(engine, timeout_s=0.3)

    start = time.monotonic()
    with engine_stage(watched, "validation after step 4"), pytest.raises(RolloutStalled) as stalled:
        watched.generate(PROMPTS, SamplingParams(n=2, max_new_tokens=4, seed=0))

    assert time.monotonic() - start < 5  # the interrupt lands in the forward's Python, long before 30 s
    assert re.fullmatch(
        r"validation after step 4: generation made no progress for 0\.\d s "
        r"\(actor_rollout_ref\.rollout\.timeout_s=0\.3\) after 0 decoding steps; engine state: "
        rf"{type(engine).__name__} generating for 3 prompts x n=2, max_new_tokens=4",
        str(stalled.value),
    )
    assert watched.stage == "generation"  # the label is the block's only


def test_a_thread_stuck_in_c_ends_the_process_with_the_message(tmp_path) -> None:
    # time.sleep(600) is one C call: no bytecode runs, so only ending the process can stop it.
    script = tmp_path / "stuck.py"
    script.write_text(
        textwrap.dedent(
            """
            import time
            from relm.rollout.base import SamplingParams
            from relm.rollout.hf_engine import HFRolloutEngine
            from relm.rollout.watchdog import WatchedEngine
            from tests.tiny_models import tiny_lm

            model = tiny_lm()
            model.register_forward_pre_hook(lambda module, args: time.sleep(600))
            engine = HFRolloutEngine(model, pad_token_id=0, eos_token_ids=[], device="cpu")
            WatchedEngine(engine, timeout_s=0.5, grace_s=0.5).generate([[1, 2]], SamplingParams(max_new_tokens=2))
            print("not reached")
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    start = time.monotonic()
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)

    assert done.returncode == 1 and "not reached" not in done.stdout
    assert time.monotonic() - start < 60
    last_line = done.stderr.strip().splitlines()[-1]
    assert re.match(
        r"error: generation: generation made no progress for 0\.\d s \(.*timeout_s=0\.5\)", last_line
    )
    assert "did not return to Python within 0.5 s, so relm ends the process" in done.stderr


def test_no_timeout_means_no_watchdog(model: nn.Module) -> None:
    engine = HFRolloutEngine(model, pad_token_id=0, eos_token_ids=[], device="cpu")
    watched = WatchedEngine(engine, timeout_s=None)

    assert watched.watchdog is None
    out = watched.generate(PROMPTS, SamplingParams(max_new_tokens=3, seed=0))
    assert torch.equal(
        out.response_ids, engine.generate(PROMPTS, SamplingParams(max_new_tokens=3, seed=0)).response_ids
    )
    with engine_stage(engine, "rollout of step 1"):  # an unwatched engine takes a label and ignores it
        assert not hasattr(engine, "stage")
