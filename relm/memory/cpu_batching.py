"""How many responses a CPU run puts in one forward/backward when the user leaves it to relm.

A training forward keeps fp32 logits for every response position: rows x (response + 1) x vocabulary
values. At Qwen2.5's 151,665 entries and 256 response tokens that is 156 MB a row, so relm's GPU default
of 16 rows held 2.5 GB of logits, as much again for their gradient, and faulted all of it in afresh
each pass (README's verl block on a 9.8M-parameter model: 6.2 GiB peak). On a CPU, rows run one after
another anyway, so fewer rows per micro-batch cost no speed; relm takes as many as keep one copy of the
logits within `CPU_LOGITS_BYTES`.
"""

from __future__ import annotations

from relm.config.specs import RunSpec

DEFAULT_ROWS_PER_MICROBATCH = 16
"""Responses per forward/backward when `actor.ppo_micro_batch_size_per_gpu` is unset (at most a mini-batch)."""
CPU_LOGITS_BYTES = 1 << 28
"""One fp32 copy of a CPU micro-batch's logits stays within this (256 MiB), down to one row."""
CPU_CHUNK_VALUES = 1 << 22
"""fp32 values of a vocabulary chunk on CPU (`relm.learner.vocab_chunks.chunk_values`): 16 MiB per
intermediate, 27 positions at Qwen2.5's 151,665 entries.

A CPU micro-batch's logits fit in one GPU-sized chunk (2^26 values), so every intermediate of the
log-softmax, the entropy and their backward was a full [rows, response + 1, vocabulary] copy: six live at
the update's peak in README's verl block (0.87 GiB beside 0.29 GiB of everything else), and the heap, which
keeps freed memory on CPU (`relm.memory.host_allocator`), fragmented in 149 MiB holes. With 16 MiB chunks
only the logits and their gradient are full size (`relm.memory.plan.cpu_logit_bytes`): that command's peak
fell from 2.3-2.9 GiB to 1.5-1.6 GiB (docs/benchmarks.md)."""


def default_rows_per_microbatch(spec: RunSpec, cpu_vocab_size: int | None = None) -> int:
    """relm's micro-batch when the user sets none; `cpu_vocab_size` (the model's logits width) on a CPU run."""
    rows = min(spec.actor.update.prompts_per_minibatch * spec.engine.sampling.n, DEFAULT_ROWS_PER_MICROBATCH)
    if cpu_vocab_size is None:
        return rows
    row_bytes = 4 * cpu_vocab_size * (spec.data.max_response_length + 1)
    return max(1, min(rows, CPU_LOGITS_BYTES // row_bytes))
