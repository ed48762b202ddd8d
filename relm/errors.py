"""The one exception type that means "the user's input is wrong".

Anything raised as `UserError` ends the run with exit code 2 and a single line starting with
`error:`; every other exception is an internal error (exit code 1). Keeping the distinction in one
type lets deep code (a dataset reader, a reward loader) report a user's mistake without knowing
how the CLI prints it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable


class UserError(Exception):
    """A mistake in the user's config, data, model, reward file or checkpoint.

    The message must name the culprit (key, file, column, row, model) and say what to do.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message.strip().splitlines()[0] if message.strip() else message)


def run_guarded(fn: Callable[[], int | None]) -> int:
    """Run a CLI command and turn its outcome into an exit code.

    `UserError` -> one `error:` line on stderr, exit 2. Any other exception -> one line naming the
    internal error, exit 1. `RELM_DEBUG=1` re-raises so the traceback shows.
    """
    debug = os.environ.get("RELM_DEBUG", "") not in ("", "0")
    try:
        return int(fn() or 0)
    except UserError as exc:
        if debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the CLI boundary: everything else is an internal error
        if debug:
            raise
        print(
            f"internal error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} "
            "(rerun with RELM_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return 1
