"""`relm bench capacity`'s arithmetic (relm.memory.capacity) by hand on small shapes."""

from __future__ import annotations

from relm.memory.capacity import Candidate, fit, largest, sharded_rank_bytes, tensor_parallel_size
from relm.memory.model_shape import ModelShape
from relm.memory.plan import LOGIT_SCRATCH_BYTES

GIB = 2**30


def shape(num_params: int, split: int) -> ModelShape:
    return ModelShape(
        num_params=num_params, num_layers=4, hidden_size=1024, intermediate_size=4096, vocab_size=32000,
        tensor_parallel_params=split,
    )  # fmt: skip


def test_sharded_rank_bytes_by_hand():
    s = shape(num_params=2_000_000_000, split=1_800_000_000)
    got = sharded_rank_bytes(s, num_ranks=4, tp_size=2, sequence_length=512)
    P, T, V, H, L = 2_000_000_000, 1_800_000_000, 32000, 1024, 4  # noqa: N806 - the docstring's names
    root = 2 * V * H
    expected = (
        16 * P // 4  # fp32 weights, gradients, two moments, over 4
        + 2 * P // 4  # bf16 reference shards
        + 2 * (P - T + T // 2)  # generation copy, projections split over 2
        + 4 * V * H  # one fp32 parameter in flight
        + 4 * (P - root) // L
        + 2 * root  # two gathered bf16 blocks and the gathered root
        + s.activation_bytes_per_token(checkpointing=True) * 512
        + LOGIT_SCRATCH_BYTES
    )
    assert got == expected


def test_tensor_parallel_size_divides_ranks_and_heads():
    candidate = Candidate("m", shape(10**9, 9 * 10**8), num_heads=28, num_kv_heads=4)
    assert [tensor_parallel_size(candidate, n) for n in (1, 2, 4, 8)] == [1, 2, 4, 4]


def test_more_cards_fit_a_larger_model_and_none_fits_a_too_small_card():
    small = Candidate("small", shape(10**9, 9 * 10**8), 16, 8)
    large = Candidate("large", shape(8 * 10**9, 7 * 10**9), 16, 8)
    card, host = 40 * 10**9, 64 * 10**9
    assert largest([small, large], 1, card, host, 512)[0].name == "small"
    answer = largest([small, large], 8, card, host, 512)
    assert answer is not None and answer[0].name == "large"
    assert answer[1].layout == "sharded over 8, generation split over 8"
    assert answer[1].rank_bytes <= 0.85 * card
    assert fit(large, 1, 4 * 10**9, host, 512) is None
    one = fit(small, 1, card, host, 512)
    assert one is not None and one.layout.startswith("one GPU's plan: fp32 weights, fp32 moments")


def test_the_table_in_docs_distributed_md_is_what_relm_bench_capacity_prints(capsys):
    from pathlib import Path

    from relm.bench.capacity import main

    assert main([]) == 0
    printed = capsys.readouterr().out.strip()
    docs = (Path(__file__).resolve().parents[2] / "docs" / "distributed.md").read_text()
    assert printed in docs
    assert "| 80 GB |" in printed and "Qwen2.5-14B (sharded over 8, generation split over 8" in printed


def test_where_the_shards_fit_only_in_cpu_memory_the_cell_offloads_them_if_the_machine_holds_them():
    model = Candidate("m", shape(2_000_000_000, 1_800_000_000), 16, 8)  # generation split over 2 on 2 cards
    P, T, V, H, L = 2_000_000_000, 1_800_000_000, 32000, 1024, 4  # noqa: N806 - the docstring's names
    root = 2 * V * H
    on_card = (
        2 * (P - T + T // 2)  # what the offload leaves on the card: the split generation copy,
        + 4 * V * H  # one fp32 parameter in flight,
        + 4 * (P - root) // L + 2 * root  # the gathered blocks and root,
        + model.shape.activation_bytes_per_token(checkpointing=True) * 512
        + LOGIT_SCRATCH_BYTES  # one checkpointed sequence and the log-softmax scratch
    )  # fmt: skip
    card = 16 * 10**9  # 13.6 GB usable: the shards on it (18 P / 2 = 18 GB more) do not fit
    assert sharded_rank_bytes(model.shape, 2, 2, 512) == on_card + 18 * P // 2 > 0.85 * card
    got = fit(model, 2, card, 64 * 10**9, 512)  # two ranks pin 18 P = 36 GB of 0.7 x 64 = 44.8 GB
    assert got is not None and (got.rank_bytes, got.offloaded_bytes) == (on_card, 18 * P)
    assert got.layout == "sharded over 2, generation split over 2, CPU offload"
    assert fit(model, 2, card, 50 * 10**9, 512) is None  # 0.7 x 50 = 35 GB < 36 GB


def test_relm_bench_capacity_model_names_the_fewest_cards_of_each_size_that_train_a_model(capsys):
    """The question turned round (issue 31: how many GPUs and which TP size a model needs): the 7B zoo
    config, read without building weights, trains on one 80 GB card by the one-GPU plan; on 24 GB cards
    the table's own cells say no 7B fits, so neither does it here."""
    from relm.bench.capacity import cards_needed, main

    text = cards_needed("zoo:Qwen/Qwen2.5-7B-Instruct", [1, 2, 4, 8], [24, 80], 128, 512)
    assert "7.62B parameters, 28 attention heads, 4 key/value heads" in text
    assert "| 80 GB | 1 | one GPU's plan: " in text
    assert "| 24 GB | more than 8 | does not fit 8 cards on one machine | - |" in text
    assert main(["--model", "zoo:Qwen/Qwen2.5-0.5B-Instruct", "--card-gb", "24"]) == 0
    assert "| 24 GB | 1 | one GPU's plan" in capsys.readouterr().out
