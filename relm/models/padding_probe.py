"""Whether a model reads the attention mask: measured once per model by a forward with and without left pads.

relm left-pads prompts to their batch's width, and an attention model masks those pads out. A model whose
forward takes `attention_mask` and leaves it unused (RWKV's) reads the pads as tokens: they enter its
recurrent state before the prompt, and its logits then depend on how wide the batch was, so the engine's
batches and the trainer's (padded to other widths) disagree. Such a model is run with every row's real
tokens first (`relm.rollout.padding.shift_left`), where a causal model never reads the pads that follow;
packing several rows into one sequence is no use to it either (it reads the rows before as context).

There is no attribute that says so (RWKV's config and forward look like Mamba's, which does read the
mask), so it is measured: a capability of the model, not a list of type names.
"""

from __future__ import annotations

import inspect
import logging
import weakref

import torch
from torch import nn

logger = logging.getLogger(__name__)

_READS_MASK: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()
"""Model -> whether it reads the mask, so each model is probed once (its architecture decides)."""

NUM_PROBE_PADS = 3
"""Left pad tokens the probe puts before its 8 real ones."""


@torch.no_grad()
def left_padding_gap(model: nn.Module) -> float | None:
    """How far `NUM_PROBE_PADS` left pads under the attention mask move `model`'s outputs (positions counted
    from the first real token, as relm counts them), when that is more than rounding, else None.

    The output compared is the logits of a causal LM, else the last hidden state (a critic's backbone).
    Runs in eval mode (no dropout) and restores the model's mode.
    """
    embeddings = model.get_input_embeddings()  # type: ignore[operator]  # nn.Module hides the HF model's API
    vocab = int(embeddings.weight.shape[0])
    device = embeddings.weight.device
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(min(5, vocab - 1), vocab, (1, 8), generator=generator).to(device)
    pads = torch.zeros(1, NUM_PROBE_PADS, dtype=ids.dtype, device=device)
    padded, mask = torch.cat([pads, ids], dim=1), torch.cat([pads, torch.ones_like(ids)], dim=1)
    takes_positions = "position_ids" in inspect.signature(model.forward).parameters
    alone_kwargs = {"position_ids": torch.arange(8, device=device)[None]} if takes_positions else {}
    padded_kwargs = {"position_ids": (mask.cumsum(dim=1) - 1).clamp(min=0)} if takes_positions else {}
    was_training = model.training
    model.eval()
    try:
        alone = _first_output(model(input_ids=ids, **alone_kwargs))[0].float()
        shifted = _first_output(model(input_ids=padded, attention_mask=mask, **padded_kwargs))
    finally:
        model.train(was_training)
    gap = float((alone - shifted[0, NUM_PROBE_PADS:].float()).abs().max())
    # fp32 rounds at ~1e-6 of the logits; bf16/fp16 at ~1e-2 (a false alarm only costs speed: running a
    # model that reads the mask with its rows left-aligned gives the same numbers).
    relative = 1e-3 if embeddings.weight.dtype == torch.float32 else 5e-2
    return gap if gap > relative * max(1.0, float(alone.abs().max())) else None


def reads_padding_mask(model: nn.Module) -> bool:
    """Whether left pads under the attention mask leave `model`'s outputs unchanged (probed on first ask).

    A model the probe cannot run (no input embeddings, a forward that wants more than ids) counts as
    reading the mask: relm treats it as before. The first answer for a model that does not read it is
    said in one warning line.
    """
    known = _READS_MASK.get(model)
    if known is not None:
        return known
    try:
        gap = left_padding_gap(model)
    except Exception:  # noqa: BLE001 - a forward the probe cannot drive: keep the padded path as it was
        gap = None
    _READS_MASK[model] = gap is None
    if gap is not None:
        logger.warning(
            "%s does not read the attention mask (%d left pad tokens move its outputs by %.3g): relm runs "
            "its rows with the real tokens first and the pads after them, generates prompts of equal "
            "length together, and does not pack its rows",
            type(model).__name__, NUM_PROBE_PADS, gap,
        )  # fmt: skip
    return gap is None


def _first_output(output: object) -> torch.Tensor:
    """The logits of a causal LM's output, the last hidden state of a base model's, or the tensor itself."""
    for name in ("logits", "last_hidden_state"):
        value = getattr(output, name, None)
        if isinstance(value, torch.Tensor):
            return value
    if isinstance(output, torch.Tensor):
        return output
    return output[0]  # type: ignore[index]  # a tuple output
