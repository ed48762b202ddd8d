"""The one exception type that means "the user's input is wrong".

Anything raised as `UserError` ends the run with exit code 2 and a single line starting with
`error:`; every other exception is an internal error (exit code 1). Keeping the distinction in one
type lets deep code (a dataset reader, a reward loader) report a user's mistake without knowing
how the CLI prints it.
"""

from __future__ import annotations


class UserError(Exception):
    """A mistake in the user's config, data, model, reward file or checkpoint.

    The message must name the culprit (key, file, column, row, model) and say what to do.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message.strip().splitlines()[0] if message.strip() else message)
