"""The rollout process of an asynchronous run: generate and score whole steps ahead of the trainer.

Started by the trainer (`relm.trainer.async_rollout.AsyncRollout`) with `multiprocessing`'s spawn. It builds
its own tokenizer, prompt loader, reward and engine (`build_rollout_side`), then for each step: waits until
it holds weights no more than `max_versions_behind` versions older than the ones that step will be trained
on, draws the step's prompts, generates and scores them exactly as a synchronous step does
(`collect_experience`: same seeds, same code), and puts the finished batch, stamped with the weight version
that produced it, into the bounded buffer (a `multiprocessing` queue of `max_versions_behind + 1` batches).

Weights arrive on a thread that receives every message the trainer sends (`relm.distributed.weight_channel`)
and keeps only the newest, so the trainer's sends complete while this process generates; a generation
always starts from the newest weights that have arrived. With `async_training.partial_rollout` the engine
generates in segments (`relm.rollout.partial.SegmentedEngine`) and loads newer weights between them, each
token stamped with the version that sampled it. A thread watches the parent (the trainer): when
it is gone, this process ends, so a killed trainer leaves no rollout process behind.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch

from relm.config.specs import RunSpec
from relm.distributed.weight_channel import (
    ROLLOUT_RANK,
    PointToPoint,
    WeightLayout,
    connect_store,
    join_group,
    receive,
)
from relm.errors import UserError
from relm.learner.batch import Scored
from relm.logs import setup_logging
from relm.rollout.base import RolloutEngine
from relm.rollout.partial import SegmentedEngine, segment_tokens, span_metrics, version_span
from relm.trainer.collect import collect_experience
from relm.trainer.components import build_rollout_side, pick_device

logger = logging.getLogger("relm")

POLL_S = 1.0
"""How often a blocked wait looks whether the other process is still there."""


@dataclass(frozen=True)
class RolloutProcessArgs:
    """What the trainer tells the rollout process at spawn."""

    spec: RunSpec
    model_dir: str
    store_host: str
    store_port: int
    layout: WeightLayout
    first_step: int
    """The first step to generate (the trainer's resumed step + 1)."""
    last_step: int
    loader_state: dict[str, Any]
    """The trainer's prompt loader position before `first_step` (a resumed run's, from its checkpoint)."""
    num_threads: int
    """torch's intra-op threads, as the trainer's: the float sums, and so the samples, depend on it."""


@dataclass(frozen=True)
class FinishedBatch:
    """One step's scored responses, as the buffer carries them to the trainer."""

    step: int
    scored: Scored
    versions: torch.Tensor
    """[N] int64: the weight version that generated each response; in a partial rollout its oldest token's
    (the version it started under), which is what its staleness counts."""
    metrics: dict[str, float]
    """The rollout phase's metrics (`collect_experience`'s, `timing_s/gen`, the rollout side's wait)."""
    loader_state: dict[str, Any]
    """The prompt loader's position after this step's prompts, for the trainer's checkpoints."""


@dataclass(frozen=True)
class RolloutFailure:
    """The rollout process stopped: its message, and whether it is the user's mistake (exit code 2)."""

    message: str
    user_error: bool


class LatestWeights:
    """The newest weights received, filled by a thread that receives every message until `last_version`."""

    def __init__(self, group: PointToPoint, layout: WeightLayout, last_version: int) -> None:
        self._cond = threading.Condition()
        self._latest: tuple[int, torch.Tensor] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._receive_all, args=(group, layout, last_version), name="weights", daemon=True
        )
        self._thread.start()

    def _receive_all(self, group: PointToPoint, layout: WeightLayout, last_version: int) -> None:
        try:
            version = -1
            while version < last_version:
                version, flat = receive(group, layout)
                with self._cond:
                    self._latest = (version, flat)
                    self._cond.notify_all()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting loop, which raises it
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    def newest_from(self, version: int) -> tuple[int, torch.Tensor]:
        """The newest weights received, waiting until they are at least `version`."""
        with self._cond:
            while self._latest is None or self._latest[0] < version:
                if self._error is not None:
                    raise RuntimeError(f"receiving weights failed: {self._error}") from self._error
                self._cond.wait(POLL_S)
            return self._latest

    def join(self) -> None:
        """Until every message the trainer will send has arrived (its last sends complete)."""
        self._thread.join()


def rollout_process_main(args: RolloutProcessArgs, buffer: Any, taken: Any) -> None:
    """The spawned process's body: report any failure into `buffer`, so the trainer ends with its message.

    `taken` is an event the trainer sets once it has taken the last batch: a batch's tensors are handed over
    through file descriptors this process serves, so it must outlive the trainer's reading of them."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the trainer decides
    setup_logging()
    torch.set_num_threads(args.num_threads)
    parent = os.getppid()
    threading.Thread(target=_exit_when_orphaned, args=(parent,), name="parent-watch", daemon=True).start()
    try:
        _generate_steps(args, buffer)
        taken.wait()
    except UserError as exc:
        buffer.put(RolloutFailure(str(exc), user_error=True))
    except Exception as exc:  # noqa: BLE001 - any failure ends the run through the trainer, with its message
        logger.exception("the rollout process failed")
        buffer.put(
            RolloutFailure(f"the rollout process failed: {type(exc).__name__}: {exc}", user_error=False)
        )


class EngineWeights:
    """The version of the weights the engine holds, and the loading of newer ones that have arrived."""

    def __init__(self, engine: RolloutEngine, weights: LatestWeights, layout: WeightLayout) -> None:
        self.engine = engine
        self.weights = weights
        self.layout = layout
        self.version = -1

    def load_newest(self, at_least: int) -> int:
        """Load the newest weights received (waiting until they are version `at_least` or newer) unless the
        engine holds them already; the version the engine then holds."""
        newest, flat = self.weights.newest_from(at_least)
        if newest != self.version:
            self.engine.sync_weights(self.layout.unflatten(flat))
            self.version = newest
        return self.version

    def refresh(self) -> int:
        """Between a partial rollout's segments: whatever newer weights have arrived, without waiting."""
        return self.load_newest(self.version)


def _generate_steps(args: RolloutProcessArgs, buffer: Any) -> None:
    spec = args.spec
    max_behind = spec.asynchronous.max_versions_behind
    sources = build_rollout_side(spec, args.model_dir, pick_device(spec.loop.device))
    sources.loader.load_state_dict(args.loader_state)
    group = join_group(connect_store(args.store_host, args.store_port), ROLLOUT_RANK)
    # The trainer sends its starting weights as version first_step - 1, then one version after each step
    # but the last: the last step's weights generate no batch.
    weights = LatestWeights(group, args.layout, last_version=args.last_step - 1)
    held = EngineWeights(sources.engine, weights, args.layout)
    if spec.asynchronous.partial_rollout:
        segmented = SegmentedEngine(
            sources.engine,
            pad_token_id=sources.tokenizer.pad_token_id,
            segment_tokens=segment_tokens(spec.data.max_response_length),
            refresh=held.refresh,
        )
        sources = dataclasses.replace(sources, engine=segmented)
    waited = 0.0
    for step in range(args.first_step, args.last_step + 1):
        start = time.perf_counter()
        held.load_newest(step - 1 - max_behind)
        waited += time.perf_counter() - start
        prompts = sources.loader.next_batch()
        metrics: dict[str, float] = {}
        start = time.perf_counter()
        scored = collect_experience(sources, prompts, step, metrics)
        if spec.engine.free_cache_engine:
            sources.engine.release_memory()
        metrics["timing_s/gen"] = time.perf_counter() - start
        metrics["fully_async/rollouter_wait_s"] = waited
        token_versions = scored.rollout.token_versions
        if token_versions is None:
            versions = torch.full((len(scored.rollout),), held.version, dtype=torch.int64)
        else:
            versions, newest = version_span(token_versions)
            metrics.update(span_metrics(versions, newest))
        batch = FinishedBatch(
            step=step,
            scored=scored,
            versions=versions,
            metrics=metrics,
            loader_state=sources.loader.state_dict(),
        )
        start = time.perf_counter()
        buffer.put(batch)
        waited = time.perf_counter() - start  # a full buffer: counted in the next batch's wait
    weights.join()
    sources.reward.close()


def _exit_when_orphaned(parent: int) -> None:
    """A thread's loop: when the trainer is gone (killed), nothing will read the buffer or send weights, and
    this process may be blocked anywhere (joining the group, receiving, putting), so it ends itself."""
    while os.getppid() == parent:
        time.sleep(POLL_S)
    os._exit(1)
