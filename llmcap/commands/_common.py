"""Shared CLI plumbing: user errors → one line on stderr + exit code 2; JSON on stdout."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console

from llmcap.credentials import redact_text
from llmcap.errors import LlmcapError
from llmcap.jsonsafe import nan_to_null

err_console = Console(stderr=True)


def user_errors(fn: Callable) -> Callable:
    """Turn `LlmcapError` into `error: <message>` on stderr and exit code 2 — never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except LlmcapError as exc:
            print(f"error: {redact_text(str(exc))}", file=sys.stderr)  # a message quoting a URL never shows its password
            raise typer.Exit(2) from None

    return wrapper


def dumps(obj: Any, indent: int | None = None) -> str:
    return json.dumps(nan_to_null(obj), indent=indent, sort_keys=False, allow_nan=False)


def print_json(obj: Any) -> None:
    sys.stdout.write(dumps(obj) + "\n")
