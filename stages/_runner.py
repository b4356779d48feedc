"""What every stage script shares: argument parsing, environment defaults, and user errors.

A stage declares its path arguments and a `run(args) -> str` body; `stage_main` parses the command
line (plus the common `--params`), fills in the environment defaults, runs the body and prints its
one-line summary. An `LlmcapError` becomes `error: <message>` on stderr and exit code 2, so
`dvc repro` shows the reason instead of a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from stages import timing
from stages.env import apply_defaults

Argument = tuple[str, dict]


def stage_main(
    name: str,
    doc: str | None,
    arguments: Sequence[Argument],
    run: Callable[[argparse.Namespace], str],
    argv: list[str] | None = None,
) -> int:
    ap = argparse.ArgumentParser(prog=f"stages.{name}", description=doc)
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    for flag, options in arguments:
        ap.add_argument(flag, **options)
    args = ap.parse_args(argv)
    startup_s = timing.process_age_s()
    apply_defaults()
    # the library's log (phases, accounting) in the stage's output, as DVC shows it; LLMCAP_LOG_LEVEL overrides
    import logging

    library = logging.getLogger("llmcap")
    library.addHandler(logging.StreamHandler(sys.stderr))
    library.handlers[-1].setFormatter(logging.Formatter(f"[{name}] %(levelname)s %(name)s: %(message)s"))
    library.setLevel(os.environ.get("LLMCAP_LOG_LEVEL", "info").upper())

    from llmcap.credentials import redact_text
    from llmcap.errors import LlmcapError  # after the defaults: stages import lazily on purpose

    began = time.perf_counter()
    try:
        message = run(args)
    except LlmcapError as exc:
        print(f"error: {redact_text(str(exc))}", file=sys.stderr)  # a message quoting a URL never shows its password
        return 2
    timing.record(name, startup_s, time.perf_counter() - began)
    print(f"[{name}] {message}")
    return 0


def path(required: bool = True, help: str | None = None) -> dict:
    """argparse options of a path argument."""
    return {"type": Path, "required": required, "help": help}
