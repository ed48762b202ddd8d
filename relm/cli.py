"""`relm <command>`: train (and, as they land, compat / export / bench)."""

from __future__ import annotations

import sys

USAGE = """usage: relm <command> [args]

commands:
  train [--config FILE.yaml] [section.key=value ...]   run PPO-family training (same as python -m relm.trainer.main_ppo)
  compat MODEL [options]                                 check that a model loads, generates and trains (relm compat --help)
"""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "train":
        from relm.trainer.main_ppo import main as train_main

        return train_main(rest)
    if command == "compat":
        from relm.compat.cli import main as compat_main

        return compat_main(rest)
    print(f"error: unknown command `{command}`; run `relm --help` for the list", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
