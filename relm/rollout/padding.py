"""Left padding: prompt token lists into the [B, W] tensors every engine and the trainer's forward read.

It lives with the engines, the lowest room that pads prompts (the native and HF engines before
generation; `relm.trainer.experience` when it joins prompts to their responses), so no engine has to
reach up into the data stage for it.

Left padding assumes a model that reads the attention mask. For one that does not
(`relm.models.padding_probe`), `shift_left` moves each row's pads after its real tokens before the
forward and `realign_tail` puts the outputs back in the padded columns.
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


def leading_pads(attention_mask: torch.Tensor) -> torch.Tensor:
    """[N] columns before each row's first real token in [N, T] `attention_mask` (0 for a row of pads)."""
    before = (attention_mask.cumsum(dim=1) == 0).sum(dim=1)  # [N]
    return torch.where(before < attention_mask.shape[1], before, 0)


def shift_left(tensor: torch.Tensor, shifts: torch.Tensor) -> torch.Tensor:
    """Row i of [N, T, ...] `tensor` rotated left by `shifts[i]` columns: out[i, j] = tensor[i, (j + s_i) % T].

    With `shifts = leading_pads(mask)` a `[pads | prompt | response | pads]` row becomes
    `[prompt | response | pads | pads]`: a model that does not read the mask meets every pad after the
    real tokens, where a causal model's outputs at the real tokens cannot see them.
    """
    width = tensor.shape[1]
    columns = (torch.arange(width, device=tensor.device)[None, :] + shifts[:, None]) % width  # [N, T]
    return tensor.gather(1, _expand_index(columns, tensor))


def realign_tail(tail: torch.Tensor, shifts: torch.Tensor, width: int) -> torch.Tensor:
    """The last `width` columns of the unshifted rows, from the last K columns of the shifted ones.

    `tail` [N, K, ...] is the end of a forward over `shift_left(x, shifts)` rows, with
    K >= width + max(shifts): the original column T - width + j of row i sat at shifted column
    T - width + j - s_i, which is `tail` column K - width - s_i + j. Returns [N, width, ...].
    """
    num_kept = tail.shape[1]
    first = num_kept - width - shifts  # [N]
    if bool((first < 0).any()):
        raise ValueError(
            f"{num_kept} kept columns cannot hold {width} columns shifted by {int(shifts.max())}"
        )
    columns = first[:, None] + torch.arange(width, device=tail.device)[None, :]  # [N, width]
    return tail.gather(1, _expand_index(columns, tail))


def _expand_index(columns: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """[N, W] column indices broadcast over `like`'s trailing dimensions, for `gather` along dim 1."""
    index = columns.reshape(*columns.shape, *([1] * (like.dim() - 2)))
    return index.expand(*columns.shape, *like.shape[2:])
