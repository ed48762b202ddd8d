"""The data-parallel pieces that need no second process: row partitions, prompt shares, launch, context."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch

from relm.config.loader import load_config
from relm.config.translate import translate
from relm.config.validate import validate_config
from relm.distributed.balance import partition_rows, split_to_count
from relm.distributed.context import DistContext, init_distributed
from relm.distributed.launcher import RENDEZVOUS_PORT, needs_torchrun, rendezvous_port, torchrun_command
from relm.distributed.rollout import DataParallelEngine, share_bounds
from relm.errors import UserError
from relm.logs import setup_logging
from relm.rollout.base import GenerationOutput, SamplingParams, concat_outputs
from relm.rollout.hf_engine import HFRolloutEngine
from tests.tiny_models import tiny_lm


def test_balanced_partition_worked_by_hand():
    # Longest first, each to the lighter rank with room: 5->r0, 4->r1, 3(row 4)->r1, 3(row 5)->r0,
    # 2->r1 (now full), 1->r0: both ranks hold 9 tokens.
    parts = partition_rows(torch.tensor([5, 1, 4, 2, 3, 3]), world_size=2, chunk_rows=6, balance=True)
    assert [p.tolist() for p in parts] == [[0, 1, 5], [2, 3, 4]]


def test_each_chunk_is_split_on_its_own_so_mini_batches_keep_their_rows():
    tokens = torch.tensor([1, 2, 3, 4, 10, 20, 30, 40])
    balanced = partition_rows(tokens, world_size=2, chunk_rows=4, balance=True)
    assert [p.tolist() for p in balanced] == [[0, 3, 4, 7], [1, 2, 5, 6]]  # 5 | 5 and 50 | 50 tokens
    plain = partition_rows(tokens, world_size=2, chunk_rows=4, balance=False)
    assert [p.tolist() for p in plain] == [[0, 1, 4, 5], [2, 3, 6, 7]]


def test_rows_that_cannot_be_split_evenly_are_refused():
    with pytest.raises(ValueError, match="cannot be split evenly over 4 ranks"):
        partition_rows(torch.ones(6), world_size=4, chunk_rows=6, balance=True)


def test_a_rank_with_fewer_token_budget_micro_batches_halves_its_largest_until_it_has_as_many():
    groups = [torch.tensor([0, 1, 2]), torch.tensor([3]), torch.tensor([4, 5])]
    # 3 groups -> 4: [0, 1, 2] splits into [0] and [1, 2]; -> 5: the first largest, [1, 2], splits.
    split = split_to_count(groups, 5)
    assert [g.tolist() for g in split] == [[0], [1], [2], [3], [4, 5]]
    assert [g.tolist() for g in split_to_count(groups, 3)] == [[0, 1, 2], [3], [4, 5]]
    with pytest.raises(ValueError, match="6 rows cannot make 7 groups"):
        split_to_count(groups, 7)


def test_prompt_shares_are_contiguous_and_differ_by_at_most_one():
    assert [share_bounds(10, 3, i) for i in range(3)] == [(0, 4), (4, 7), (7, 10)]
    assert [share_bounds(1, 2, i) for i in range(2)] == [(0, 1), (1, 1)]  # a rank may get nothing


def test_a_rank_without_prompts_returns_an_empty_block_of_the_right_width():
    lonely = DataParallelEngine(
        HFRolloutEngine(tiny_lm(), pad_token_id=0, eos_token_ids=[], device="cpu"),
        DistContext(rank=1, world_size=2),  # no process group: the gather returns this rank's part only
    )
    out = lonely.generate([[1, 2, 3]], SamplingParams(max_new_tokens=5, seed=0))
    assert out.response_ids.shape == (0, 5) and out.logprobs.shape == (0, 5) and out.finish_reasons == []


def test_one_process_generates_through_the_wrapper_exactly_as_without_it():
    model = tiny_lm()
    params = SamplingParams(n=2, max_new_tokens=6, seed=3)
    plain = HFRolloutEngine(model, pad_token_id=0, eos_token_ids=[7], device="cpu").generate(
        [[1, 2], [3]], params
    )
    wrapped = DataParallelEngine(
        HFRolloutEngine(model, pad_token_id=0, eos_token_ids=[7], device="cpu"), DistContext()
    )
    out = wrapped.generate([[1, 2], [3]], params)
    assert out.response_ids.equal(plain.response_ids) and out.logprobs.equal(plain.logprobs)


def test_torchrun_command_for_one_node_and_for_several():
    one = torchrun_command(["data.train_batch_size=8"], nproc_per_node=2, store_dir=Path("/tmp/x"))
    assert one[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert one[-3:] == ["-m", "relm.trainer.main_ppo", "data.train_batch_size=8"]
    # One node meets through a file: no TCP store, which would listen on every interface.
    assert {"--rdzv_conf=store_type=file", "--rdzv_endpoint=/tmp/x/rendezvous"} <= set(one)
    assert "--standalone" not in one
    many = torchrun_command([], nproc_per_node=8, nnodes=2, rendezvous="host0:29400", run_id="exp")
    assert {"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=host0:29400", "--rdzv_id=exp"} <= set(many)
    assert "--standalone" not in many


def test_torchrun_is_needed_for_several_processes_or_offload():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert not needs_torchrun(translate(load_config([]))[0], cpu)
    assert needs_torchrun(translate(load_config(["trainer.n_gpus_per_node=2"]))[0], cpu)
    assert needs_torchrun(
        translate(load_config(["actor_rollout_ref.actor.fsdp_config.offload_policy=true"]))[0], cuda
    )
    with pytest.raises(UserError, match=r"^`fsdp_config.offload_policy=true` moves a GPU run's shards"):
        needs_torchrun(translate(load_config(["critic.model.fsdp_config.offload_policy=true"]))[0], cpu)


def test_outside_torchrun_the_context_is_the_single_process_one(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    dist = init_distributed(torch.device("cpu"), expected_world_size=1)
    assert not dist.is_distributed and dist.is_main and dist.world_size == 1
    assert dist.sum_floats([1.5, 2.0]) == [1.5, 2.0] and dist.gather_objects("x") == ["x"]


def test_a_torchrun_world_size_other_than_the_config_is_named(monkeypatch: pytest.MonkeyPatch):
    for name, value in {"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": "29500"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    with pytest.raises(UserError, match=r"torchrun started 4 processes but .* = 2; make them equal"):
        init_distributed(torch.device("cpu"), expected_world_size=2)


def test_a_node_with_another_process_count_than_n_gpus_per_node_is_named(monkeypatch: pytest.MonkeyPatch):
    for name, value in {"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    with pytest.raises(UserError, match=r"started 4 processes on this node but `trainer.n_gpus_per_node=2`"):
        init_distributed(torch.device("cpu"), expected_world_size=4, per_node=2)


def test_the_rendezvous_port_is_master_port_or_torchruns_default(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("MASTER_PORT", raising=False)
    assert rendezvous_port() == RENDEZVOUS_PORT == 29400
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert rendezvous_port() == 29500
    monkeypatch.setenv("MASTER_PORT", "head:29500")
    with pytest.raises(UserError, match=r"^MASTER_PORT='head:29500' is not a TCP port"):
        rendezvous_port()


def test_a_mini_batch_that_does_not_split_over_the_ranks_is_named():
    cfg = load_config(["data.train_batch_size=4", "actor_rollout_ref.rollout.n=3",
                       "actor_rollout_ref.actor.ppo_mini_batch_size=1", "trainer.n_gpus_per_node=4"])  # fmt: skip
    with pytest.raises(
        UserError, match=r"^`actor_rollout_ref.actor.ppo_mini_batch_size=1` x `rollout.n=3` = 3"
    ):
        validate_config(cfg)


def test_ranks_other_than_0_log_errors_only_and_lines_name_the_rank(monkeypatch: pytest.MonkeyPatch):
    log = logging.getLogger("relm")
    saved = log.handlers[:], log.level, log.propagate
    log.handlers.clear()
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    try:
        setup_logging()
        assert log.level == logging.ERROR
        assert log.handlers[-1].formatter._fmt.startswith("relm[rank 1] ")
    finally:
        log.handlers[:], level, log.propagate = saved
        log.setLevel(level)


def test_concat_outputs_keeps_the_multi_turn_fields_of_every_share_and_refuses_a_mix():
    def share(rows: int, tag: str) -> GenerationOutput:
        ids = torch.arange(rows * 3).reshape(rows, 3)
        out = GenerationOutput(ids, torch.ones_like(ids), -ids.float(), ["stop"] * rows)
        out.model_mask = torch.zeros_like(ids)
        out.extra_fields = [{"tag": tag}] * rows
        return out

    empty = GenerationOutput.empty(3)
    empty.model_mask, empty.extra_fields = torch.zeros(0, 3, dtype=torch.long), []
    whole = concat_outputs([share(2, "a"), empty, share(1, "b")])
    assert whole.response_ids.tolist() == [[0, 1, 2], [3, 4, 5], [0, 1, 2]]
    assert whole.model_mask is not None and whole.model_mask.shape == (3, 3)
    assert whole.extra_fields == [{"tag": "a"}, {"tag": "a"}, {"tag": "b"}]
    assert whole.finish_reasons == ["stop"] * 3
    plain = concat_outputs([GenerationOutput.empty(3), GenerationOutput.empty(3)])
    assert plain.model_mask is None and plain.extra_fields is None and plain.response_ids.shape == (0, 3)
    with pytest.raises(ValueError, match="model_mask, extra_fields or token_versions"):
        concat_outputs([share(1, "a"), GenerationOutput.empty(3)])
    versioned = GenerationOutput.empty(3)
    versioned.token_versions = torch.zeros(0, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="token_versions"):
        concat_outputs([versioned, GenerationOutput.empty(3)])
    assert concat_outputs([versioned, versioned]).token_versions is not None
