"""FP8 rollout weights (`relm.rollout.native.fp8`, `actor_rollout_ref.rollout.quantization=fp8`).

The quantizer is checked on small matrices worked out by hand (e4m3 keeps 3 mantissa bits: between
128 and 256 its values are 16 apart, so 134.4 rounds to 128), the engine on the tiny hd64 model (whose
128-wide layers take 128 x 128 blocks and whose 64-row k/v projections scale per channel), and on a
GPU the `torch._scaled_mm` product against the CPU path's and a bf16 product at the Qwen2.5-1.5B shape.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from relm.config.loader import load_config
from relm.config.validate import validate_config
from relm.errors import UserError
from relm.rollout.base import SamplingParams
from relm.rollout.native.engine import NativeRolloutEngine
from relm.rollout.native.fp8 import (
    FP8_MAX,
    SCALE_BUFFER,
    WEIGHT_BUFFER,
    Fp8Tensor,
    dequantize,
    fp8_linear,
    quantize,
    quantize_activation,
)
from relm.trainer.metrics import rollout_gap_report
from tests.unit.test_native_engine import (
    native,
    pad_id,
    prompts_for,
    requires_cuda,
    trainer_logprobs,
    zoo_model,
)

HD64 = "tiny/qwen2-hd64"


def e4m3_bound(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Round-to-nearest e4m3 error: 2^-4 of the value in the normal range, 2^-10 x scale below it."""
    return torch.maximum(x.abs() / 16, scale / 1024) + 1e-7


def test_per_channel_scales_map_each_rows_largest_value_to_448():
    x = torch.tensor([[1.0, -2.0], [0.5, 4.0]])
    q = quantize(x)
    # Row 0: scale 2/448, so 1 -> 224 and -2 -> -448; row 1: 4/448, so 0.5 -> 56, 4 -> 448 (all exact in e4m3).
    torch.testing.assert_close(q.scale, torch.tensor([[2 / 448], [4 / 448]]))
    assert q.data.dtype == torch.float8_e4m3fn
    assert q.data.float().tolist() == [[224.0, -448.0], [56.0, 448.0]]
    torch.testing.assert_close(dequantize(q), x)


def test_values_between_e4m3_steps_round_to_the_nearest():
    x = torch.tensor([[1.0, 0.3]])
    q = quantize(x)
    # 0.3 x 448 = 134.4, between e4m3's 128 and 144: 128, so 0.3 comes back as 128/448.
    assert q.data.float().tolist() == [[448.0, 128.0]]
    back = dequantize(q)
    assert back[0, 1].item() == pytest.approx(128 / 448)
    assert abs(back[0, 1].item() - 0.3) <= 0.3 / 16


def test_block_scales_cover_partial_tiles_and_zero_tiles():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, -9.0]])
    q = quantize(x, (2, 2))
    # Tiles: rows 0-1 x cols 0-1 (largest 5), rows 0-1 x col 2 (6), row 2 x cols 0-1 (8), row 2 x col 2 (9).
    torch.testing.assert_close(q.scale, torch.tensor([[5.0, 6.0], [8.0, 9.0]]) / 448)
    assert q.data.shape == x.shape
    back = dequantize(q)
    scales = torch.tensor([[5.0, 5.0, 6.0], [5.0, 5.0, 6.0], [8.0, 8.0, 9.0]]) / 448
    assert ((back - x).abs() <= e4m3_bound(x, scales)).all()
    assert back[2, 2].item() == -9.0 and back[1, 1].item() == 5.0  # each tile's largest is exact

    zeros = quantize(torch.zeros(4, 4), (2, 2))
    assert torch.equal(dequantize(zeros), torch.zeros(4, 4))  # no 0/0


@pytest.mark.parametrize("block", [None, (128, 128)])
def test_random_weights_stay_within_e4m3s_rounding(block):
    torch.manual_seed(0)
    x = torch.randn(256, 384) * torch.logspace(-3, 1, 384)  # columns of very different sizes
    q = quantize(x, block)
    if block is None:
        scales = q.scale.expand_as(x)
    else:
        scales = q.scale.repeat_interleave(128, 0).repeat_interleave(128, 1)
    back = dequantize(q)
    assert ((back - x).abs() <= e4m3_bound(x, scales)).all()
    assert (q.data.float().abs() <= FP8_MAX).all()
    assert (back - x).abs().max() > 0  # not lossless: e4m3 really rounds


@pytest.mark.parametrize("block", [None, (128, 128)])
def test_activations_are_scaled_per_token(block):
    torch.manual_seed(1)
    weight = quantize(torch.randn(64, 256), block)
    x = torch.randn(3, 256)
    loud = x.clone()
    loud[0] *= 1000  # one token far louder: the other tokens' scales, hence outputs, do not move
    assert torch.equal(fp8_linear(x, weight, None)[1:], fp8_linear(loud, weight, None)[1:])
    activation = quantize_activation(x, block)
    assert activation.scale.shape == ((3, 1) if block is None else (3, 2))


@pytest.mark.parametrize("block", [None, (128, 128)])
def test_cpu_product_is_close_to_the_exact_one(block):
    torch.manual_seed(2)
    w, x, bias = torch.randn(128, 256), torch.randn(2, 5, 256), torch.randn(128)
    out = fp8_linear(x, quantize(w, block), bias)
    exact = F.linear(x, w, bias)
    assert out.shape == exact.shape
    # Both operands carry e4m3's ~2^-5 average relative error; the dot product averages them out.
    assert (out - exact).norm() / exact.norm() < 0.05


@torch.no_grad()
def test_fp8_engine_generates_valid_tokens_with_logprobs_near_the_trainers():
    model = zoo_model(HD64)
    engine = native(model, eos=[5, 9], quantization="fp8")
    units = {unit.owner: unit for unit in engine.fp8.units}
    attention = model.model.layers[0].self_attn
    assert units[attention.q_proj].block == (128, 128)  # 128 x 128
    assert units[attention.k_proj].block is None  # 64 rows: per channel
    assert model.lm_head not in units and all(type(m).__name__ != "Embedding" for m in units)

    prompts = prompts_for(model)
    params = SamplingParams(n=2, max_new_tokens=16, temperature=1.0, seed=3)
    out = engine.generate(prompts, params)
    mask = out.response_mask.bool()
    assert mask.sum() > 40
    assert (out.response_ids[mask] >= 0).all() and (out.response_ids[mask] < model.config.vocab_size).all()
    gap = (out.logprobs - trainer_logprobs(model, prompts, out, n=2, temperature=1.0)).abs()[mask]
    # The trainer computes in fp32 with the exact weights; fp8 moves logprobs by a few hundredths here
    # (the same engine without fp8 agrees to 1e-4: test_native_engine).
    assert gap.max() < 0.25 and gap.mean() < 0.05
    assert gap.max() > 1e-3  # the products really were fp8
    # The same seed without fp8: the same random draws, so mostly the same tokens.
    plain = native(model, eos=[5, 9]).generate(prompts, params)
    assert (plain.response_ids == out.response_ids).float().mean() > 0.8
    assert all("forward" not in vars(m) for m in model.modules())  # the layers' own forwards are back


@torch.no_grad()
def test_fused_engine_copy_runs_one_fp8_product_per_group():
    model = zoo_model(HD64).requires_grad_(False)  # the GPU's frozen engine copy: q/k/v fused
    engine = native(model, eos=[], quantization="fp8")
    grouped = [unit for unit in engine.fp8.units if unit.group is not None]
    assert len(grouped) == 2 * model.config.num_hidden_layers  # q/k/v and gate/up in each layer
    assert all(unit.block == (128, 128) for unit in grouped)  # 128 + 64 + 64 rows as one weight
    prompts = prompts_for(model)
    out = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=12, temperature=1.0, seed=3))
    gap = (out.logprobs - trainer_logprobs(model, prompts, out, n=2, temperature=1.0)).abs()
    assert gap[out.response_mask.bool()].max() < 0.25


@torch.no_grad()
def test_sync_requantizes_in_place():
    actor, engine_copy = zoo_model(HD64), zoo_model(HD64)  # a separate engine copy, as on a GPU
    engine = native(engine_copy, eos=[], quantization="fp8")
    prompts, params = prompts_for(engine_copy), SamplingParams(max_new_tokens=8, seed=0)
    before = engine.generate(prompts, params)
    up = engine_copy.model.layers[1].mlp.up_proj
    held = getattr(up, WEIGHT_BUFFER)
    address, old = held.data_ptr(), held.clone()

    actor.model.layers[1].mlp.up_proj.weight.mul_(3).add_(0.01)  # an update changed one weight
    engine.sync_weights(actor.named_parameters())
    now = getattr(up, WEIGHT_BUFFER)
    assert now.data_ptr() == address  # written in place: captured graphs stay valid
    expected = quantize(actor.model.layers[1].mlp.up_proj.weight, (128, 128))
    assert torch.equal(now.view(torch.uint8), expected.data.view(torch.uint8))
    assert torch.equal(getattr(up, SCALE_BUFFER), expected.scale)
    assert not torch.equal(now.view(torch.uint8), old.view(torch.uint8))
    after = engine.generate(prompts, params)
    assert not torch.equal(after.logprobs, before.logprobs)  # the engine generates from the new weights


def test_moe_routers_and_unaligned_layers_stay_exact():
    model = zoo_model("tiny/qwen2-moe")
    engine = native(model, eos=[], quantization="fp8")
    names = {module: name for name, module in model.named_modules()}
    quantized = [names[unit.owner] for unit in engine.fp8.units]
    assert not any(name.endswith("gate") for name in quantized)  # routers and shared-expert gates
    assert all(unit.owner.in_features % 16 == 0 for unit in engine.fp8.units)


def test_quantization_key_is_fp8_on_the_native_engine():
    cfg = load_config(["actor_rollout_ref.rollout.quantization=fp8"])
    validate_config(cfg)
    assert cfg.actor_rollout_ref.rollout.quantization == "fp8"
    with pytest.raises(UserError, match=r"quantization=torchao`: relm implements fp8"):
        validate_config(load_config(["actor_rollout_ref.rollout.quantization=torchao"]))
    with pytest.raises(
        UserError, match=r"runs on the native engine; set actor_rollout_ref.rollout.name=native"
    ):
        validate_config(
            load_config(["actor_rollout_ref.rollout.quantization=fp8", "actor_rollout_ref.rollout.name=hf"])
        )


def test_first_step_line_reports_the_gap():
    metrics = {"rollout/logprob_diff_max": 0.0209, "rollout/logprob_diff_mean": 0.00361}
    assert rollout_gap_report(metrics, None) is None
    line = rollout_gap_report(metrics, "fp8")
    assert line is not None and "max 0.0209, mean 0.00361" in line
    assert "not measured" in (rollout_gap_report({}, "fp8") or "")


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("block", [None, (128, 128)])
def test_gpu_scaled_mm_matches_the_cpu_path_and_bf16(block):
    """Qwen2.5-1.5B's gate/up product at 256 decode rows: [256 x 1536] @ [1536 x 17920]."""
    torch.manual_seed(0)
    w = torch.randn(17920, 1536, device="cuda", dtype=torch.bfloat16) * 0.02
    x = torch.randn(256, 1536, device="cuda", dtype=torch.bfloat16)
    q = quantize(w, block)
    out = fp8_linear(x, q, None)
    assert out.dtype == torch.bfloat16 and out.shape == (256, 17920)
    cpu_q = Fp8Tensor(q.data.cpu(), q.scale.cpu(), q.block)
    same_operands = fp8_linear(x.cpu(), cpu_q, None).float()  # dequantized, float32 product
    assert (out.cpu().float() - same_operands).norm() / same_operands.norm() < 5e-3
    bf16 = F.linear(x, w).float()
    assert (out.float() - bf16).norm() / bf16.norm() < 0.05


@pytest.mark.gpu
@requires_cuda
@torch.no_grad()
def test_gpu_fp8_engine_with_graphs_logprobs_near_the_trainers():
    model = zoo_model(HD64, device="cuda", dtype=torch.bfloat16).requires_grad_(False)
    engine = NativeRolloutEngine(
        model,
        pad_token_id=pad_id(model),
        eos_token_ids=[],
        device="cuda",
        quantization="fp8",
        compile_layers=False,  # graphs on, compilation off: seconds instead of a cold inductor compile
    )
    prompts = prompts_for(model, [5, 23, 30])
    out = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=16, temperature=1.0, seed=0))
    assert engine.graphs is not None and engine.graphs.num_graphs > 0
    gap = (out.logprobs - trainer_logprobs(model, prompts, out, n=2, temperature=1.0)).abs()
    assert gap[out.response_mask.bool()].max() < 0.3


@torch.no_grad()
def test_a_lora_actor_generating_itself_quantizes_its_base_layers_not_its_adapters():
    pytest.importorskip("peft")
    from relm.learner.lora import LoraSettings, add_lora

    model = zoo_model(HD64)
    add_lora(model, LoraSettings(rank=16, alpha=32))
    engine = native(model, eos=[], quantization="fp8")
    names = {module: name for name, module in model.named_modules()}
    quantized = [names[unit.owner] for unit in engine.fp8.units]
    assert quantized and all(name.endswith("base_layer") for name in quantized)
    prompts = prompts_for(model)
    out = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=8, temperature=1.0, seed=3))
    gap = (out.logprobs - trainer_logprobs(model, prompts, out, n=2, temperature=1.0)).abs()
    assert 1e-4 < gap[out.response_mask.bool()].max() < 0.25
