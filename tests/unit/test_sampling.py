"""The CPU draw of `relm.rollout.sampling`: exact in distribution, and one uniform per row.

Both engines sample through `sample_next_token`, so their agreement under a shared seed is checked in
tests/unit/test_native_engine.py and test_hf_engine.py; here the draw itself is checked against the
probabilities it must follow.
"""

from __future__ import annotations

import math

import torch

from relm.rollout.base import SamplingParams
from relm.rollout.sampling import CDF_BLOCK, sample_next_token


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic over the cells expected at least 5 times (the rest pooled in one cell)."""
    expected = probs.double() * counts.sum()
    big = expected >= 5
    observed = torch.cat([counts[big].double(), counts[~big].double().sum()[None]])
    wanted = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = wanted > 0
    return float(((observed[keep] - wanted[keep]) ** 2 / wanted[keep]).sum()), int(keep.sum()) - 1


def test_cpu_draw_follows_softmax_after_top_k_by_chi_square():
    # A vocabulary over two CDF blocks and a partial third, probabilities spread over six orders of
    # magnitude, temperature 0.7 and a top-k that leaves the tail, ids in every block, at -inf.
    vocab = 2 * CDF_BLOCK + 300
    logits = (
        torch.linspace(0, 1, vocab)
        .mul(97.0)
        .sin()
        .mul(6.0)[torch.randperm(vocab, generator=torch.Generator().manual_seed(1))]
    )
    params = SamplingParams(temperature=0.7, top_k=900)
    rows = 20_000
    tokens, logprobs = sample_next_token(logits.expand(rows, vocab), params, torch.Generator().manual_seed(0))

    scaled = logits / 0.7
    kept = scaled >= scaled.topk(900).values[-1]
    probs = torch.softmax(scaled.masked_fill(~kept, float("-inf")), dim=-1)
    counts = torch.bincount(tokens, minlength=vocab)
    assert counts[~kept].sum() == 0  # a filtered id is never drawn
    statistic, dof = _chi_square(counts[kept], probs[kept])
    # fixed seed, so the verdict is the same on any machine; 6 standard deviations over the mean
    assert statistic < dof + 6 * math.sqrt(2 * dof), (statistic, dof)
    # the reported logprob is the unfiltered one
    torch.testing.assert_close(logprobs, torch.log_softmax(scaled, -1)[tokens], atol=1e-5, rtol=0)


def test_cpu_sampling_reads_one_uniform_per_row_not_noise_per_entry():
    # The speed of a decode step on CPU: 32 rows x 151,665 entries of exponential noise took ~200 ms;
    # the draw takes one float64 uniform per row from the generator, whatever the vocabulary.
    logits = torch.randn(32, 5000)
    generator = torch.Generator().manual_seed(0)
    sample_next_token(logits, SamplingParams(temperature=1.0), generator)
    after_one_uniform = torch.Generator().manual_seed(0)
    torch.rand(32, 1, dtype=torch.float64, generator=after_one_uniform)
    assert torch.equal(generator.get_state(), after_one_uniform.get_state())


def test_cpu_draw_of_nan_logits_gives_valid_ids_and_nan_logprobs():
    # A diverged model's logits: the draw must not fail (it did, "index 1 is out of bounds"), so the
    # run reaches the trainer's non-finite-gradient check (tests/integration/test_divergence.py).
    logits = torch.randn(4, 2 * CDF_BLOCK + 7)
    logits[1] = float("nan")
    logits[2, 3] = float("inf")
    tokens, logprobs = sample_next_token(
        logits, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0)
    )
    assert ((tokens >= 0) & (tokens < logits.shape[1])).all()
    assert logprobs[[0, 3]].isfinite().all() and logprobs[[1, 2]].isnan().all()
