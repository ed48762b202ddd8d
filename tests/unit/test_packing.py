"""Packed (remove-padding) forward equals the padded forward, for every tiny zoo architecture."""

from __future__ import annotations

import pytest
import torch

from relm.learner.forward import response_logprobs, response_values
from relm.learner.packing import pack
from relm.learner.varlen_attention import VARLEN_ATTENTION, register_varlen_attention
from relm.models.loading import load_causal_lm, resolve_model_dir
from relm.models.value_model import ValueModel
from relm.models.zoo import ZOO

TINY = sorted(name for name in ZOO if name.startswith("tiny/") and name != "tiny/starling")
# tiny/starling is tiny/mistral under an unregistered architecture name; the registry test covers it.


def padded_batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """3 rows: prompts of 5, 2 and 7 tokens (left-padded to 7); responses of 4, 6 and 1 (right-padded to 6)."""
    g = torch.Generator().manual_seed(0)
    prompt_lens, response_lens, p, r = [5, 2, 7], [4, 6, 1], 7, 6
    ids = torch.zeros(3, p + r, dtype=torch.long)
    mask = torch.zeros(3, p + r, dtype=torch.long)
    for i, (pl, rl) in enumerate(zip(prompt_lens, response_lens, strict=True)):
        ids[i, p - pl : p + rl] = torch.randint(5, vocab, (pl + rl,), generator=g)
        mask[i, p - pl : p + rl] = 1
    return ids, mask, r


def test_pack_layout_by_hand():
    # row 0: prompt [7, 8] response [9]; row 1: prompt [5] response [6, 4]; P = 2, R = 2
    ids = torch.tensor([[7, 8, 9, 0], [0, 5, 6, 4]])
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1]])
    layout = pack(ids, mask, response_width=2)
    assert layout.input_ids.tolist() == [[7, 8, 9, 5, 6, 4]]
    assert layout.position_ids.tolist() == [[0, 1, 2, 0, 1, 2]]
    # token 9 is predicted by packed column 1 (the 8); 6 by column 3 (the 5), 4 by column 4 (the 6)
    assert layout.predict_index.tolist() == [1, 3, 4]
    assert layout.targets.tolist() == [9, 6, 4]
    assert layout.scatter_index.tolist() == [0, 2, 3]  # row * R + t
    assert layout.cu_seq_lens.tolist() == [0, 3, 6] and layout.max_length == 3


@pytest.mark.parametrize("name", TINY)
def test_packed_logprobs_entropy_and_values_equal_padded(name: str):
    model = load_causal_lm(resolve_model_dir(f"zoo:{name}"), dtype=torch.float32, device="cpu")
    ids, mask, r = padded_batch(model.config.get_text_config().vocab_size)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    response_mask = mask[:, -r:].bool()
    with torch.no_grad():
        padded = response_logprobs(model, ids, mask, positions, r, temperature=0.7, compute_entropy=True)
        packed = response_logprobs(
            model, ids, mask, positions, r, temperature=0.7, compute_entropy=True, remove_padding=True
        )
        critic = ValueModel(model)
        torch.nn.init.normal_(critic.value_head.weight, std=0.5)
        values_padded = response_values(critic, ids, mask, positions, r)
        values_packed = response_values(critic, ids, mask, positions, r, remove_padding=True)
        # the same packed forward with attention cut at the rows' boundaries instead of a dense mask
        register_varlen_attention()
        model.set_attn_implementation(VARLEN_ATTENTION)
        varlen = response_logprobs(
            model, ids, mask, positions, r, temperature=0.7, compute_entropy=True, remove_padding=True
        )
        values_varlen = response_values(critic, ids, mask, positions, r, remove_padding=True)
        # and a padded forward through that implementation falls back to the mask
        padded_varlen = response_logprobs(model, ids, mask, positions, r, temperature=0.7)
    pairs = [(padded[0], packed[0]), (padded[1], packed[1]), (values_padded, values_packed)]
    pairs += [(padded[0], varlen[0]), (padded[1], varlen[1]), (values_padded, values_varlen)]
    for a, b in pairs:
        torch.testing.assert_close(b[response_mask], a[response_mask], rtol=1e-4, atol=1e-5)
        assert (b[~response_mask] == 0).all()
    torch.testing.assert_close(
        padded_varlen[0][response_mask], padded[0][response_mask], rtol=1e-4, atol=1e-5
    )


def test_packed_gradients_equal_padded():
    model = load_causal_lm(resolve_model_dir("zoo:tiny/qwen2"), dtype=torch.float32, device="cpu")
    ids, mask, r = padded_batch(model.config.vocab_size)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    response_mask = mask[:, -r:].float()
    grads = []
    register_varlen_attention()
    for remove_padding, attention in ((False, "sdpa"), (True, "sdpa"), (True, VARLEN_ATTENTION)):
        model.set_attn_implementation(attention)
        model.zero_grad()
        logprobs, _ = response_logprobs(model, ids, mask, positions, r, remove_padding=remove_padding)
        (logprobs * response_mask).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(grads[2], grads[0], rtol=1e-4, atol=1e-6)
