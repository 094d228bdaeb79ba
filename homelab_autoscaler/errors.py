"""The one kind of failure a person fixes: a mistake in what they asked for (a busy port, a missing file, an
unknown claim). The command line prints it as one line naming the thing and the fix, and exits 2."""

from __future__ import annotations


class UserError(Exception):
    """A mistake of the person running the command: one line, exit code 2, no traceback."""
