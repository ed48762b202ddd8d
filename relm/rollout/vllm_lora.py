"""A LoRA actor's weights on the vLLM engine: the adapter through vLLM's LoRA support, or merged weights.

vLLM serves an adapter as a PEFT folder named by a `LoRARequest` (vLLM 0.32 has no in-memory adapter
request). Each sync writes the actor's adapter into a new folder under a new request id, adds it to the
engine and drops the previous one, so vLLM can never answer from an adapter it cached before; the
frozen base is loaded once (and again only after a sleep that dropped it).

What vLLM 0.32's LoRA takes was measured on its CPU build (docs/lora.md): adapters on the decoder's
linear layers (q/k/v, o, gate/up, down; it stacks q/k/v and gate/up itself), ranks 1, 8, 16, ..., 512.
It refuses adapters on `embed_tokens` and `lm_head` of Qwen2 ("expected target modules in {...} but
received ['lm_head']"). For those relm sends merged weights instead (every weight, as in full
fine-tuning), which is correct for any target at the cost of streaming the whole model each sync.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from relm.errors import UserError

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The `max_lora_rank` values vLLM 0.32 accepts (`vllm.config.lora.MaxLoRARanks`)."""


@dataclass(frozen=True)
class VLLMLora:
    """How a LoRA actor's weights reach the vLLM engine (built by `relm.learner.weight_sync.vllm_lora`)."""

    weights: Callable[[], Iterable[tuple[str, torch.Tensor]]]
    """Every weight under the plain model's names: the frozen base when vLLM serves the adapter, the base
    with the adapters merged in otherwise. Loaded when the engine starts and after a sleep."""
    adapter: Callable[[], Iterable[tuple[str, torch.Tensor]]] | None
    """The adapter's tensors under PEFT's saved names (`base_model.model....lora_A.weight`); None when
    vLLM cannot serve this adapter and every sync sends `weights()` merged."""
    adapter_config: Any = None
    """The adapter's `peft.LoraConfig` (written as adapter_config.json beside the tensors)."""
    rank: int = 0
    """The adapter's rank (vLLM's `max_lora_rank` is the allowed value at or above it)."""
    untie_lm_head: bool = False
    """The actor's output head is tied to its embedding but one of the two is adapted, so the merged
    weights differ: vLLM is built with its own LM head."""

    @property
    def served(self) -> bool:
        """vLLM applies the adapter itself (else it holds merged weights)."""
        return self.adapter is not None


def vllm_lora_rank(rank: int) -> int:
    """The smallest rank vLLM accepts as `max_lora_rank` that holds `rank`.

    Raises:
        UserError: past the largest.
    """
    allowed = next((allowed for allowed in VLLM_LORA_RANKS if allowed >= rank), None)
    if allowed is None:
        raise UserError(
            f"`actor_rollout_ref.model.lora_rank={rank}` is above the largest rank vLLM's LoRA serves "
            f"({VLLM_LORA_RANKS[-1]}); lower it, or use rollout.name=native"
        )
    return allowed


def unserved_modules(model: nn.Module, adapted: Iterable[str]) -> list[str]:
    """Adapted layers vLLM's LoRA would refuse: anything but a linear layer of the decoder.

    Args:
        model: the actor (its output head is found through `get_output_embeddings`).
        adapted: names of the layers that carry an adapter (PEFT LoRA layers).
    """
    head = model.get_output_embeddings()  # type: ignore[operator]  # nn.Module hides the HF model's API
    refused = []
    for name in adapted:
        layer: Any = model.get_submodule(name)
        base = layer.get_base_layer()
        if not isinstance(base, nn.Linear) or layer is head or base is head:
            refused.append(name)
    return refused


class AdapterFolders:
    """Numbered PEFT folders in a private temporary directory, one per sync; the previous is deleted."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="relm-vllm-lora-"))
        self.number = 0
        self.current: Path | None = None

    def write(self, tensors: Iterable[tuple[str, torch.Tensor]], config: Any) -> Path:
        """Write the adapter as PEFT saves it (adapter_model.safetensors, adapter_config.json)."""
        from safetensors.torch import save_file

        self.number += 1
        folder = self.root / f"adapter-{self.number}"
        folder.mkdir()
        save_file(
            {name: tensor.detach().to("cpu").contiguous() for name, tensor in tensors},
            str(folder / "adapter_model.safetensors"),
        )
        config.save_pretrained(str(folder))
        previous, self.current = self.current, folder
        if previous is not None:
            shutil.rmtree(previous, ignore_errors=True)
        return folder

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def replace_adapter(
    llm: Any, folders: AdapterFolders, tensors: Iterable[tuple[str, torch.Tensor]], config: Any, previous: Any
) -> Any:
    """Write the adapter as a PEFT folder and add it to `llm` under a new `LoRARequest`, which it returns;
    the `previous` request's adapter is removed (vLLM keeps one: `max_loras=1`).

    Raises:
        UserError: vLLM's LoRA refused the adapter (a layer it does not serve).
    """
    from vllm.lora.request import LoRARequest

    folder = folders.write(tensors, config)
    request = LoRARequest(
        lora_name=f"relm-{folders.number}", lora_int_id=folders.number, lora_path=str(folder)
    )
    engine = llm.llm_engine
    if previous is not None:
        engine.remove_lora(previous.lora_int_id)
    try:
        engine.add_lora(request)  # loaded now, so that a refused adapter fails the sync, not a rollout
    except ValueError as exc:
        raise UserError(
            f"`actor_rollout_ref.model.target_modules`: vLLM's LoRA refused the adapter "
            f"({' '.join(str(exc).split())[:200]}); adapt only linear layers of the decoder, or use "
            "rollout.name=native"
        ) from exc
    return request
