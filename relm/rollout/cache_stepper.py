"""One forward of a decoding loop with the model's own cache, and a check that a batch steps as its rows do.

The HF engine (`relm.rollout.hf_engine`) decodes through `CacheStepper`. Recurrent models carry their
state in code of their own rather than transformers' shared cache, and that code can mix the rows of a
batch: RWKV's single-token step (transformers 5.19) broadcasts a row's shift state [B, H] against the
hidden states [B, 1, H] into [B, B, H], so every row past the first reads the others' states. A batch
of one is right. `batched_steps_match` measures it per model, and the engine decodes such a model one
row at a time.
"""

from __future__ import annotations

import inspect
import logging
import weakref

import torch
from torch import nn
from transformers import DynamicCache

logger = logging.getLogger(__name__)


class CacheStepper:
    """One forward of a decoding loop, with the model's own cache carried from step to step.

    Attention models take a `DynamicCache` as `past_key_values` (built from the config, so hybrid
    linear-attention layers get their state layers); recurrent ones name their state otherwise:
    Mamba, Mamba-2, FalconMamba and xLSTM take `cache_params`, RWKV `state`, each returned by the
    forward for the next step. A model that takes none of these (GPT-1; XLM keeps a `cache` dict of its
    own), or whose config transformers' cache cannot read (BLT), runs over the whole sequence so far each
    step with `use_cache=False`, as the trainer's forward does. Position ids and
    `logits_to_keep` go only to a forward that takes them.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        parameters = inspect.signature(model.forward).parameters
        keys = ("past_key_values", "cache_params", "state")
        self.cache_key = next((key for key in keys if key in parameters), None)
        self.recurrent = self.cache_key in ("cache_params", "state")
        self.takes_positions = "position_ids" in parameters
        self.takes_logits_to_keep = "logits_to_keep" in parameters
        self.takes_use_cache = "use_cache" in parameters
        self.cache: object = None
        if self.cache_key == "past_key_values":
            try:
                self.cache = DynamicCache(config=getattr(model, "config", None))
            except (AttributeError, KeyError, TypeError):
                # A config a cache cannot read a layer plan from (BLT's four sub-models have no
                # num_hidden_layers): run over the whole sequence so far each step, as without a cache.
                self.cache_key, self.recurrent = None, False
        self.seen: tuple[torch.Tensor, torch.Tensor] | None = None
        """Without a cache: the ids and positions fed so far."""
        self.own_cache = False
        """The model refused a DynamicCache and carries the cache it built (MiniMax)."""

    def __call__(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        logits_to_keep: int | None = None,
    ) -> torch.Tensor:
        """The last position's logits [N, V] for `input_ids` [N, Q] after what the cache holds."""
        kwargs: dict[str, object] = {}
        if self.cache_key is None:
            if self.seen is not None:
                input_ids = torch.cat([self.seen[0], input_ids], dim=1)
                position_ids = torch.cat([self.seen[1], position_ids], dim=1)
            self.seen = (input_ids, position_ids)
            if self.takes_use_cache:
                kwargs["use_cache"] = False  # it would otherwise build a cache of its own (BLT)
        else:
            kwargs |= {self.cache_key: self.cache, "use_cache": True}
        if self.takes_positions:
            kwargs["position_ids"] = position_ids
        if logits_to_keep is not None and self.takes_logits_to_keep:
            kwargs["logits_to_keep"] = logits_to_keep
        if self.recurrent:
            # A recurrent model's mask covers only the tokens it is given (the state holds the rest).
            attention_mask = attention_mask[:, -input_ids.shape[1] :]
        try:
            output = self.model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        except ValueError as exc:
            if self.own_cache or not isinstance(self.cache, DynamicCache) or "cache" not in str(exc):
                raise
            # A model that refuses a DynamicCache (MiniMax's own cache class) builds its own when given
            # none; the forward returns it for the next step.
            self.own_cache = True
            kwargs[str(self.cache_key)] = None
            output = self.model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        if self.recurrent or self.own_cache:
            self.cache = getattr(output, str(self.cache_key))  # the model's own state for the next step
        return output.logits[:, -1]


_STEPS_MATCH: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()
"""Model -> whether its batched cached steps give its rows' own logits (probed once per model)."""


@torch.no_grad()
def batched_steps_match(model: nn.Module) -> bool:
    """Whether a cached decoding step over a batch of two rows gives each row the logits it gets alone.

    Asked of recurrent models only (their state is their own code; attention models' keys and values go
    through transformers' shared cache): others, and a model the probe cannot run, count as matching.
    Runs in eval mode and restores the model's mode; the first mismatch is said in one warning line.
    """
    known = _STEPS_MATCH.get(model)
    if known is not None:
        return known
    gap = None
    if CacheStepper(model).recurrent:
        try:
            gap = _batched_step_gap(model)
        except Exception:  # noqa: BLE001 - a forward the probe cannot drive: decode as before
            gap = None
    _STEPS_MATCH[model] = gap is None
    if gap is not None:
        logger.warning(
            "%s's cached decoding step mixes the rows of a batch (a row's logits move by %.3g beside "
            "another row): the HF engine decodes it one row at a time",
            type(model).__name__, gap,
        )  # fmt: skip
    return gap is None


def _batched_step_gap(model: nn.Module) -> float | None:
    """Largest |batched - alone| logit of two rows' prefill-then-one-step, when more than rounding."""
    weight = model.get_input_embeddings().weight  # type: ignore[operator]  # nn.Module hides the HF model's API
    vocab, device = int(weight.shape[0]), weight.device
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(min(5, vocab - 1), vocab, (2, 5), generator=generator).to(device)
    was_training = model.training
    model.eval()
    try:
        batched = _prefill_and_step(model, ids)  # [2, V]
        alone = torch.cat([_prefill_and_step(model, ids[row : row + 1]) for row in range(2)])
    finally:
        model.train(was_training)
    gap = float((batched - alone).abs().max())
    relative = 1e-3 if weight.dtype == torch.float32 else 5e-2
    return gap if gap > relative * max(1.0, float(alone.abs().max())) else None


def _prefill_and_step(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """[B, V] fp32 logits after the first 4 of `ids` [B, 5] and then the fifth, through `CacheStepper`."""
    stepper = CacheStepper(model)
    mask = torch.ones_like(ids)
    positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
    stepper(ids[:, :4], mask[:, :4], positions[:, :4], logits_to_keep=1)
    return stepper(ids[:, 4:], mask, positions[:, 4:]).float()
