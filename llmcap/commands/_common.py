"""Shared CLI plumbing: user errors → one line on stderr + exit code 2; JSON or CSV on stdout."""

from __future__ import annotations

import csv
import functools
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any

import typer
from rich.console import Console

from llmcap.credentials import redact_text
from llmcap.errors import LlmcapError
from llmcap.jsonsafe import nan_to_null

err_console = Console(stderr=True)

#: Columns of stdout when it is no terminal: wide enough that no table cell (a candidate name) is cut to `…`.
PIPED_WIDTH = 1000


def out_console() -> Console:
    """A console for stdout: a terminal's own width, or (piped, redirected) `PIPED_WIDTH`, since a file or a
    grep has no width and rich's default of 80 columns would cut names short. COLUMNS, when set, still wins."""
    console = Console()
    if console.is_terminal or "COLUMNS" in os.environ:
        return console
    return Console(width=PIPED_WIDTH)


LOG_LEVELS = ("debug", "info", "warning", "error")


def configure_logging(level: str) -> None:
    """The library's log (logger `llmcap`; each module logs to `logging.getLogger(__name__)`) on stderr through rich,
    at `level`; other libraries' loggers are left as they are."""
    import logging

    from rich.logging import RichHandler

    if level.lower() not in LOG_LEVELS:
        raise LlmcapError(f"--log-level {level!r}: choose one of {', '.join(LOG_LEVELS)}")
    logger = logging.getLogger("llmcap")
    logger.handlers = [RichHandler(console=err_console, show_path=False, log_time_format="%H:%M:%S")]
    logger.setLevel(level.upper())


def user_errors(fn: Callable) -> Callable:
    """Turn `LlmcapError` into `error: <message>` on stderr and its exit code (`LlmcapError.exit_code`) — never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except LlmcapError as exc:
            print(
                f"error: {redact_text(str(exc))}", file=sys.stderr
            )  # a message quoting a URL never shows its password
            raise typer.Exit(exc.exit_code) from None

    return wrapper


def given_options(ctx: typer.Context, names: Sequence[str]) -> list[str]:
    """Which of the parameters `names` the user set on the command line (not a default, not the environment)."""
    return [
        n for n in names if (src := ctx.get_parameter_source(n)) is not None and src.name == "COMMANDLINE"
    ]  # typer's own click: by name


def dumps(obj: Any, indent: int | None = None) -> str:
    return json.dumps(nan_to_null(obj), indent=indent, sort_keys=False, allow_nan=False)


def print_json(obj: Any) -> None:
    sys.stdout.write(dumps(obj) + "\n")


OUTPUT_FORMATS = ("table", "json", "csv")
OutputFormatOpt = Annotated[
    str,
    typer.Option(
        "--output-format", help="table (for people) | json (one object) | csv (one row per line of the main table)"
    ),
]
JsonFlagOpt = Annotated[bool, typer.Option("--json", help="the same as --output-format json")]


def output_format(fmt: str, json_flag: bool) -> str:
    """The chosen format; --json is kept as the short form of --output-format json."""
    if fmt not in OUTPUT_FORMATS:
        raise LlmcapError(f"--output-format {fmt!r}: choose one of {', '.join(OUTPUT_FORMATS)}")
    if json_flag and fmt not in ("table", "json"):
        raise LlmcapError(f"--json and --output-format {fmt} ask for two formats; give one")
    return "json" if json_flag else fmt


def flatten(row: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted columns (`ttft_ms.p99`); lists as JSON text, so one record is one CSV line."""
    out: dict[str, Any] = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out |= flatten(value, f"{name}.")
        elif isinstance(value, (list, tuple)):
            out[name] = dumps(value)
        else:
            out[name] = "" if value is None else value
    return out


def print_csv(rows: Sequence[Mapping[str, Any]]) -> None:
    """`rows` (flattened) as CSV on stdout, columns in first-seen order, NaN as an empty field."""
    flat = [flatten(nan_to_null(dict(r))) for r in rows]
    columns = list(dict.fromkeys(k for r in flat for k in r))
    writer = csv.DictWriter(sys.stdout, fieldnames=columns, restval="", lineterminator="\n")
    writer.writeheader()
    writer.writerows(flat)
