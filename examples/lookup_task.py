"""Write the lookup task (docs/multi_turn.md): a tool use a random model learns by RL from scratch on a CPU.

    python examples/lookup_task.py --output outputs/lookup
    relm train --config examples/lookup_task.yaml

Writes `train.parquet`, `val.parquet` and `tools.yaml` (verl's tool config naming
`relm.rollout.multi_turn.lookup.Lookup`) into `--output`; examples/lookup_task.yaml reads them from
`outputs/lookup` and trains `zoo:tiny/qwen2-lookup` with GRPO.
"""

from __future__ import annotations

import argparse
import sys

from relm.rollout.multi_turn.lookup import write_lookup_task


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--output", default="outputs/lookup", help="folder for the parquet files and tools.yaml"
    )
    parser.add_argument("--num_train", type=int, default=512)
    parser.add_argument("--num_val", type=int, default=64)
    args = parser.parse_args(argv)
    for name, path in write_lookup_task(args.output, args.num_train, args.num_val).items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
