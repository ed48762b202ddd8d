"""Discriminative reward models: a frozen model reads a prompt and its response and returns one number.

Two kinds of folder serve as one: a sequence-classification model (`...ForSequenceClassification`, one
label: the usual published reward models) and a critic exported by `relm export --critic` (a causal
LM's backbone plus `value_head.safetensors`), whose value at the response's last token is the score.
The model never trains: it is loaded once, in eval mode with gradients off, and on a GPU it waits in
pinned CPU memory between scoring calls (`relm.memory.offload.ParkedModel`), since it is used for one
forward a step.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForSequenceClassification, PreTrainedTokenizerBase

from relm.config.remote_code import REWARD_MODEL_KEY
from relm.errors import UserError
from relm.memory.offload import ParkedModel
from relm.models.loading import require_trusted_code, resolve_model_dir
from relm.models.value_model import VALUE_HEAD_FILE, load_value_model

DEFAULT_MICRO_BATCH = 16
"""Responses per reward-model forward when `reward_model.micro_batch_size_per_gpu` is unset."""


@dataclass
class ScoringInputs:
    """N responses, in the forms a reward model may read them."""

    sequences: list[list[int]]
    """N policy token ids, prompt then response, without padding."""
    messages: list[list[dict[str, Any]]]
    """N chat message lists of the prompts (empty lists when the data kept none)."""
    response_texts: list[str]
    """N responses decoded by the policy's tokenizer, special tokens skipped."""
    ground_truths: list[Any]
    """N ground truths of the prompts' rows."""


@dataclass
class ModelScores:
    """A reward model's verdict on N responses."""

    scores: torch.Tensor
    """[N] float32."""
    extra: dict[str, torch.Tensor] = field(default_factory=dict)
    """Per-response numbers to log beside the score (name -> [N] float32)."""


def render_conversation(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]], response: str
) -> list[int]:
    """Token ids of the prompt's messages plus the response as the assistant's turn, in `tokenizer`'s template.

    This is how verl re-renders a policy's text for a reward model with another tokenizer: the whole
    conversation through the reward model's chat template (its own end-of-turn included). Without a
    template the contents are joined by newlines.
    """
    conversation = [*messages, {"role": "assistant", "content": response}]
    if tokenizer.chat_template:
        ids = tokenizer.apply_chat_template(conversation, tokenize=True, return_dict=False)
        if isinstance(ids, Mapping):  # a BatchEncoding where a transformers version ignores return_dict
            ids = ids["input_ids"]
        return [int(i) for i in ids]  # type: ignore[arg-type]  # token ids here, whatever transformers types it
    text = "\n".join(str(message["content"]) for message in conversation)
    return list(tokenizer.encode(text, add_special_tokens=True))


def reward_model_kind(folder: str, shown: str | None = None) -> str:
    """`value_head` for a relm-exported critic, `sequence_classification` for an HF classifier.

    `shown` is the path as the user wrote it (a `zoo:` name or Hub id), for the message.

    Raises:
        UserError: The folder is neither.
    """
    if (Path(folder) / VALUE_HEAD_FILE).is_file():
        return "value_head"
    architectures = (
        json.loads((Path(folder) / "config.json").read_text(encoding="utf-8")).get("architectures") or []
    )
    if any(name.endswith("ForSequenceClassification") for name in architectures):
        return "sequence_classification"
    raise UserError(
        f"`reward_model.model.path={shown or folder}` is neither a sequence-classification model (its architectures are "
        f"{architectures or 'not named'}) nor a critic exported by `relm export --critic` ({VALUE_HEAD_FILE}); "
        "for an LLM judge set `reward_model.judge.prompt_template`"
    )


class DiscriminativeRewardModel:
    """A frozen scorer over token ids: [prompt + response] -> one number per response.

    Args:
        module: A sequence-classification model (one label) or a `ValueModel`.
        kind: `sequence_classification` or `value_head` (`reward_model_kind`).
        tokenizer: The reward model's tokenizer (its pad id pads the micro-batches).
        device: Where it computes.
        micro_batch_size: Responses per forward.
        max_length: Longest input in tokens; a longer one keeps its end (where the response is).
        rerender: Re-render prompt and response in the reward model's chat template instead of reading
            the policy's token ids (`reward_model.model.input_tokenizer` is set).
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        kind: str,
        tokenizer: PreTrainedTokenizerBase,
        device: torch.device,
        micro_batch_size: int = DEFAULT_MICRO_BATCH,
        max_length: int | None = None,
        rerender: bool = False,
    ) -> None:
        self.module = module.requires_grad_(False).eval()
        self.kind = kind
        self.tokenizer = tokenizer
        self.device = device
        self.micro_batch_size = micro_batch_size
        self.max_length = max_length
        self.rerender = rerender
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_token_id = int(pad if pad is not None else 0)
        self.parked = ParkedModel(module, device) if device.type == "cuda" else None
        if self.parked is not None:
            self.parked.park()

    def inputs_of(self, batch: ScoringInputs) -> list[list[int]]:
        """The token ids the model reads for each response, cut to `max_length` from the left."""
        if self.rerender:
            sequences = [
                render_conversation(self.tokenizer, messages, text)
                for messages, text in zip(batch.messages, batch.response_texts, strict=True)
            ]
        else:
            sequences = batch.sequences
        if self.max_length is not None:
            sequences = [ids[-self.max_length :] for ids in sequences]
        return sequences

    @torch.no_grad()
    def score(self, batch: ScoringInputs) -> ModelScores:
        """Score N responses in micro-batches; the model is on the device only while it does."""
        sequences = self.inputs_of(batch)
        if self.parked is not None:
            self.parked.unpark()
        try:
            parts = [
                self._forward(sequences[start : start + self.micro_batch_size])
                for start in range(0, len(sequences), self.micro_batch_size)
            ]
        finally:
            if self.parked is not None:
                self.parked.park()
        scores = torch.cat(parts) if parts else torch.zeros(0)
        return ModelScores(scores=scores.float().cpu())

    def _forward(self, sequences: list[list[int]]) -> torch.Tensor:
        """[M] scores of M unpadded sequences, right-padded into one forward."""
        lengths = torch.tensor([len(ids) for ids in sequences])  # [M]
        width = int(lengths.max())
        input_ids = torch.full((len(sequences), width), self.pad_token_id, dtype=torch.long)  # [M, T]
        for row, ids in enumerate(sequences):
            input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask = (torch.arange(width) < lengths[:, None]).long()  # [M, T]
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        last = (lengths - 1).to(self.device)  # [M]
        rows = torch.arange(len(sequences), device=self.device)
        if self.kind == "value_head":
            positions = torch.arange(width, device=self.device).expand(len(sequences), width)
            values = self.module(input_ids, attention_mask, positions)  # [M, T]
            return values[rows, last].float()
        # HF's own pooling looks for the last non-pad id, which misreads a sequence that ends in the pad
        # id (pad = eos is common); the per-token logits are taken at the known last position instead.
        hidden = self.module.base_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # type: ignore[operator]  # nn.Module hides the HF model's API
        logits = classifier_head(self.module)(hidden[rows, last])  # [M, labels]
        return logits[:, 0].float()


def classifier_head(model: nn.Module) -> nn.Module:
    """The layer a sequence-classification model applies to hidden states (`score` in Llama/Qwen2, `classifier`)."""
    for name in ("score", "classifier"):
        head = getattr(model, name, None)
        if isinstance(head, nn.Module):
            return head
    raise UserError(
        f"{type(model).__name__} has no `score` or `classifier` layer; relm reads a reward model's logit from one"
    )


def load_discriminative_reward_model(
    path: str,
    *,
    tokenizer: PreTrainedTokenizerBase,
    device: torch.device,
    dtype: torch.dtype,
    micro_batch_size: int | None,
    max_length: int | None,
    rerender: bool,
    trust_remote_code: bool = False,
) -> DiscriminativeRewardModel:
    """Load `path` (a classifier or an exported critic) frozen on `device`, waiting parked on a GPU."""
    folder = resolve_model_dir(path)
    require_trusted_code(folder, path, trust_remote_code, REWARD_MODEL_KEY)
    kind = reward_model_kind(folder, path)
    if kind == "value_head":
        module: nn.Module = load_value_model(
            folder,
            dtype=dtype,
            device=device,
            trust_remote_code=trust_remote_code,
            trust_key=REWARD_MODEL_KEY,
        )
    else:
        module = AutoModelForSequenceClassification.from_pretrained(
            folder, dtype=dtype, trust_remote_code=trust_remote_code
        ).to(device)
        num_labels = module.config.num_labels  # type: ignore[union-attr]  # nn.Module hides the HF model's API
        if num_labels != 1:
            raise UserError(
                f"`reward_model.model.path={path}` classifies into {num_labels} labels; a reward "
                "model has one (`num_labels=1`): its logit is the score"
            )
        classifier_head(module)
    return DiscriminativeRewardModel(
        module,
        kind=kind,
        tokenizer=tokenizer,
        device=device,
        micro_batch_size=micro_batch_size or DEFAULT_MICRO_BATCH,
        max_length=max_length,
        rerender=rerender,
    )
