"""Forwards that run out of GPU memory are split in halves and retried, not fatal."""

from __future__ import annotations

import logging

import pytest
import torch

from relm.trainer.experience import run_halving_on_oom


def memory_limited(max_rows: int, done: list[list[int]]):
    """A forward that, like a GPU with room for `max_rows` rows, raises torch's own OOM error above that."""

    def forward(rows: torch.Tensor) -> None:
        if len(rows) > max_rows:
            raise torch.OutOfMemoryError(f"CUDA out of memory: {len(rows)} rows")
        done.append(rows.tolist())

    return forward


def test_halves_until_the_rows_fit(caplog):
    done: list[list[int]] = []
    with caplog.at_level(logging.WARNING, logger="relm"):
        run_halving_on_oom(torch.arange(7), memory_limited(2, done), "logprob forward")
    # 7 -> 3 + 4 -> (1 + 2) + (2 + 2): every row once, in order
    assert done == [[0], [1, 2], [3, 4], [5, 6]]
    assert "logprob forward: out of GPU memory on 7 rows; retrying as 3 + 4" in caplog.text


def test_a_single_row_that_does_not_fit_is_an_error():
    with pytest.raises(torch.OutOfMemoryError):
        run_halving_on_oom(torch.arange(4), memory_limited(0, []), "value forward")


def limit_tokens(model: torch.nn.Module, max_tokens: int) -> list[int]:
    """Make `model` behave like a GPU with room for `max_tokens` tokens a forward: torch's OOM above it."""
    seen: list[int] = []

    def hook(module, args, kwargs):
        tokens = int(kwargs["input_ids"].numel())
        seen.append(tokens)
        if tokens > max_tokens:
            raise torch.OutOfMemoryError(f"CUDA out of memory: {tokens} tokens")

    model.register_forward_pre_hook(hook, with_kwargs=True)
    return seen


@pytest.mark.parametrize("by_tokens", [True, False])
def test_an_update_that_runs_out_of_memory_is_redone_with_smaller_micro_batches(caplog, by_tokens):
    """The mini-batch is redone from zero gradients with half-size micro-batches: the step equals a run
    that used the smaller size from the start, and the smaller size is returned to be kept."""
    from relm.config.schema import ActorConfig
    from relm.learner.actor import update_actor
    from tests.unit.test_update_accumulation import batch_with_uneven_lengths, objective, tiny_lm, trainee

    cfg = ActorConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, use_kl_loss=True, grad_clip=1e9)

    def step(rows: int, max_tokens: int | None, limit: int | None):
        model = tiny_lm()
        seen = limit_tokens(model, limit) if limit else []
        actor = trainee(model, cfg, rows_per_microbatch=rows, max_tokens=max_tokens, remove_padding=True)
        result = update_actor(
            actor, batch_with_uneven_lengths(), objective(cfg), temperature=1.0, device=torch.device("cpu")
        )
        assert result.microbatch is actor.microbatch  # the smaller size stays with the trainee
        return model, result, seen

    # packed rows hold 4, 7, 5 and 6 tokens (3 prompt + 1, 4, 2, 3 response): 22 in all, room for 12.
    # By tokens: 32 (all 22 at once) fails, 16 (9 + 13) fails, 8 (4, 7, 5, 6 alone) fits.
    # By rows: 4 rows (22) fails, 2 rows (11 + 11) fits.
    start, final, halvings = ((None, 32), (None, 8), 2) if by_tokens else ((4, None), (2, None), 1)
    with caplog.at_level(logging.WARNING, logger="relm"):
        retried, result, seen = step(start[0] or 4, start[1], limit=12)
    assert seen[0] == 22 and all(tokens <= 12 for tokens in seen[-4 if by_tokens else -2 :])
    want, _, _ = step(final[0] or 4, final[1], limit=None)
    for got, expected in zip(retried.parameters(), want.parameters(), strict=True):
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)
    size = result.microbatch
    assert size.halvings == halvings and (size.max_tokens, size.rows) == (final[1], final[0] or 4)
    assert "actor update: out of GPU memory with micro-batches of up to" in caplog.text


def test_an_update_whose_single_row_does_not_fit_raises():
    from relm.config.schema import ActorConfig
    from relm.learner.actor import update_actor
    from tests.unit.test_update_accumulation import batch_with_uneven_lengths, objective, tiny_lm, trainee

    model = tiny_lm()
    limit_tokens(model, 3)
    cfg = ActorConfig(clip_ratio_low=0.2, clip_ratio_high=0.2)
    actor = trainee(
        model,
        cfg,
        rows_per_microbatch=4,
        remove_padding=True,
    )
    with pytest.raises(torch.OutOfMemoryError):
        update_actor(
            actor, batch_with_uneven_lengths(), objective(cfg), temperature=1.0, device=torch.device("cpu")
        )
