"""How much host memory a `relm compat` run on CPU will take, said before it starts taking it.

On CPU there is no memory plan (that is for one GPU), and a full-size model's check holds an fp32
actor with its gradients and AdamW moments, a reference and a critic with its own: about 36 bytes per
parameter before activations. `relm compat zoo:Qwen/Qwen2.5-0.5B` on CPU climbed to 16.5 GB in four
minutes with nothing printed; a line with the estimate (and a warning when it exceeds what the machine
has free) lets the user stop it or pick a smaller model before that.
"""

from __future__ import annotations

BYTES_PER_PARAM = 4 * (1 + 1 + 2) + 4 + 4 * (1 + 1 + 2)
"""fp32 actor (weights, gradients, two AdamW moments), reference (weights), critic (as the actor)."""
NOTE_ABOVE_BYTES = 1 << 30
"""Smaller checks (the tiny zoo) print nothing: their memory is never the question."""


def cpu_memory_note(model: str, num_params: int, available: int | None) -> tuple[str, bool] | None:
    """(the line to print before checking `model` on CPU, whether it is a warning); None for small models."""
    needed = num_params * BYTES_PER_PARAM
    if needed < NOTE_ABOVE_BYTES:
        return None
    line = (
        f"{model} on CPU: about {needed / 1e9:.1f} GB of host memory before activations (fp32 actor, reference "
        f"and critic with AdamW states, {num_params / 1e9:.2f}B parameters each)"
    )
    if available is None:
        return line, False
    if needed > available:
        return (
            f"{line}, more than the {available / 1e9:.1f} GB free: it may be killed; check it on a GPU",
            True,
        )
    return f"{line}; {available / 1e9:.1f} GB free", False
