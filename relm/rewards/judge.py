"""An LLM as judge: a second frozen causal LM reads a prompt built from the user's template and its
verdict's text is parsed into a score.

verl 0.9 serves such a "generative reward model" from its rollout servers and leaves the prompt and the
parsing to a custom reward function; relm runs the judge on its own engine (native or HF) in the
training process, and takes the template and the parser from config (`reward_model.judge.*`). A verdict
the pattern does not match scores `default_score` and is counted (`reward_extra/judge_parsed/mean`
is the share that did parse), so a judge that drifts off format shows in the metrics instead of as a
silently flat reward.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from relm.errors import UserError
from relm.memory.offload import ParkedModel
from relm.models.tokenizer import encode_prompt
from relm.rewards.reward_model import ModelScores, ScoringInputs
from relm.rollout.base import RolloutEngine, SamplingParams

logger = logging.getLogger("relm")

TEMPLATE_FIELDS = ("prompt", "response", "ground_truth")
"""Names a judge template may use in braces."""


def load_template(text: str | None, path: str | None) -> str:
    """The judge template from `reward_model.judge.prompt_template` or the file `prompt_template_path`.

    Raises:
        UserError: unreadable file, or a template with a field other than `TEMPLATE_FIELDS` (or none of them).
    """
    key = "reward_model.judge.prompt_template"
    if path is not None:
        key = "reward_model.judge.prompt_template_path"
        try:
            text = Path(path).expanduser().read_text(encoding="utf-8")
        except OSError as exc:
            raise UserError(f"`{key}={path}` cannot be read: {exc.strerror or exc}") from exc
    if not text:
        raise UserError(f"`{key}` is empty; write the judge prompt with a `{{response}}` field")
    try:
        text.format(**dict.fromkeys(TEMPLATE_FIELDS, ""))
    except (KeyError, IndexError, ValueError) as exc:
        raise UserError(
            f"`{key}`: the template's field {exc} is not one of {{prompt}}, {{response}}, {{ground_truth}} "
            "(write a literal brace as `{{` or `}}`)"
        ) from exc
    if "{response}" not in text:
        raise UserError(f"`{key}` has no `{{response}}` field: the judge would never see the response")
    return text


def parse_score(text: str, pattern: re.Pattern[str]) -> float | None:
    """The number in the pattern's last match (its first group when it has one), or None."""
    matches = list(pattern.finditer(text))
    if not matches:
        return None
    found = matches[-1].group(1) if pattern.groups else matches[-1].group(0)
    try:
        value = float(found)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def last_user_content(messages: list[dict[str, Any]]) -> str:
    """What the judge is shown as `{prompt}`: the last user message (the whole chat has no template slot)."""
    contents = [str(m.get("content", "")) for m in messages if m.get("role") == "user"]
    return contents[-1] if contents else ""


@dataclass
class JudgeSettings:
    """How verdicts are asked for and read."""

    template: str
    pattern: re.Pattern[str]
    default_score: float
    sampling: SamplingParams
    prompt_length: int
    micro_batch_size: int


class JudgeRewardModel:
    """Scores responses with the verdicts of a frozen causal LM on `engine`.

    Args:
        engine: Generates with the judge's weights (relm's native or HF engine).
        tokenizer: The judge's tokenizer; its chat template wraps the filled-in prompt.
        settings: Template, parser and sampling.
        parked: The judge's weights, parked between calls on a GPU (None on a CPU).
    """

    def __init__(
        self,
        engine: RolloutEngine,
        tokenizer: PreTrainedTokenizerBase,
        settings: JudgeSettings,
        parked: ParkedModel | None = None,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.settings = settings
        self.parked = parked
        if parked is not None:
            parked.park()

    def prompts_of(self, batch: ScoringInputs) -> list[list[int]]:
        """The judge's prompt ids per response, cut to `prompt_length` from the left."""
        prompts = []
        for messages, text, truth in zip(
            batch.messages, batch.response_texts, batch.ground_truths, strict=True
        ):
            filled = self.settings.template.format(
                prompt=last_user_content(messages), response=text, ground_truth="" if truth is None else truth
            )
            ids = encode_prompt(self.tokenizer, [{"role": "user", "content": filled}])
            prompts.append(ids[-self.settings.prompt_length :])
        return prompts

    @torch.no_grad()
    def score(self, batch: ScoringInputs) -> ModelScores:
        """Generate one verdict per response and parse it; unparsed verdicts score `default_score`."""
        prompts = self.prompts_of(batch)
        if self.parked is not None:
            self.parked.unpark()
        try:
            verdicts: list[str] = []
            size = self.settings.micro_batch_size
            for start in range(0, len(prompts), size):
                out = self.engine.generate(prompts[start : start + size], self.settings.sampling)
                ids = [
                    row[mask.bool()].tolist()
                    for row, mask in zip(out.response_ids, out.response_mask, strict=True)
                ]
                verdicts += self.tokenizer.batch_decode(ids, skip_special_tokens=True)
        finally:
            self.engine.release_memory()
            if self.parked is not None:
                self.parked.park()
        parsed = [parse_score(text, self.settings.pattern) for text in verdicts]
        if verdicts:
            logger.debug("judge verdict on response 0: %r -> %s", verdicts[0], parsed[0])
        scores = torch.tensor(
            [self.settings.default_score if p is None else p for p in parsed], dtype=torch.float32
        )
        was_parsed = torch.tensor([p is not None for p in parsed], dtype=torch.float32)
        return ModelScores(scores=scores, extra={"judge_parsed": was_parsed})
