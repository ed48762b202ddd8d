"""Which dtype holds the weights and which one the matrix products run in.

Training keeps fp32 master weights (and fp32 AdamW states) and computes in bf16 on a GPU through
autocast. Storing the weights themselves in bf16 with a plain optimizer is not an option for RL: at
the learning rates RL uses (1e-6), an update is far below bf16's spacing near a typical weight (about
1e-4 at 0.02), so AdamW's steps round away and the run reports finite losses while the policy does not
move. Where bf16 weights are needed to fit (the memory plan's last rung, or `model.dtype=bfloat16`),
`relm.learner.compact_adamw` steps them in fp32 and rounds the result stochastically instead.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from relm.models.loading import pick_dtype


@dataclass(frozen=True)
class Precision:
    """Master (storage) and compute dtypes of the trained models."""

    master: torch.dtype
    """Weights and optimizer states."""
    compute: torch.dtype
    """Matrix products in forward and backward (autocast when it differs from `master`)."""
    device_type: str
    use_autocast: bool = True
    """False where FSDP2's `MixedPrecisionPolicy` casts the sharded models itself (`relm.distributed`)."""

    def autocast(self) -> contextlib.AbstractContextManager:
        """The context the trainer's forward and backward passes run in."""
        if self.compute == self.master or not self.use_autocast:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.compute)


def pick_precision(model_dtype: str, device: torch.device) -> Precision:
    """`auto`: fp32 master weights, bf16 compute on CUDA (fp32 on CPU). An explicit dtype is used for both."""
    if model_dtype == "auto":
        compute = torch.bfloat16 if device.type == "cuda" else torch.float32
        return Precision(master=torch.float32, compute=compute, device_type=device.type)
    dtype = pick_dtype(model_dtype, device)
    return Precision(master=dtype, compute=dtype, device_type=device.type)
