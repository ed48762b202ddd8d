"""`relm compat` on the tiny recurrent models, each stage on both engines: RWKV, whose forward does not
read the attention mask and whose batched decoding step mixes rows, trains with its rows left-aligned and
generates one row at a time, its rollout and trainer logprobs within the fp32 bounds; Mamba and xLSTM,
which read the mask, pass as before."""

from __future__ import annotations

import pytest

from relm.compat.checks import CompatOptions, check_model_guarded
from relm.models.char_tokenizer import build_char_tokenizer
from relm.models.tiny_types import tiny_config
from relm.rollout.base import logprob_tolerance

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("model_type", ["rwkv", "mamba", "xlstm"])
@pytest.mark.parametrize("engine", ["hf", "native"])
def test_recurrent_types_load_generate_and_train(model_type, engine, tmp_path):
    import torch

    tiny_config(model_type).save_pretrained(tmp_path)
    build_char_tokenizer().save_pretrained(tmp_path)
    report = check_model_guarded(str(tmp_path), CompatOptions(device="cpu", rollout=engine)).to_dict()
    stages = {stage["name"]: stage for stage in report["stages"]}
    assert report["status"] == "pass", (report["reason"], [s.get("error") for s in report["stages"]])
    assert [name for name in stages] == ["tokenizer", "load", "rollout", "update"]
    max_tolerance, mean_tolerance = logprob_tolerance(torch.float32)
    rollout = stages["rollout"]["metrics"]
    assert rollout["logprob_max_abs_diff"] <= max_tolerance
    assert rollout["logprob_mean_abs_diff"] <= mean_tolerance
    assert stages["update"]["metrics"]["actor/grad_norm"] > 0
