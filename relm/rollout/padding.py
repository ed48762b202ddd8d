"""Left padding: prompt token lists into the [B, W] tensors every engine and the trainer's forward read.

It lives with the engines, the lowest room that pads prompts (the native and HF engines before
generation; `relm.trainer.experience` when it joins prompts to their responses), so no engine has to
reach up into the data stage for it.
"""

from __future__ import annotations

import torch


def left_pad(
    sequences: list[list[int]], pad_id: int, width: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists into ([B, W] ids, [B, W] mask); W is the longest unless given.

    Left padding keeps every prompt's last token in the same column, which is where generation
    continues and where the response starts in the concatenated training sequence.
    """
    width = max((len(s) for s in sequences), default=0) if width is None else width
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if len(seq) > width:
            raise ValueError(f"sequence of {len(seq)} tokens does not fit width {width}")
        if seq:
            ids[row, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
            mask[row, width - len(seq) :] = 1
    return ids, mask
