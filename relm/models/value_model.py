"""The critic: a causal LM's transformer backbone with a scalar value head instead of the lm_head.

Built from the causal LM (not `AutoModel`) so the critic accepts exactly the models the actor does,
with the same checks, overrides and remote-code path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import PreTrainedModel

from relm.errors import UserError
from relm.models.loading import load_causal_lm, resolve_model_dir
from relm.models.padding_probe import padding_answer, record_padding_answer

VALUE_HEAD_FILE = "value_head.safetensors"


def _child_holding_embeddings(causal_lm: PreTrainedModel) -> nn.Module | None:
    """The one child that holds the input embeddings, for a model whose `base_model_prefix` names no
    child (Llama-4's text model: prefix `language_model`, child `model`)."""
    if not hasattr(causal_lm, "get_input_embeddings"):
        return None
    embeddings = causal_lm.get_input_embeddings()
    children = [
        child
        for child in causal_lm.children()
        if child is not causal_lm.get_output_embeddings() and any(m is embeddings for m in child.modules())
    ]
    return children[0] if len(children) == 1 else None


def _backbone_of(causal_lm: PreTrainedModel) -> nn.Module:
    """The module under the lm_head that returns `last_hidden_state` (`model` for Qwen2 and Llama)."""
    backbone: nn.Module | None = (
        causal_lm.base_model
    )  # getattr(self, base_model_prefix), or self if there is none
    if backbone is causal_lm and hasattr(causal_lm, "get_decoder"):
        backbone = causal_lm.get_decoder()
    if backbone is None or backbone is causal_lm:
        backbone = _child_holding_embeddings(causal_lm)
    if backbone is None or backbone is causal_lm:
        raise UserError(
            f"{type(causal_lm).__name__} exposes no backbone (base_model_prefix or get_decoder); "
            "it cannot serve as a critic"
        )
    return backbone


class ValueModel(nn.Module):
    """Backbone + `Linear(hidden_size, 1)`; `forward` gives one value per token.

    The head starts at zero (weight and bias), so every initial value is exactly 0. A random head
    on top of a pretrained backbone would instead start at values of arbitrary size (hidden-state
    norms of trained LMs vary by orders of magnitude between models and have outlier channels),
    and with value clipping the critic can need many steps just to undo that offset. The cost is
    that the backbone gets no gradient on the very first step (d value / d hidden = head weight =
    0); from the second step on both learn.
    """

    def __init__(self, causal_lm: PreTrainedModel) -> None:
        super().__init__()
        self.backbone = _backbone_of(causal_lm)
        self.config = causal_lm.config
        reference = next(self.backbone.parameters())
        # The text model's width (a multimodal wrapper's own config, Gemma-4's, names none).
        width = getattr(self.config.get_text_config(), "hidden_size", None)
        if not isinstance(width, int):
            width = int(causal_lm.get_input_embeddings().weight.shape[1])  # type: ignore[index]  # an embedding's weight
        self.value_head = nn.Linear(width, 1, device=reference.device, dtype=reference.dtype)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)
        # The lm_head is not a child of this module, so it is freed with the causal LM wrapper
        # (a tied lm_head shares the embedding, which the backbone keeps anyway).

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor,
        **attention_kwargs: Any,
    ) -> torch.Tensor:
        """[N, T] ids, mask, positions -> [N, T] float32 values (one per token, padding included).

        `attention_kwargs` (packed sequences' `cu_seq_lens_q`, ...) go to the backbone's attention.
        """
        hidden = self.backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
            **attention_kwargs,
        ).last_hidden_state  # [N, T, H]
        # fp32 head math: values are regression targets compared against returns in fp32, and a
        # bf16 dot product over H channels would add error of the order of the value differences.
        weight = self.value_head.weight.float()  # [1, H]
        bias = self.value_head.bias.float()  # [1]
        return nn.functional.linear(hidden.float(), weight, bias).squeeze(-1)  # [N, T]

    def gradient_checkpointing_enable(self, **kwargs: Any) -> None:
        """Recompute backbone activations in backward; kwargs go to the HF method."""
        kwargs.setdefault("gradient_checkpointing_kwargs", {"use_reentrant": False})
        self.backbone.gradient_checkpointing_enable(**kwargs)  # type: ignore[operator]  # nn.Module hides the HF model's API

    def save_pretrained(self, directory: str | Path) -> None:
        """Write the backbone as an HF folder plus `value_head.safetensors` beside it.

        `load_value_model` on that folder restores both (the causal-LM loader reads a backbone-only
        checkpoint; the missing lm_head is dropped again).
        """
        directory = Path(directory)
        self.backbone.save_pretrained(directory)  # type: ignore[operator]  # nn.Module hides the HF model's API
        head = {name: t.detach().contiguous().cpu() for name, t in self.value_head.state_dict().items()}
        save_file(head, str(directory / VALUE_HEAD_FILE))


def load_value_model(
    path: str,
    *,
    dtype: torch.dtype,
    device: torch.device | str,
    override_config: dict[str, Any] | None = None,
    trust_remote_code: bool = False,
    trust_key: str = "critic.model.trust_remote_code",
    seed: int = 0,
    empty: bool = False,
) -> ValueModel:
    """A `ValueModel` on `path`'s backbone; the head is read from `value_head.safetensors` if present.

    `empty`: parameters on the meta device, head included (`load_causal_lm`'s `empty`), nothing read.

    Raises:
        UserError: what `load_causal_lm` raises, or a value-head file of the wrong shape.
    """
    folder = resolve_model_dir(path)  # once, so a zoo model is materialized a single time
    causal_lm = load_causal_lm(
        folder,
        dtype=dtype,
        device=device,
        override_config=override_config,
        trust_remote_code=trust_remote_code,
        trust_key=trust_key,
        seed=seed,
        empty=empty,
    )
    model = ValueModel(causal_lm)
    known = padding_answer(causal_lm)  # its backbone's architecture: the same answer (None if empty)
    if known is not None:
        record_padding_answer(model, known)
    del causal_lm
    head_file = Path(folder) / VALUE_HEAD_FILE
    if head_file.is_file() and not empty:
        state = load_file(str(head_file))
        try:
            model.value_head.load_state_dict(state)
        except RuntimeError as exc:
            raise UserError(
                f"`{head_file}` does not fit hidden size {model.config.hidden_size}: {exc}"
            ) from exc
    return model
