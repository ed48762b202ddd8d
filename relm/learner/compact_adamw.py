"""AdamW that stores its moments in bf16 and updates bf16 weights with stochastic rounding.

fp32 AdamW keeps 16 bytes a parameter (weights, gradients, two moments), which is more than one GPU
and its host hold for a 7B actor beside a 7B critic. The memory plan (`relm.memory.plan`)
gives precision up in two rungs, and this optimizer is both of them:

- **bf16 moments** (fp32 weights kept): the moments are stored in bf16, halving them, and the step
  computes in fp32: each parameter's moments are upcast slice by slice, updated, and written back.
- **bf16 weights**: the parameters themselves are bf16. AdamW's update at RL learning rates (1e-6)
  is far below bf16's spacing near a typical weight (2^-8 relative, about 1e-4 at 0.02), so a plain
  bf16 step rounds nearly every update away and the policy silently stops moving. Here the step is
  computed on an fp32 copy of the slice and written back with **stochastic rounding**: uniform
  random bits are added below bf16's mantissa (the low 16 bits of the fp32 pattern) before those
  bits are cut, so a value rounds up with probability equal to its distance from the lower bf16
  neighbour. The rounding is unbiased, and a 1e-6 update moves the weight in expectation.

The moments are written back to bf16 the same way: with beta2 = 0.999 the second moment changes by
0.1% a step, under half of bf16's spacing, so round-to-nearest would freeze it.

The arithmetic in fp32 is exactly `torch.optim.AdamW`'s (single-tensor path: decoupled decay, lerp
of the first moment, bias corrections as Python floats), so with fp32 weights and fp32 moments the
two optimizers agree bit for bit. Steps run per parameter, in slices of `SLICE_ELEMENTS`, so the fp32
scratch of the largest tensor (a 152k x 3.5k embedding) stays near 1 GiB; this composes with
`OffloadedOptimizerStates`, which brings a chunk of (bf16) moments to the GPU and calls `step`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

SLICE_ELEMENTS = 1 << 26
"""Elements stepped at once: fp32 weights, moments, denominator and random bits of a slice, ~1 GiB."""
STORAGE_DTYPES = (torch.float32, torch.bfloat16)
_MOMENTS = ("exp_avg", "exp_avg_sq")
_LOW_HALF_MASK = -(1 << 16)  # 0xFFFF0000 as int32: sign, exponent and bf16's 7 mantissa bits


def stochastic_round_to_bf16(values: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """fp32 -> bf16, rounding up with probability equal to the value's distance from its lower neighbour.

    Adding uniform bits in [0, 2^16) to the fp32 bit pattern carries into bf16's last mantissa bit
    exactly in that proportion (the carry walks into the exponent at a binade's end, as it should);
    the pattern is sign-magnitude, so negative values round away from zero with the same odds and
    the result is unbiased for both signs.
    """
    bits = values.contiguous().view(torch.int32)
    noise = torch.randint(
        0, 1 << 16, values.shape, dtype=torch.int32, device=values.device, generator=generator
    )
    # the low 16 bits are now zero, so this conversion is exact
    return ((bits + noise) & _LOW_HALF_MASK).view(torch.float32).to(torch.bfloat16)


_GENERATORS_KEY = "rounding_generators"


class CompactAdamW(torch.optim.Optimizer):
    """AdamW with moments stored in `moments_dtype` and stochastically rounded bf16 parameters.

    Args:
        params: parameters (fp32 or bf16) or parameter groups.
        lr, betas, eps, weight_decay: as `torch.optim.AdamW`.
        moments_dtype: storage of `exp_avg` and `exp_avg_sq`: float32 or bfloat16.
        seed: seeds the rounding noise (one generator per device), so runs repeat.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        *,
        moments_dtype: torch.dtype = torch.float32,
        seed: int = 0,
    ) -> None:
        if moments_dtype not in STORAGE_DTYPES:
            raise ValueError(f"moments_dtype must be float32 or bfloat16, not {moments_dtype}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        for group in self.param_groups:
            for param in group["params"]:
                if param.dtype not in STORAGE_DTYPES:
                    raise ValueError(f"CompactAdamW steps float32 or bfloat16 parameters, not {param.dtype}")
        self.moments_dtype = moments_dtype
        self.seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}
        self._loaded_moments: dict[int, dict[str, torch.Tensor]] = {}
        # torch types the hooks for any Optimizer; these are registered on a CompactAdamW only.
        self.register_load_state_dict_pre_hook(_set_moments_aside)  # type: ignore[arg-type]
        self.register_load_state_dict_post_hook(_restore_moments)  # type: ignore[arg-type]

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """One AdamW step over every parameter with a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self._state_of(param)
                state["step"] += 1
                adamw_update(
                    param,
                    param.grad,
                    state["exp_avg"],
                    state["exp_avg_sq"],
                    step=state["step"].item(),
                    lr=float(group["lr"]),
                    beta1=beta1,
                    beta2=beta2,
                    eps=group["eps"],
                    weight_decay=group["weight_decay"],
                    generator=self._generator(param.device),
                )
        return loss

    def _state_of(self, param: torch.Tensor) -> dict[str, Any]:
        state = self.state[param]
        if not state:
            state["step"] = torch.tensor(0.0, dtype=torch.float32)  # where torch.optim.AdamW keeps it
            for key in _MOMENTS:
                state[key] = torch.zeros_like(
                    param, dtype=self.moments_dtype, memory_format=torch.preserve_format
                )
        for key in _MOMENTS:
            # moments restored from a checkpoint wait on the CPU until their parameter's first step
            if state[key].device != param.device:
                state[key] = state[key].to(param.device, non_blocking=True)
        return state

    def state_dict(self) -> dict[str, Any]:
        """torch's optimizer state plus the rounding noise generators' states, so that a resumed run
        draws the noise an uninterrupted one would."""
        state = super().state_dict()
        state[_GENERATORS_KEY] = {str(device): gen.get_state() for device, gen in self._generators.items()}
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = dict(state_dict)
        generators = state_dict.pop(_GENERATORS_KEY, {})
        super().load_state_dict(state_dict)
        for name, rng_state in generators.items():
            device = torch.device(name)
            if device.type == "cuda" and not torch.cuda.is_available():
                continue  # resumed on another kind of device: its noise starts from the seed
            self._generator(device).set_state(rng_state)

    def _generator(self, device: torch.device) -> torch.Generator:
        generator = self._generators.get(device)
        if generator is None:
            generator = torch.Generator(device=device).manual_seed(self.seed)
            self._generators[device] = generator
        return generator


def adamw_update(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    *,
    step: float,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    generator: torch.Generator | None = None,
) -> None:
    """One AdamW step of one tensor, in fp32, slice by slice; bf16 storage is written back rounded."""
    tensors = (param, grad, exp_avg, exp_avg_sq)
    if not all(t.is_contiguous() for t in tensors):
        _update_slice(*tensors, step, lr, beta1, beta2, eps, weight_decay, generator)  # rare: no slicing
        return
    flat = [t.view(-1) for t in tensors]
    for start in range(0, param.numel(), SLICE_ELEMENTS):
        p, g, m, v = (t[start : start + SLICE_ELEMENTS] for t in flat)
        _update_slice(p, g, m, v, step, lr, beta1, beta2, eps, weight_decay, generator)


def _update_slice(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    step: float,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    generator: torch.Generator | None,
) -> None:
    # fp32 views of the slice: the tensors themselves where they are fp32 (updated in place)
    param32, exp_avg32, exp_avg_sq32 = (
        t if t.dtype == torch.float32 else t.float() for t in (param, exp_avg, exp_avg_sq)
    )
    grad32 = grad if grad.dtype == torch.float32 else grad.float()
    # torch.optim.AdamW's single-tensor step, operation for operation
    if weight_decay != 0:
        param32.mul_(1 - lr * weight_decay)
    exp_avg32.lerp_(grad32, 1 - beta1)
    exp_avg_sq32.mul_(beta2).addcmul_(grad32, grad32, value=1 - beta2)
    bias_correction1 = 1 - beta1**step
    bias_correction2 = 1 - beta2**step
    step_size = lr / bias_correction1
    denom = (exp_avg_sq32.sqrt() / bias_correction2**0.5).add_(eps)
    param32.addcdiv_(exp_avg32, denom, value=-step_size)
    for stored, exact in ((param, param32), (exp_avg, exp_avg32), (exp_avg_sq, exp_avg_sq32)):
        if stored is not exact:
            stored.copy_(stochastic_round_to_bf16(exact, generator))


def _set_moments_aside(optimizer: CompactAdamW, state_dict: dict[str, Any]) -> dict[str, Any]:
    """Take the moments out of a state dict before torch's loader casts them to each parameter's dtype
    and device: a bf16 parameter would lose fp32 moments, and every moment would land on the GPU at
    once, which is what offloading them avoids."""
    saved_ids = [i for group in state_dict["param_groups"] for i in group["params"]]
    position = {saved_id: index for index, saved_id in enumerate(saved_ids)}
    optimizer._loaded_moments, state = {}, {}
    for key, saved in state_dict["state"].items():
        optimizer._loaded_moments[position[key]] = {k: v for k, v in saved.items() if k in _MOMENTS}
        state[key] = {k: v for k, v in saved.items() if k not in _MOMENTS}
    return {**state_dict, "state": state}


def _restore_moments(optimizer: CompactAdamW) -> None:
    """Put the moments set aside back, in `moments_dtype` on the CPU (the first step moves them)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for index, moments in optimizer._loaded_moments.items():
        state = optimizer.state[params[index]]
        for name, value in moments.items():
            state[name] = value.to("cpu", optimizer.moments_dtype)
    optimizer._loaded_moments = {}
