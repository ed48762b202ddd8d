"""The pieces that let every causal-LM type in transformers pass `relm compat` or be refused in one line:
tiny configs from the config classes, per-layer attributes, recurrent caches on the HF engine, the
native engine stepping aside for stateful layers, the causality probe and the engine-agreement verdict.
The whole sweep is `make test-compat-types` (tests/integration/test_compat_every_type.py)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from relm.compat.checks import CompatOptions, check_model_guarded
from relm.compat.sweep import TypeResult, default_verdict, markdown_table
from relm.compat.verdicts import (
    CheckFailed,
    attends_to_later_tokens,
    check_engine_agreement,
)
from relm.learner.forward import response_logprobs
from relm.memory.model_shape import ModelShape
from relm.models.padding_probe import left_padding_gap, probe_padding_mask
from relm.models.registry import inspect_model_architecture
from relm.models.tiny_types import TYPE_KNOBS, causal_lm_types, tiny_config
from relm.rollout.base import SamplingParams
from relm.rollout.hf_engine import HFRolloutEngine
from relm.rollout.native.engine import NativeRolloutEngine
from relm.rollout.padding import left_pad

PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]


def _model(model_type: str) -> torch.nn.Module:
    """The tiny model of `model_type`, asked whether it reads the attention mask as `load_causal_lm` asks."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(model_type)).eval()
    probe_padding_mask(model)
    return model


def _trainer_gap(model: torch.nn.Module, out) -> float:
    """Largest |engine - trainer| logprob over the responses (the trainer's padded forward)."""
    prompt_ids, prompt_mask = left_pad([p for p in PROMPTS for _ in range(2)], 0)
    input_ids = torch.cat([prompt_ids, out.response_ids], dim=1)
    mask = torch.cat([prompt_mask, out.response_mask], dim=1)
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    with torch.no_grad():
        logprobs, _ = response_logprobs(
            model, input_ids, mask, positions, out.response_ids.shape[1], temperature=1.0
        )
    return float((logprobs - out.logprobs).abs()[out.response_mask.bool()].max())


def test_types_come_from_transformers_mapping_and_shrink():
    types = causal_lm_types()
    assert {"llama", "qwen3_next", "deepseek_v32", "gemma4_text", "mamba"} <= set(types)
    config = tiny_config("qwen3_next")
    assert config.num_hidden_layers <= 3 and config.hidden_size == 64  # layers 0, 1 and the first full one
    assert set(config.layer_types) == {"linear_attention", "full_attention"}  # one layer of each kind
    kimi = tiny_config("kimi_linear")  # its KDA layers' own head knobs shrink too (32 x 128 published)
    assert (kimi.linear_num_heads, kimi.linear_head_dim) == (4, 16)


def test_per_layer_attributes_are_described_not_raised():
    info = inspect_model_architecture(tiny_config("gemma4_text"))  # per-layer head_dim raised on main
    assert info.head_dim == 32 and info.num_layers == tiny_config("gemma4_text").num_hidden_layers
    shape = ModelShape.from_config(tiny_config("gemma3n_text"))  # per-layer intermediate_size list
    assert shape.intermediate_size == 128 and shape.hidden_size == 64


@pytest.mark.parametrize("model_type", sorted(TYPE_KNOBS))
def test_types_whose_defaults_do_not_build_build_with_their_own_knobs(model_type):
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(tiny_config(model_type))
    assert sum(p.numel() for p in model.parameters()) < 5_000_000


@pytest.mark.parametrize("model_type", ["mamba", "falcon_mamba", "openai-gpt", "blt", "rwkv"])
def test_hf_engine_carries_each_models_own_cache(model_type):
    model = _model(model_type)
    engine = HFRolloutEngine(model, pad_token_id=0, eos_token_ids=[], device="cpu", seed=0)
    out = engine.generate(PROMPTS, SamplingParams(n=2, max_new_tokens=6, temperature=1.0, seed=0))
    assert _trainer_gap(model, out) < 2e-3


def test_native_engine_steps_aside_for_linear_attention_layers():
    model = _model("qwen3_next")
    native = NativeRolloutEngine(model, pad_token_id=0, eos_token_ids=[], device="cpu", seed=0)
    assert "linear_attention" in native.fallback_reason
    params = SamplingParams(n=2, max_new_tokens=6, temperature=1.0, seed=0)
    out = native.generate(PROMPTS, params)
    reference = HFRolloutEngine(model, pad_token_id=0, eos_token_ids=[], device="cpu", seed=0).generate(
        PROMPTS, params
    )
    assert torch.equal(out.response_ids, reference.response_ids)
    assert _trainer_gap(model, out) < 2e-3


def test_native_engine_steps_aside_for_a_config_transformers_cache_cannot_read():
    native = NativeRolloutEngine(_model("blt"), pad_token_id=0, eos_token_ids=[], device="cpu", seed=0)
    assert native.fallback_reason.startswith("transformers' cache cannot read BltForCausalLM's config")


def test_causality_probe_refuses_bidirectional_models():
    assert attends_to_later_tokens(_model("llama"), 101, torch.device("cpu")) is None
    reason = attends_to_later_tokens(_model("xlm"), 101, torch.device("cpu"))  # XLM: causal=False by default
    assert reason is not None and reason.startswith("is not causal")


def test_padding_probe_names_a_model_that_does_not_read_the_mask():
    assert left_padding_gap(_model("llama")) is None
    assert left_padding_gap(_model("mamba")) is None
    gap = left_padding_gap(_model("rwkv"))  # its forward ignores the mask
    assert gap is not None and gap > 0.1


def test_engine_gap_over_tolerance_fails_the_update():
    check_engine_agreement(
        {"rollout/logprob_diff_max": 1e-4, "rollout/logprob_diff_mean": 1e-5}, 1, torch.float32, "native"
    )
    with pytest.raises(CheckFailed, match="native engine's and the trainer's logprobs differ by 0.46"):
        check_engine_agreement(
            {"rollout/logprob_diff_max": 0.46, "rollout/logprob_diff_mean": 0.1}, 1, torch.float32, "native"
        )


def test_a_model_that_breaks_outside_a_stage_is_one_failed_row(tmp_path):
    (tmp_path / "config.json").write_text(
        '{"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": "two"}'
    )
    report = check_model_guarded(str(tmp_path), CompatOptions(device="cpu"))
    assert report.status == "fail" and report.failed_stage == "load" and report.stages[0].error


def test_default_verdict_and_table():
    hf = {
        "status": "pass",
        "conditions": [],
        "reason": "",
        "stages": [{"name": n, "status": "pass"} for n in ("load", "rollout", "update")],
    }
    native = {"status": "fail", "conditions": [], "reason": "", "stages": [
        {"name": "load", "status": "pass"}, {"name": "rollout", "status": "pass"},
        {"name": "update", "status": "fail", "error_class": "CheckFailed", "error": "gap"}]}  # fmt: skip
    assert default_verdict(hf, native) == ("fail", "update: CheckFailed: gap")
    table = markdown_table([TypeResult("x", verdicts={"native": "fail", "hf": "pass", "default": "fail"},
                                       notes={"native": "update: CheckFailed: gap", "hf": "", "default": "update: CheckFailed: gap"})],
                           ("native", "hf"))  # fmt: skip
    assert "| x | fail | fail | pass | default: update: CheckFailed: gap |" in table


def test_a_refusal_that_names_register_is_lifted_by_it():
    from transformers import MllamaTextConfig

    from relm.models.registry import non_causal_reason, register_model_class, unregister_model_class

    config = MllamaTextConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2
    )
    config.architectures = ["MllamaForCausalLM"]
    reason = non_causal_reason(config)
    assert reason is not None and "--register MllamaForCausalLM=MllamaForCausalLM" in reason
    register_model_class("MllamaForCausalLM", "MllamaForCausalLM")
    try:
        assert non_causal_reason(config) is None
    finally:
        unregister_model_class("MllamaForCausalLM")


def test_a_vision_language_checkpoint_whose_causal_lm_is_its_text_model_loads_as_that(tmp_path):
    from transformers import AutoModelForImageTextToText

    from relm.models.registry import loads_text_model, non_causal_reason

    config = tiny_config("qwen3_5")
    assert loads_text_model(config) and non_causal_reason(config) is None
    gemma3 = tiny_config("gemma3")  # its causal-LM class is the whole vision-language model
    assert not loads_text_model(gemma3) and "vision-language" in (non_causal_reason(gemma3) or "")
    config.architectures = ["Qwen3_5ForConditionalGeneration"]  # as the published checkpoints name it
    torch.manual_seed(0)
    full = AutoModelForImageTextToText.from_config(config).eval()
    full.save_pretrained(tmp_path)
    text, info = AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert type(text).__name__ == "Qwen3_5ForCausalLM" and not info["missing_keys"]
    ids = torch.tensor([PROMPTS[0] + PROMPTS[2]])
    with torch.no_grad():
        torch.testing.assert_close(text.eval()(input_ids=ids).logits, full(input_ids=ids).logits)


def test_relm_says_it_trains_a_vision_language_checkpoints_text_model_once(tmp_path, caplog):
    from transformers import AutoModelForImageTextToText

    from relm.models.loading import load_causal_lm

    config = tiny_config("qwen3_5")
    config.architectures = ["Qwen3_5ForConditionalGeneration"]
    AutoModelForImageTextToText.from_config(config).save_pretrained(tmp_path)
    with caplog.at_level("WARNING", logger="relm.models.loading"):
        for _ in range(2):  # the actor and its reference: one line
            model = load_causal_lm(str(tmp_path), dtype=torch.float32, device="cpu")
    assert type(model).__name__ == "Qwen3_5ForCausalLM"
    said = [r.getMessage() for r in caplog.records if "vision-language checkpoint" in r.getMessage()]
    assert len(said) == 1 and "relm trains its language model, text only" in said[0]


def test_a_speculative_decoding_draft_model_is_refused_in_one_line():
    from relm.models.registry import non_causal_reason
    from relm.models.tiny_types import default_config

    reason = non_causal_reason(default_config("gemma4_assistant"))
    assert reason is not None and reason.startswith("is a speculative-decoding draft model")
    assert non_causal_reason(tiny_config("gemma4_text")) is None


def test_a_model_that_trains_only_on_fixed_lengths_is_refused_in_one_line():
    from relm.models.registry import non_causal_reason
    from relm.models.tiny_types import default_config

    reason = non_causal_reason(default_config("reformer"))  # axial_pos_shape [64, 64], chunks of 64
    assert reason is not None and reason.startswith("trains only on sequences of exactly 4,096 tokens")
    assert "multiples of 64" in reason and "\n" not in reason
    config = tiny_config("reformer")
    config.axial_pos_embds = False  # plain position embeddings: the chunk length alone still binds
    assert non_causal_reason(config) == (
        "trains only on sequence lengths that are multiples of 16 (its chunked attention refuses others in "
        "training); relm trains batches padded to their longest sequence"
    )
