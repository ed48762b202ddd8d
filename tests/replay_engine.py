"""An engine that replays fixed turns: the token ids a model would sample, so a multi-turn test knows exactly
what was sampled (tests/unit/test_interactions.py, tests/unit/test_python_tool.py)."""

from __future__ import annotations

import torch

from relm.rollout.base import FINISH_STOP, GenerationOutput, SamplingParams


class ReplayEngine:
    """Answers call k with turn k of each row's script (ids ending in the template's turn end), and
    records the ids it was asked to continue."""

    def __init__(self, tok, turn_end: int, scripts: list[list[str]]) -> None:
        self.turns = [[tok.encode(t, add_special_tokens=False) + [turn_end] for t in s] for s in scripts]
        self.calls: list[list[list[int]]] = []
        self.pad = tok.pad_token_id
        self.row_of: dict[tuple[int, ...], int] = {}

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> GenerationOutput:
        self.calls.append([list(p) for p in prompts])
        out = []
        for prompt in prompts:
            row = next(r for r, first in enumerate(self.firsts) if prompt[: len(first)] == first)
            out.append(self.turns[row][self.done[row]])
            self.done[row] += 1
        width = max(len(ids) for ids in out)
        ids = torch.full((len(out), width), self.pad)
        mask = torch.zeros((len(out), width), dtype=torch.long)
        for k, turn in enumerate(out):
            ids[k, : len(turn)] = torch.tensor(turn)
            mask[k, : len(turn)] = 1
        return GenerationOutput(ids, mask, torch.full(ids.shape, -0.5) * mask, [FINISH_STOP] * len(out))

    def start(self, prompts: list[list[int]]) -> None:
        self.firsts, self.done = prompts, [0] * len(prompts)

    def sync_weights(self, named_tensors) -> None: ...

    def release_memory(self) -> None: ...
