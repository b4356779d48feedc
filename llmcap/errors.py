"""User-facing errors: one clear line, naming the file, line and field where known.

The CLI turns any `LlmcapError` into that single line on stderr and its exit code (`llmcap.exit_codes`: 2 unless
the error says otherwise; no traceback).
"""

from __future__ import annotations

from pathlib import Path

from llmcap import exit_codes


class LlmcapError(Exception):
    """An error the user can fix (bad input, bad params). Printed as one line, exit code 2."""

    exit_code = exit_codes.USAGE


class UnreachableError(LlmcapError):
    """The endpoint does not answer at all (refused, timed out, no route): exit code 4, UNREACHABLE."""

    exit_code = exit_codes.UNREACHABLE


class FailedError(LlmcapError):
    """The endpoint answered, but every request failed: exit code 5, FAILED."""

    exit_code = exit_codes.FAILED


class InputFileError(LlmcapError):
    """A file that cannot be used at all. Names the file and, where known, the line and field."""

    def __init__(self, path: str | Path, message: str, *, line: int | None = None, field: str | None = None):
        self.path = str(path)
        self.line = line
        self.field = field
        self.reason = message
        where = self.path if line is None else f"{self.path}:{line}"
        what = f" field '{field}':" if field else ""
        super().__init__(f"{where}:{what} {message}")

    def at(self, path: str | Path) -> InputFileError:
        """The same error, naming `path` (the file the user gave, not a temporary copy of it)."""
        return InputFileError(path, self.reason, line=self.line, field=self.field)
