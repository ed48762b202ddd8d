"""`relm <command>`: train, config, bench, compat, export, plot."""

from __future__ import annotations

import sys

USAGE = """usage: relm <command> [args]

commands:
  train [--config FILE.yaml] [section.key=value ...]   run PPO-family training (same as python -m relm.trainer.main_ppo)
  config [KEY ...]                                       a config key's type, default and meaning (no KEY: the sections)
  bench step|rollout|update|capacity [options]           time training steps, generation or the update; capacity: largest model per card count
  compat MODEL [options]                                 check that a model loads, generates and trains (relm compat --help)
  export CHECKPOINT OUT_DIR [--critic]                   write a checkpoint's actor (and critic) as Hugging Face folders
  plot RUN_DIR [--out FILE.png]                          draw reward, KL, entropy, length, throughput curves (RUN_DIR/curves.png)

`relm COMMAND --help` describes each command; `relm --version` prints the version.
"""

BENCH_USAGE = """usage: relm bench step|rollout|update|capacity [options]

  step      whole training steps (`--peer trl` adds TRL's GRPOTrainer beside them)
  rollout   generation alone (native and/or HF engine)
  update    the actor update alone, with its MFU
  capacity  the largest model the memory plan trains on 1, 2, 4, 8 cards of 24, 80, 141 GB (no GPU)

`relm bench KIND --help` lists each one's options.
"""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if args else 2
    if args[0] in ("-V", "--version"):
        from relm import __version__

        print(f"relm {__version__}")
        return 0
    command, rest = args[0], args[1:]
    if command == "train":
        from relm.trainer.main_ppo import main as train_main

        return train_main(rest)
    if command == "config":
        from relm.config.lookup import main as config_main

        return config_main(rest)
    if command == "bench":
        return _bench(rest)
    if command == "compat":
        from relm.compat.cli import main as compat_main

        return compat_main(rest)
    if command == "export":
        from relm.export import main as export_main

        return export_main(rest)
    if command == "plot":
        from relm.trainer.plot import main as plot_main

        return plot_main(rest)
    print(f"error: unknown command `{command}`; run `relm --help` for the list", file=sys.stderr)
    return 2


def _bench(args: list[str]) -> int:
    """`relm bench step ...` (full training steps), `rollout` (generation alone), `update` (actor update alone)."""
    kind, rest = (args[0], args[1:]) if args else ("", [])
    if kind in ("-h", "--help", "help"):
        print(BENCH_USAGE)
        return 0
    if kind == "step":
        from relm.bench.step import main as step_main

        return step_main(rest)
    if kind == "rollout":
        from relm.bench.rollout import main as rollout_main

        return rollout_main(rest)
    if kind == "update":
        from relm.bench.update import main as update_main

        return update_main(rest)
    if kind == "capacity":
        from relm.bench.capacity import main as capacity_main

        return capacity_main(rest)
    print(
        "error: `relm bench` needs `step`, `rollout`, `update` or `capacity`, e.g. `relm bench step --model zoo:tiny/qwen2`",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
