"""The frozen teachers of on-policy distillation (`distillation.teacher_models`) and their scoring.

A teacher is one more frozen model beside the reference policy: loaded once from its own folder in the
compute dtype, never trained, parked with the other frozen models when the memory plan says so
(`Residency` phase `teacher`). It reads the student's prompt and response token ids as they are (verl feeds
the teacher the student's ids too), so it must share the student's vocabulary, and it scores every
response token at temperature 1 (verl asks its teacher servers for prompt log-probabilities, which no
sampling temperature touches). With several teachers each response goes to the one whose key is its row's
`data_source` (verl's `teacher_key`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from relm.config.specs import DistillationSpec, RunSpec
from relm.errors import UserError
from relm.learner.batch import Rollout
from relm.models.loading import load_causal_lm, resolve_model_dir

logger = logging.getLogger("relm")


@dataclass
class Teachers:
    """The run's teachers by the routing key of the rows each scores (`default` for a lone teacher)."""

    by_key: dict[str, nn.Module]
    group: nn.ModuleList
    """All of them as one module, which the memory plan parks and brings back together."""

    def rows_of(self, rollout: Rollout) -> dict[str, list[int]]:
        """The rows each teacher scores.

        Raises:
            UserError: with several teachers, a row whose data_source no teacher's key names.
        """
        if len(self.by_key) == 1:
            return {next(iter(self.by_key)): list(range(len(rollout)))}
        routed: dict[str, list[int]] = {key: [] for key in self.by_key}
        for row, source in enumerate(rollout.data_sources):
            if source not in routed:
                raise UserError(
                    f"a row's data_source `{source}` has no teacher: `distillation.teacher_models.*.key` names "
                    f"{', '.join(sorted(routed))}; add a teacher with that key"
                )
            routed[source].append(row)
        return routed


def load_teachers(
    spec: DistillationSpec, run: RunSpec, device: torch.device, dtype: torch.dtype, vocab_size: int
) -> Teachers:
    """Each teacher from its folder, frozen, in `dtype` on `device`.

    Raises:
        UserError: a teacher whose folder does not load (see `load_causal_lm`), or whose vocabulary is
            smaller than the student tokenizer's `vocab_size` (it could not score the student's ids); a
            `topk` larger than that vocabulary.
    """
    source = run.actor.source
    if spec.topk is not None and spec.topk > vocab_size:
        raise UserError(
            f"`distillation.distillation_loss.topk={spec.topk}` is more than the {vocab_size} ids of the student's "
            "tokenizer; set a smaller topk"
        )
    by_key: dict[str, nn.Module] = {}
    for teacher in spec.teachers:
        logger.info("loading the teacher %s from %s (%s on %s)", teacher.name, teacher.path, dtype, device)
        module = load_causal_lm(
            resolve_model_dir(teacher.path),
            dtype=dtype,
            device=device,
            trust_remote_code=source.trust_remote_code,
            trust_key=source.trust_key,
            seed=source.init_seed,
        )
        rows = module.config.get_text_config().vocab_size
        if rows < vocab_size:
            raise UserError(
                f"`distillation.teacher_models.{teacher.name}.model_path={teacher.path}`: its vocabulary has {rows} "
                f"entries, fewer than the student tokenizer's {vocab_size}; the teacher scores the student's "
                "token ids and needs the same vocabulary"
            )
        module.requires_grad_(False)
        by_key[teacher.key] = module.eval()
    return Teachers(by_key=by_key, group=nn.ModuleList(list(by_key.values())))


def teacher_scores(
    teachers: Teachers, batch: Rollout, score: Callable[[nn.Module, Rollout], torch.Tensor]
) -> torch.Tensor:
    """[N, R, ...] each response token's scores under its teacher; `score(teacher, rows)` is the no-grad
    forward ([n, R, ...]: logprobs of the sampled tokens, or top-k logprobs and ids) over the rows one teacher
    scores."""
    out: torch.Tensor | None = None
    for key, rows in teachers.rows_of(batch).items():
        if rows:
            scored = score(teachers.by_key[key], batch.select(rows)).cpu()
            if out is None:
                out = torch.zeros(len(batch), *scored.shape[1:], dtype=scored.dtype)
            out[rows] = scored
    assert out is not None, "every row goes to a teacher"
    return out
