"""What the rollout engine receives after each actor update, and the check that it arrived.

Full fine-tuning sends every parameter by name. A LoRA actor sends only what its adapters change, and
then checks that the engine took it: an adapter that never reaches the engine is the failure LoRA users
of other frameworks meet most (the engine keeps sampling the initial policy while training "runs"), and
here it ends the run at the first sync instead.

- An engine that generates with the actor module itself (CPU, fp32) computes the adapters in its
  forward and needs nothing.
- An engine with its own plain copy (native or hf, bf16 on a GPU) gets the adapted weights merged
  (`W + scaling * B @ A`), and one of them is read back from the copy.
- vLLM gets the adapter itself through its LoRA support (`relm.rollout.vllm_lora`), or, for adapters
  its LoRA refuses (on the embedding or the output head), every weight with the adapters merged in. Its
  weights are out of reach, so the check is what it computes: after each sync it scores a fixed sequence,
  which must match the actor's logprobs and must have moved if the actor's moved.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from relm.learner.lora import (
    ADAPTER,
    AdapterNotSynced,
    check_synced,
    has_lora,
    lora_layers,
    merged_weights,
    probe_name,
)
from relm.rollout.base import logprob_tolerance
from relm.rollout.vllm_lora import VLLMLora, unserved_modules

logger = logging.getLogger("relm")

Probe = Callable[[], tuple[torch.Tensor, torch.Tensor]]
"""Logprobs of one fixed sequence under the engine and under the actor (`VLLMRolloutEngine.probe`)."""


@dataclass
class LogprobCheck:
    """Whether an engine whose weights are out of reach took the sync, from what it computes.

    After a good sync the engine's logprobs of a fixed sequence match the actor's within the engine
    dtype's tolerance. A sync that did not arrive leaves them bit for bit as they were, which is caught
    as soon as the actor's have moved by more than a tenth of the mean tolerance since the engine last
    changed (fp32: 2e-5, far above the 1e-6 kernel noise; bf16: 5e-3), before the gap itself grows
    past the tolerance.
    """

    probe: Probe
    dtype: torch.dtype
    """The engine's compute dtype (picks the tolerance)."""
    engine_then: torch.Tensor = field(init=False)
    actor_then: torch.Tensor = field(init=False)
    """The two at the last sync that changed the engine's logprobs (at first: when the check was built)."""

    def __post_init__(self) -> None:
        self.engine_then, self.actor_then = self.probe()

    def __call__(self) -> float:
        """Raise `AdapterNotSynced` unless the engine computes the actor's policy; return the max gap."""
        engine, actor = self.probe()
        max_allowed, mean_allowed = logprob_tolerance(self.dtype)
        moved = (actor - self.actor_then).abs().max().item()
        if torch.equal(engine, self.engine_then) and moved > mean_allowed / 10:
            raise AdapterNotSynced(
                f"the rollout engine's logprobs did not change in the weight sync while the actor's moved by "
                f"{moved:.3g}: the adapter did not reach the engine, which would keep sampling the old policy"
            )
        gap = (engine - actor).abs().max().item()
        if gap > max_allowed:
            raise AdapterNotSynced(
                f"the rollout engine's logprobs are {gap:.3g} from the actor's after the weight sync (allowed "
                f"{max_allowed:g}): the adapter did not reach the engine whole; it would sample another policy "
                "than the one trained, not the old policy's update"
            )
        if not torch.equal(engine, self.engine_then):
            self.engine_then, self.actor_then = engine, actor
        return gap


@dataclass
class WeightSync:
    """The actor's side of `RolloutEngine.sync_weights`."""

    actor: nn.Module
    engine_model: nn.Module | None
    """The module the engine generates with (the actor itself, or its separate copy: bf16 on a GPU); None
    when the engine keeps its weights out of reach (vLLM)."""
    vllm: VLLMLora | None = None
    """A LoRA actor's weights as the vLLM engine takes them (`vllm_lora`)."""
    check: LogprobCheck | None = None
    """The check of an engine whose weights are out of reach (vLLM with a LoRA actor)."""

    @property
    def lora(self) -> bool:
        return has_lora(self.actor)

    @property
    def colocated(self) -> bool:
        """The engine generates with the actor module itself (adapters run in its forward)."""
        return self.engine_model is self.actor

    def tensors(self) -> Iterable[tuple[str, torch.Tensor]]:
        """Named tensors for `sync_weights`: every parameter, or what a LoRA actor's engine takes."""
        if not self.lora:
            return self.actor.named_parameters()
        if self.colocated:
            return ()
        if self.vllm is not None:
            return self.vllm.adapter() if self.vllm.adapter is not None else self.vllm.weights()
        return merged_weights(self.actor)

    def verify(self) -> None:
        """Raise `AdapterNotSynced` if a LoRA actor's separate engine missed the sync."""
        if not self.lora or self.colocated:
            return
        if self.check is not None:
            self.check()
            return
        name = probe_name(self.actor)
        if self.engine_model is not None and name is not None:
            check_synced(self.actor, self.engine_model, name)


def vllm_lora(actor: nn.Module) -> VLLMLora | None:
    """How a LoRA actor's weights reach the vLLM engine (None for a fully trained actor).

    vLLM serves the adapter when every adapted layer is a linear layer of the decoder; otherwise each
    sync sends every weight with the adapters merged in, said once in the log.
    """
    if not has_lora(actor):
        return None
    adapted = [name for name, _ in lora_layers(actor)]
    refused = unserved_modules(actor, adapted)
    config: Any = actor.peft_config[ADAPTER]  # type: ignore[index]  # a peft LoraConfig, set by transformers' add_adapter
    tied = bool(getattr(actor.config.get_text_config(), "tie_word_embeddings", False))  # type: ignore[union-attr,operator]  # nn.Module hides the HF model's API
    if not refused:
        return VLLMLora(
            weights=lambda: plain_weights(actor, merged=False),
            adapter=lambda: adapter_tensors(actor),
            adapter_config=config,
            rank=int(config.r),
        )
    logger.warning(
        "vLLM's LoRA takes adapters on the decoder's linear layers only, not on %s: each weight sync sends "
        "every weight with the adapters merged in (as in full fine-tuning) instead of the adapter",
        ", ".join(f"`{name}`" for name in refused),
    )
    return VLLMLora(
        weights=lambda: plain_weights(actor, merged=True, untied=tied),
        adapter=None,
        untie_lm_head=tied,
    )


def plain_weights(
    actor: nn.Module, *, merged: bool, untied: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """A LoRA actor's weights under the plain model's names, in module order (layer by layer).

    Args:
        actor: a model with PEFT LoRA layers.
        merged: adapted layers give `W + scaling * B @ A` (fp32) instead of their frozen base `W`.
        untied: also give a tied output head under its own name (`lm_head.weight`): the engine holds it
            apart from the embedding because one of the two is adapted.
    """
    adapted = merged_weights(actor) if merged else None
    seen: set[int] = set()
    for name, param in actor.named_parameters(remove_duplicate=False):
        if ".lora_" in name:
            continue
        plain = name.replace(".base_layer.", ".")
        if adapted is not None and name.endswith(".base_layer.weight"):
            merged_name, tensor = next(adapted)
            assert merged_name == plain, (merged_name, plain)  # both walk the modules in order
            yield plain, tensor
        elif id(param) not in seen or untied:
            yield plain, param
        seen.add(id(param))


def adapter_tensors(actor: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The adapter's tensors under the names PEFT saves them with (what `save_pretrained` writes)."""
    from peft import get_peft_model_state_dict

    for name, tensor in get_peft_model_state_dict(actor, adapter_name=ADAPTER).items():
        yield f"base_model.model.{name}", tensor
