"""Everything around the training loop (`relm.trainer.ppo.train`), so that the loop itself reads as one.

`Run` resumes from a checkpoint, opens the loggers and the validation set, runs validation-only evaluations,
watches signals and host memory while the loop runs, logs, validates, guards and saves after each step,
and draws the curves when the run ends, however it ends.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

from relm.errors import UserError
from relm.memory.choices import host_budget_bytes
from relm.memory.host import HostWatchdog, watching
from relm.rollout.watchdog import engine_stage
from relm.trainer.checkpoint import (
    find_resume_checkpoint,
    load_checkpoint,
    prune_checkpoints,
    remove_stale_staging,
    save_checkpoint,
)
from relm.trainer.components import RunComponents
from relm.trainer.cpu_threads import CpuThreads
from relm.trainer.guards import DegenerateBatchReporter, SkipGuard
from relm.trainer.loggers import MetricsLogger, make_loggers
from relm.trainer.metrics import memory_report, rollout_gap_report
from relm.trainer.old_logprobs import ON_POLICY_MESSAGE, old_logprob_source
from relm.trainer.plot import CURVES_FILE, plot_curves
from relm.trainer.samples import ValidationSamples
from relm.trainer.signals import StopRequest, stop_on_signals
from relm.trainer.validation import build_val_params, is_validation_step, make_val_dataset, run_validation

logger = logging.getLogger("relm")


class Run:
    """One `relm train`'s life around its steps; made by `Run.open`.

    Data-parallel, every rank holds one: only rank 0 writes logs and plots, and a stop signal seen by any
    rank stops all after the same step.
    """

    def __init__(self, c: RunComponents, start: int, guard: SkipGuard, resumed: bool) -> None:
        trainer = c.spec.loop
        self.c = c
        self.start = start
        """The last step done before this process started (0 for a new run)."""
        self.total = c.sizes.total_training_steps
        self.last_step = self.last_saved = start
        self.guard = guard
        self.val_dataset = make_val_dataset(
            c.spec, c.tokenizer, c.multi_turn.schemas if c.multi_turn else None
        )
        if trainer.val_only and self.val_dataset is None:
            raise UserError("`trainer.val_only=true` has nothing to validate: set `data.val_files`")
        self.loggers: list[MetricsLogger] = make_loggers(
            list(trainer.loggers), c.run_dir, self.total, resume_step=start if resumed else None,
            project=trainer.project_name, experiment=trainer.experiment_name, config=dict(c.tracked_config),
        ) if c.dist.is_main else []  # fmt: skip
        self.val_params = build_val_params(
            c.spec.engine.val_sampling, c.spec.data.max_response_length, seed=c.spec.loop.seed
        )
        self.val_samples = ValidationSamples(c.spec.loop, c.run_dir)
        self.degenerate = DegenerateBatchReporter()
        self.num_responses = c.spec.data.prompts_per_step * c.spec.engine.sampling.n
        self.cpu_threads = CpuThreads(c.device)  # fewer torch threads while other processes hold cores
        self.step = start
        """The step in progress, for the host watchdog's message."""
        self.stop = StopRequest()

    @staticmethod
    def open(c: RunComponents) -> Run | None:
        """Clear a crashed save's staging folders, resume from the checkpoint `trainer.resume_mode` names
        and open the loggers; None when the resumed run is already finished (and not `trainer.val_only`)."""
        trainer = c.spec.loop
        if c.dist.is_main:
            remove_stale_staging(c.run_dir)
        c.dist.barrier()
        start, guard = 0, SkipGuard(trainer.max_skipped_steps)
        total = c.sizes.total_training_steps
        checkpoint = find_resume_checkpoint(c.run_dir, trainer.resume_mode, trainer.resume_from_path)
        if checkpoint is not None:
            logger.info("loading checkpoint %s", checkpoint)
            restored = load_checkpoint(c, checkpoint)
            for trainee in c.trainees:
                if trainee.optimizer_offload is not None:
                    trainee.optimizer_offload.to_host()  # loading put the moments on the GPU
            start = restored.step
            guard.load_state_dict(restored.loop_state.get("skip_guard", {}))
            if start >= total and not trainer.val_only:  # evaluating a finished run is fine
                logger.info(
                    "the run in %s is finished (step %d of %d): nothing to train; raise "
                    "trainer.total_training_steps to go on, or use a new trainer.default_local_dir",
                    c.run_dir, start, total,
                )  # fmt: skip
                return None
            logger.info("resumed from %s: continuing at step %d of %d", checkpoint, start + 1, total)
        return Run(c, start, guard, resumed=checkpoint is not None)

    def validate(self, step: int) -> dict[str, float]:
        """Validation metrics after `step`, on every rank (generation is shared out over the ranks)."""
        c = self.c
        assert self.val_dataset is not None, "called only with a validation set"
        with c.residency.phase("generate"), engine_stage(c.engine, f"validation after step {step}"):
            result = run_validation(
                c.engine, c.reward, self.val_dataset, params=self.val_params, batch_size=c.spec.data.val_batch_size,
                keep_samples=self.val_samples.wanted, multi_turn=c.multi_turn,
            )  # fmt: skip
        if c.dist.is_main:
            self.val_samples.write(step, result.samples)
        return result.metrics

    def validate_only(self) -> None:
        """`trainer.val_only`: an evaluation of the model or of the resumed checkpoint's weights."""
        try:
            self.log(self.start, self.validate(self.start))
        finally:
            self.close()
        logger.info("validation only (trainer.val_only): metrics in %s", self.c.run_dir / "metrics.jsonl")

    @contextlib.contextmanager
    def running(self) -> Iterator[StopRequest]:
        """The loop's surroundings: stop signals (yielded), the host watchdog, validation before training,
        the loggers closed and the curves drawn however the loop ends."""
        c = self.c
        if old_logprob_source(c.spec) == "update":
            logger.info(ON_POLICY_MESSAGE)
        watchdog = HostWatchdog(
            lambda: f"{c.residency.current} of step {self.step}",
            budget_bytes=host_budget_bytes(c.spec.memory),
        )
        try:
            with stop_on_signals() as stop, watching(watchdog):
                self.stop = stop
                if self.val_dataset is not None and c.spec.loop.val_before_train and self.start == 0:
                    self.log(0, self.validate(0))
                yield stop
                if c.dist.any_true(stop.requested) and self.last_step > self.last_saved:
                    self.save(
                        self.last_step
                    )  # whatever save_freq says: the steps since the last save must stay
        except Exception:  # not KeyboardInterrupt: a second signal leaves at once, without the plot
            if c.dist.is_main:
                _write_curves(
                    c.run_dir
                )  # the curves up to a divergence or a failure are what the user looks at next
            raise
        finally:
            self.close()
        if c.dist.is_main:
            _write_curves(c.run_dir)

    def begin_step(self, step: int) -> None:
        self.cpu_threads.adjust()
        self.step = step

    def end_step(self, step: int, metrics: dict[str, float]) -> None:
        """After `step`: first-step reports, the skip guard, validation, logging, the save every `save_freq`.

        Raises:
            TrainingDiverged: more than `trainer.max_skipped_steps` steps in a row skipped updates.
        """
        c, trainer = self.c, self.c.spec.loop
        if step == self.start + 1 and c.dist.is_main:
            for report in (
                memory_report(metrics),
                rollout_gap_report(metrics, c.spec.engine.quantization),
            ):
                if report:
                    logger.info("%s", report)
        metrics["training/epoch"] = float(c.loader.epoch)
        diverged = self.guard.update(step, metrics)
        if self.val_dataset is not None and is_validation_step(step, self.total, trainer.test_freq):
            metrics.update(self.validate(step))
        if c.dist.is_main:
            self.degenerate.check(step, metrics, self.num_responses)
        self.log(step, metrics)
        if diverged is not None:
            raise diverged
        self.last_step = step
        if trainer.save_freq > 0 and (step % trainer.save_freq == 0 or step == self.total):
            self.save(step)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for sink in self.loggers:
            sink.log(step, metrics)

    def save(self, step: int) -> None:
        """A checkpoint of `step`, then the oldest ones beyond `trainer.max_*_ckpt_to_keep` removed."""
        c, trainer = self.c, self.c.spec.loop
        c.residency.current = "checkpoint save"
        save_checkpoint(c, step, loop_state={"skip_guard": self.guard.state_dict()})
        if c.dist.is_main:
            prune_checkpoints(
                c.run_dir, step,
                max_actor=trainer.max_actor_ckpt_to_keep, max_critic=trainer.max_critic_ckpt_to_keep,
            )  # fmt: skip
        self.last_saved = step

    def close(self) -> None:
        for sink in self.loggers:
            sink.close()
        self.val_samples.close()

    def report_end(self) -> None:
        """The last line: finished, or stopped by a signal and how to resume."""
        run_dir = self.c.run_dir
        if self.last_step < self.total:
            saved = (
                f"checkpoint in {run_dir / f'global_step_{self.last_step}'}"
                if self.last_step
                else "no step to save"
            )
            logger.info(
                "stopped by %s after step %d of %d (%s); run the same command again to resume",
                self.stop.signal_name or "a signal to another rank", self.last_step, self.total, saved,
            )  # fmt: skip
            return
        logger.info("training finished after %d steps; metrics in %s", self.total, run_dir / "metrics.jsonl")


def _write_curves(run_dir: Path) -> None:
    """curves.png in the run folder; a failure here must not turn a finished run into a failed one."""
    try:
        logger.info("curves in %s", plot_curves(run_dir))
    except UserError:
        pass  # no step logged yet: nothing to draw
    except Exception as exc:  # noqa: BLE001 - the plot is a convenience beside metrics.jsonl
        logger.warning("could not draw %s: %s: %s", run_dir / CURVES_FILE, type(exc).__name__, exc)
