"""`python -m relm.trainer.main_ppo [--config FILE.yaml] [section.key=value ...]` (same as `relm train`).

The entry point only: `--help` is answered from the schema alone, and the run's modules (torch, transformers)
are imported after it, in `relm.trainer.train_command`.
"""

from __future__ import annotations

import sys

from relm.errors import run_guarded
from relm.logs import setup_logging


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if any(arg in ("-h", "--help") for arg in args):
        from relm.config.lookup import train_help

        print(train_help())
        return 0
    setup_logging()
    return run_guarded(lambda: _train(args))


def _train(argv: list[str]) -> int:
    from relm.config.loader import load_config

    cfg = load_config(argv)  # a mistake in the config ends here in a second, before torch is imported
    from relm.trainer.train_command import train_command

    return train_command(argv, cfg)


if __name__ == "__main__":
    sys.exit(main())
