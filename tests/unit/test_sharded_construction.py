"""Sharded construction's pieces without a process group: the row reader and streamed writer of
safetensors files, the meta-device build, and the per-rank memory arithmetic (issue 31).

The ranks' side (each rank reads its own rows into FSDP2's shards, equal to the whole model) is
tests/integration/test_distributed.py's parity run and tests/integration/test_sharded_memory.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, Qwen2Config

from relm.distributed.sharded_load import critic_weights, materialize_parameters, stored_weights
from relm.memory.model_shape import ModelShape
from relm.memory.plan import PlanRequest, TraineeRequest
from relm.memory.sharded_plan import plan_sharded_rank
from relm.models.loading import load_causal_lm, resolve_model_dir
from relm.models.safetensors_rows import SafetensorsFolder
from relm.models.safetensors_write import TensorEntry, write_streamed


def test_rows_are_read_from_one_file_and_cast_while_read(tmp_path: Path):
    weight = torch.randn(7, 3, 5)
    save_file(
        {"w": weight, "b": torch.arange(4, dtype=torch.int64), "h": weight.bfloat16()},
        str(tmp_path / "model.safetensors"),
    )
    stored = SafetensorsFolder(tmp_path)
    rows = torch.empty(3, 3, 5)
    stored.read_rows("w", 2, rows)
    assert rows.equal(weight[2:5])
    cast = torch.empty(2, 3, 5)  # bf16 in the file, fp32 shard
    stored.read_rows("h", 5, cast)
    assert cast.equal(weight[5:7].bfloat16().float())
    ints = torch.empty(0, dtype=torch.int64)
    stored.read_rows("b", 4, ints)  # an empty piece (a rank past the end of a short tensor) reads nothing
    whole = torch.empty(4, dtype=torch.int64)
    stored.read_rows("b", 0, whole)
    assert whole.equal(torch.arange(4))


def test_streamed_files_split_with_an_index_and_read_back(tmp_path: Path):
    tensors = {f"layer.{i}": torch.randn(16, 8) for i in range(5)} | {
        "scale": torch.ones((), dtype=torch.bfloat16)
    }
    entries = [TensorEntry(name, t.dtype, tuple(t.shape)) for name, t in tensors.items()]
    made: list[str] = []

    def make(entry: TensorEntry) -> torch.Tensor:
        made.append(entry.name)
        return tensors[entry.name]

    files = write_streamed(tmp_path, entries, make, max_file_bytes=2 * 16 * 8 * 4)  # two tensors a file
    assert [f.name for f in files] == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    assert made == list(tensors)  # one at a time, in order
    read = {}
    for file in files:
        read |= load_file(str(file))  # safetensors' own reader takes the files
    assert read.keys() == tensors.keys() and all(read[k].equal(tensors[k]) for k in tensors)
    stored = SafetensorsFolder(tmp_path)  # through the index
    row = torch.empty(1, 8)
    stored.read_rows("layer.3", 9, row)
    assert row.equal(tensors["layer.3"][9:10])
    scalar = torch.empty(())  # a 0-d tensor is one row; bf16 in the file
    stored.read_rows("scale", 0, scalar)
    assert scalar.item() == 1.0


def test_an_empty_build_has_meta_parameters_real_buffers_and_the_files_names():
    folder = resolve_model_dir("zoo:tiny/qwen2")
    whole = load_causal_lm(folder, dtype=torch.float32, device="cpu")
    empty = load_causal_lm(folder, dtype=torch.float32, device="cpu", empty=True)
    assert all(p.is_meta for p in empty.parameters())
    assert empty.generation_config.to_dict() == whole.generation_config.to_dict()  # the folder's, read
    assert empty.lm_head.weight is empty.model.embed_tokens.weight  # tied, as loaded
    for (name, buffer), (_, expected) in zip(empty.named_buffers(), whole.named_buffers(), strict=True):
        assert not buffer.is_meta and buffer.equal(expected), name
    stored = SafetensorsFolder(folder)
    weights = stored_weights(empty, stored)
    assert weights is not None and weights.sources["model.norm.weight"][1] == "model.norm.weight"
    materialize_parameters(empty, torch.device("cpu"), torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 and not p.is_meta for p in empty.parameters())
    assert empty.lm_head.weight is empty.model.embed_tokens.weight  # made once


def test_names_transformers_would_convert_fall_back_to_a_whole_load(tmp_path: Path):
    model = AutoModelForCausalLM.from_pretrained(resolve_model_dir("zoo:tiny/qwen2"))
    state = {f"renamed.{k}": v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(tmp_path / "model.safetensors"))
    empty = load_causal_lm(resolve_model_dir("zoo:tiny/qwen2"), dtype=torch.float32, device="cpu", empty=True)
    assert stored_weights(empty, SafetensorsFolder(tmp_path)) is None


def test_per_rank_bytes_by_hand():
    shape = ModelShape(num_params=1000, num_layers=2, hidden_size=10, intermediate_size=20, vocab_size=7)
    request = PlanRequest(
        trainees={"actor": TraineeRequest(shape)},
        has_reference=True,
        max_sequence_length=8,
        gpu_bytes=0,
        host_bytes=0,
    )
    gpu = plan_sharded_rank(
        request,
        4,
        reference_dtype=torch.bfloat16,
        engine_dtype=torch.bfloat16,
        one_process_engine_dtype=torch.bfloat16,
    )
    # 16 P / 4 + 2 P / 4 + 2 P + 4 V H; one process 16 P + 2 P + 2 P
    assert (gpu.trained_shards, gpu.reference_shard, gpu.engine_copy, gpu.in_flight) == (4000, 500, 2000, 280)
    assert gpu.steady == 6780 and gpu.one_process == 20000
    assert gpu.startup == 1000 + 500 + 2000 + 280  # weights' shards only, no gradients or moments yet
    cpu = plan_sharded_rank(
        request, 4, reference_dtype=torch.float32, engine_dtype=torch.float32, one_process_engine_dtype=None
    )
    # CPU: the whole fp32 generation copy on each rank, none in one process (it generates on the actor)
    assert cpu.steady == 4000 + 1000 + 4000 + 280 and cpu.one_process == 20000
    assert "one process would hold" in cpu.describe()


def test_a_tensor_parallel_copy_holds_its_share_of_the_split_projections():
    # 600 of 1000 parameters in the attention and MLP projections: a copy split over 4 holds 400 + 150.
    shape = ModelShape(
        num_params=1000,
        num_layers=2,
        hidden_size=10,
        intermediate_size=20,
        vocab_size=7,
        tensor_parallel_params=600,
    )
    request = PlanRequest(
        trainees={"actor": TraineeRequest(shape)},
        has_reference=False,
        max_sequence_length=8,
        gpu_bytes=0,
        host_bytes=0,
    )
    plan = plan_sharded_rank(
        request,
        4,
        reference_dtype=torch.bfloat16,
        engine_dtype=torch.bfloat16,
        one_process_engine_dtype=None,
        tp_size=4,
    )
    assert plan.engine_copy == 2 * (400 + 150)
    assert "generation copy split over 4" in plan.describe()
    # read from a config: Qwen2's q/k/v/o and gate/up/down projections, biases included
    config = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    qwen2 = ModelShape.from_config(config)
    per_layer = (32 * 32 + 32) + 2 * (32 * 16 + 16) + 32 * 32 + 3 * 32 * 64
    assert qwen2.tensor_parallel_params == 2 * per_layer


@pytest.mark.parametrize("world", [1, 4])
def test_a_critic_is_sharded_too(world: int):
    actor = ModelShape(num_params=1000, num_layers=2, hidden_size=10, intermediate_size=20, vocab_size=7)
    critic = ModelShape(num_params=800, num_layers=2, hidden_size=10, intermediate_size=20, vocab_size=7)
    request = PlanRequest(
        trainees={"actor": TraineeRequest(actor), "critic": TraineeRequest(critic)},
        has_reference=False,
        max_sequence_length=8,
        gpu_bytes=0,
        host_bytes=0,
    )
    plan = plan_sharded_rank(
        request, world, reference_dtype=torch.float32, engine_dtype=None, one_process_engine_dtype=None
    )
    assert plan.trained_shards == 16 * 1800 // world and plan.one_process == 16 * 1800


def test_a_rank_whose_share_exceeds_the_host_budget_stops_before_loading():
    from relm.config.loader import load_config
    from relm.config.translate import translate
    from relm.memory.choices import RunDoesNotFit, sharded_rank_plan
    from relm.memory.host import process_rss_bytes
    from relm.models.precision import pick_precision

    folder = resolve_model_dir("zoo:tiny/qwen2")
    cpu = torch.device("cpu")
    rss_gb = process_rss_bytes() / 1e9
    grpo = "algorithm.adv_estimator=grpo"  # no critic, no reference
    roomy = translate(load_config([grpo, f"trainer.max_host_memory_gb={rss_gb + 1:.3f}"]))[0]
    plan = sharded_rank_plan(roomy, folder, cpu, pick_precision("auto", cpu), 2)
    assert plan.shard_size == 2 and plan.engine_copy == 4 * plan.one_process // 16  # fp32 copy; no reference
    tight = translate(load_config([grpo, f"trainer.max_host_memory_gb={rss_gb:.3f}"]))[0]
    with pytest.raises(RunDoesNotFit, match=r"does not fit each rank's host memory: sharded construction"):
        sharded_rank_plan(tight, folder, cpu, pick_precision("auto", cpu), 2)


def test_on_cpu_a_host_budget_decides_whether_weights_stay_gathered():
    from relm.distributed.context import DistContext
    from relm.distributed.gathering import available_bytes
    from relm.memory.host import process_rss_bytes

    cpu = torch.device("cpu")
    assert available_bytes(cpu) is None and available_bytes(cpu, DistContext()) is None  # no budget: always
    room = available_bytes(cpu, DistContext(host_budget_bytes=process_rss_bytes() + 10**9))
    assert room is not None and 0.9e9 < room <= 1e9
    assert available_bytes(cpu, DistContext(host_budget_bytes=1)) == 0


def test_an_empty_build_ends_responses_at_the_folders_generation_eos_ids(tmp_path: Path):
    import json
    import shutil

    shutil.copytree(resolve_model_dir("zoo:tiny/qwen2"), tmp_path / "model")
    generation = tmp_path / "model" / "generation_config.json"
    generation.write_text(json.dumps({**json.loads(generation.read_text()), "eos_token_id": [3, 7]}))
    empty = load_causal_lm(str(tmp_path / "model"), dtype=torch.float32, device="cpu", empty=True)
    assert empty.generation_config.eos_token_id == [3, 7]  # config.json alone names 3


def test_a_critic_reads_its_backbone_under_either_name_and_its_head_or_zeros(tmp_path: Path):
    from relm.models.value_model import load_value_model

    folder = resolve_model_dir("zoo:tiny/qwen2")
    empty = load_value_model(folder, dtype=torch.float32, device="cpu", empty=True)
    assert all(p.is_meta for p in empty.parameters())
    fresh = critic_weights(empty, folder)  # a causal LM's folder: `model.` names, no head file
    assert fresh is not None and fresh.zeros == {"value_head.weight", "value_head.bias"}
    assert fresh.sources["backbone.norm.weight"][1] == "model.norm.weight"
    trained = load_value_model(folder, dtype=torch.float32, device="cpu")
    trained.save_pretrained(tmp_path)  # relm's critic checkpoint: the backbone's own names, the head's file
    saved = critic_weights(empty, str(tmp_path))
    assert saved is not None and not saved.zeros
    assert saved.sources["backbone.norm.weight"][1] == "norm.weight"
    assert saved.sources["value_head.bias"][1] == "bias"
