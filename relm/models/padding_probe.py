"""Whether a model reads the attention mask: measured once per model by a forward with and without left pads.

relm left-pads prompts to their batch's width, and an attention model masks those pads out. A model whose
forward takes `attention_mask` and leaves it unused (RWKV's) reads the pads as tokens: they enter its
recurrent state before the prompt, and its logits then depend on how wide the batch was, so the engine's
batches and the trainer's (padded to other widths) disagree. Such a model is run with every row's real
tokens first (`relm.rollout.padding.shift_left`), where a causal model never reads the pads that follow;
packing several rows into one sequence is no use to it either (it reads the rows before as context).

There is no attribute that says so (RWKV's config and forward look like Mamba's, which does read the
mask), so it is measured: a capability of the model, not a list of type names.

It is measured where the model is loaded (`relm.models.loading.load_causal_lm`; for models built on the meta
device, on the engine's whole copy once it is filled, `relm.trainer.components`) and the answer is kept on the
model, so copies (the reference, the engine's copy) carry it. The trainer's and the engines' forwards only
read it: a training or generation step never runs a forward of the probe's, so the forwards a step makes are
the step's own.
"""

from __future__ import annotations

import inspect
import logging

import torch
from torch import nn

logger = logging.getLogger(__name__)

_ANSWER = "_relm_reads_padding_mask"
"""The model attribute that keeps the probe's answer: a plain attribute, so `copy.deepcopy` (the
reference, the engine's copy in another dtype), LoRA adapters and FSDP2 sharding (both in place) keep it."""

NUM_PROBE_PADS = 3
"""Left pad tokens the probe puts before its 8 real ones."""


@torch.no_grad()
def left_padding_gap(model: nn.Module) -> float | None:
    """How far `NUM_PROBE_PADS` left pads under the attention mask move `model`'s outputs (positions counted
    from the first real token, as relm counts them), when that is more than rounding, else None.

    The output compared is the logits of a causal LM, or the last hidden state of a base model or of a
    critic's backbone (`ValueModel`).
    Runs in eval mode (no dropout) and restores the model's mode.
    """
    holder = getattr(model, "backbone", model)
    embeddings = holder.get_input_embeddings()  # type: ignore[operator]  # nn.Module hides the HF model's API
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
        alone = _outputs(model, input_ids=ids, attention_mask=torch.ones_like(ids), **alone_kwargs)[0].float()
        shifted = _outputs(model, input_ids=padded, attention_mask=mask, **padded_kwargs)
    finally:
        model.train(was_training)
    gap = float((alone - shifted[0, NUM_PROBE_PADS:].float()).abs().max())
    # fp32 rounds at ~1e-6 of the logits; bf16/fp16 at ~1e-2 (a false alarm only costs speed: running a
    # model that reads the mask with its rows left-aligned gives the same numbers).
    relative = 1e-3 if embeddings.weight.dtype == torch.float32 else 5e-2
    return gap if gap > relative * max(1.0, float(alone.abs().max())) else None


def probe_padding_mask(model: nn.Module) -> bool:
    """Measure whether `model` reads the attention mask (`left_padding_gap`) and keep the answer on it.

    Called where a model is loaded, before any step: two forwards of 8 and 11 tokens. A model the probe
    cannot run (no input embeddings, a forward that wants more than ids) counts as reading the mask: relm
    treats it as before. A model that does not read it is said in one warning line.
    """
    try:
        gap = left_padding_gap(model)
    except Exception:  # noqa: BLE001 - a forward the probe cannot drive: keep the padded path as it was
        gap = None
    record_padding_answer(model, gap is None)
    if gap is not None:
        logger.warning(
            "%s does not read the attention mask (%d left pad tokens move its outputs by %.3g): relm runs "
            "its rows with the real tokens first and the pads after them, generates prompts of equal "
            "length together, and does not pack its rows",
            type(model).__name__, NUM_PROBE_PADS, gap,
        )  # fmt: skip
    return gap is None


def reads_padding_mask(model: nn.Module) -> bool:
    """Whether `model` reads the attention mask, as `probe_padding_mask` found when it was loaded.

    Only reads the kept answer, never runs a forward. A model never probed (one built directly rather
    than through `load_causal_lm`, as unit tests build theirs) counts as reading it, as every attention
    model does.
    """
    known = padding_answer(model)
    return True if known is None else known


def padding_answer(model: nn.Module) -> bool | None:
    """The answer kept on `model` (wrappers that forward attribute reads, such as PEFT's, included), or
    None where it was never probed."""
    known = getattr(model, _ANSWER, None)
    return known if isinstance(known, bool) else None


def record_padding_answer(model: nn.Module, reads_mask: bool) -> None:
    """Keep `reads_mask` on `model`: for a module built around a probed one (the critic around its causal
    LM's backbone), whose answer is the same architecture's."""
    setattr(model, _ANSWER, reads_mask)


def _outputs(model: nn.Module, **inputs: torch.Tensor) -> torch.Tensor:
    """`model`'s logits or last hidden state for `inputs`; for a critic, its backbone's hidden states, caught
    on their way to the value head (a fresh head is zero and would hide them), through the critic's own
    forward (a sharded critic gathers its backbone's weights there)."""
    backbone = getattr(model, "backbone", None)
    if not isinstance(backbone, nn.Module):
        return _first_output(model(**inputs))
    seen: list[torch.Tensor] = []
    handle = backbone.register_forward_hook(lambda _module, _args, output: seen.append(_first_output(output)))
    try:
        model(**inputs)
    finally:
        handle.remove()
    return seen[-1]


def _first_output(output: object) -> torch.Tensor:
    """The logits of a causal LM's output, the last hidden state of a base model's, or the tensor itself."""
    for name in ("logits", "last_hidden_state"):
        value = getattr(output, name, None)
        if isinstance(value, torch.Tensor):
            return value
    if isinstance(output, torch.Tensor):
        return output
    return output[0]  # type: ignore[index]  # a tuple output
