"""`relm bench capacity`: the largest Qwen2.5 model relm trains on 1, 2, 4, 8 cards of 24, 80 and 141 GB.

With `--model MODEL` (a zoo name, a local folder or a Hub id; only its config is read) the question turns
round: for each card size, the fewest of those card counts that train MODEL, with the layout and the
tensor-parallel size of its generation copy the plan chooses there.

No GPU is used: the answer is the memory plan's arithmetic (`relm.memory.capacity`) over the published
shapes of the Qwen2.5 dense family (each config.json's numbers; the models are built on the meta device to
count their parameters). The run priced is GRPO with a reference and a KL loss, fp32 master weights, bf16
compute and generation copy, 256 + 256 tokens a row, as the measured single-GPU runs of docs/benchmarks.md.
A card of C GB is C x 10^9 bytes (torch reports 5-7% more for the H200, H100 and RTX 4090). Prints a
Markdown table, and under it a note for each cell that needs FSDP2's CPU offload (what the machine's
memory, `--host-gb`, then holds). A cell whose answer a measured run shows is marked **measured**; one where only a smaller
model was measured, *(m)*.
"""

from __future__ import annotations

import argparse
import sys

from relm.memory.capacity import Candidate, fit, largest, offload_host_bytes
from relm.memory.plan import HOST_SHARE

GB = 10**9

QWEN25 = {
    # name: (hidden, intermediate, layers, heads, key/value heads, tied embeddings); vocabulary 151,936
    "Qwen2.5-0.5B": (896, 4864, 24, 14, 2, True),
    "Qwen2.5-1.5B": (1536, 8960, 28, 12, 2, True),
    "Qwen2.5-3B": (2048, 11008, 36, 16, 2, True),
    "Qwen2.5-7B": (3584, 18944, 28, 28, 4, False),
    "Qwen2.5-14B": (5120, 13824, 48, 40, 8, False),
    "Qwen2.5-32B": (5120, 27648, 64, 40, 8, False),
    "Qwen2.5-72B": (8192, 29568, 80, 64, 8, False),
}

MEASURED = {
    (1, 141): ("Qwen2.5-7B", "one H200: Qwen2.5-7B shape GRPO, full fine-tuning, 90.5 GiB peak"),
    (1, 24): (
        "Qwen2.5-1.5B",
        "one H200 held to trainer.max_gpu_memory_gb=24: Qwen2.5-1.5B shape GRPO, 14.8 GiB peak",
    ),
}
"""Runs of docs/benchmarks.md ("LoRA against full fine-tuning, and runs held to a smaller card"), by
(cards, card GB): the model, and the run. No run on several GPUs of this kind is measured yet."""


def candidates() -> list[Candidate]:
    from transformers import Qwen2Config

    from relm.memory.model_shape import ModelShape

    found = []
    for name, (hidden, intermediate, layers, heads, kv_heads, tied) in QWEN25.items():
        config = Qwen2Config(
            vocab_size=151936, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
            num_attention_heads=heads, num_key_value_heads=kv_heads, tie_word_embeddings=tied,
        )  # fmt: skip
        config.architectures = ["Qwen2ForCausalLM"]
        found.append(Candidate(name, ModelShape.from_config(config), heads, kv_heads))
    return found


def candidate_of(model: str) -> Candidate:
    """MODEL's shape and head counts from its config (a zoo entry's without building it)."""
    from relm.memory.model_shape import ModelShape
    from relm.models.loading import load_config
    from relm.models.zoo import is_zoo_path, zoo_config

    config = zoo_config(model) if is_zoo_path(model) else load_config(model)[1]
    text = config.get_text_config()
    heads = int(text.num_attention_heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    return Candidate(model, ModelShape.from_config(config), heads, kv_heads)


def cards_needed(model: str, cards: list[int], card_gb: list[int], host_gb: int, sequence_length: int) -> str:
    """For each card size, the fewest of `cards` that train `model`, as a Markdown table."""
    candidate = candidate_of(model)
    lines = [
        f"{model}: {candidate.shape.num_params / 1e9:.2f}B parameters, {candidate.num_heads} attention heads, "
        f"{candidate.num_kv_heads} key/value heads",
        "",
        "| card | fewest cards | how | GiB a card |",
        "| --- | --- | --- | --- |",
    ]
    for size in card_gb:
        for n in sorted(cards):
            how = fit(candidate, n, size * GB, host_gb * GB, sequence_length)
            if how is not None:
                offload = (
                    f"; CPU offload holds {how.offloaded_bytes / GB:.0f} GB" if how.offloaded_bytes else ""
                )
                lines.append(f"| {size} GB | {n} | {how.layout}{offload} | {how.rank_bytes / 2**30:.0f} |")
                break
        else:
            lines.append(
                f"| {size} GB | more than {max(cards)} | does not fit {max(cards)} cards on one machine | - |"
            )
    return "\n".join(lines)


def table(cards: list[int], card_gb: list[int], host_gb: int, sequence_length: int) -> str:
    models = candidates()
    lines = [
        "| card | " + " | ".join(f"{n} card{'s' if n > 1 else ''}" for n in cards) + " |",
        "| --- | " + " | ".join("---" for _ in cards) + " |",
    ]
    notes = []
    for size in card_gb:
        cells = []
        alone = largest(models, 1, size * GB, host_gb * GB, sequence_length)
        for n in cards:
            best = largest(models, n, size * GB, host_gb * GB, sequence_length)
            if best is None:
                cells.append("none")
                continue
            model, how = best
            cell = f"{model.name} ({how.layout}; {how.rank_bytes / 2**30:.0f} GiB a card)"
            if alone is not None and alone[0].shape.num_params > model.shape.num_params:
                host = offload_host_bytes(alone[0], n, sequence_length) / GB
                cell += (
                    f"; one card alone: {alone[0].name} (its CPU offload would pin {host:.0f} GB, over "
                    f"{HOST_SHARE:.0%} of {host_gb} GB)"
                )
            if how.offloaded_bytes:
                notes.append(
                    f"CPU offload, {n} x {size} GB: the shards of {model.name} take "
                    f"{how.offloaded_bytes / GB:.0f} GB of the machine's {host_gb} GB (pinned, at most "
                    f"{HOST_SHARE:.0%} of it)"
                )
            measured = MEASURED.get((n, size))
            if measured is not None:
                same = measured[0] == model.name
                cell += " **measured**" if same else " *(m)*"
                notes.append(f"{'**measured**' if same else '*(m)*'} {n} x {size} GB: {measured[1]}")
            cells.append(cell)
        lines.append(f"| {size} GB | " + " | ".join(cells) + " |")
    return "\n".join(lines + [""] + [f"- {note}" for note in notes])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="relm bench capacity", description=__doc__.splitlines()[0])
    parser.add_argument("--cards", default="1,2,4,8", help="card counts (one machine)")
    parser.add_argument("--card-gb", default="24,80,141", help="card sizes, GB (10^9 bytes)")
    parser.add_argument(
        "--host-gb", type=int, default=128, help="the machine's memory, GB (one card's plan may use it)"
    )
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--response-len", type=int, default=256)
    parser.add_argument(
        "--model", help="a zoo name, local folder or Hub id: the fewest cards of each size that train it"
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    cards = [int(x) for x in args.cards.split(",")]
    sizes = [int(x) for x in args.card_gb.split(",")]
    length = args.prompt_len + args.response_len
    if args.model:
        print(cards_needed(args.model, cards, sizes, args.host_gb, length))
    else:
        print(table(cards, sizes, args.host_gb, length))
    return 0


if __name__ == "__main__":
    sys.exit(main())
