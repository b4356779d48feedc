"""The options of `llmcap replay` (`llmcap.commands.replay`), as types: what each one means and its bounds;
the defaults stay in the command's signature."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from llmcap.credentials import DEFAULT_API_KEY_ENV
from llmcap.live.trace_replay import RATE_PER_PROCESS

EndpointOpt = Annotated[
    str,
    typer.Option(
        help="Base URL of an OpenAI-compatible streaming server (user:password@ is sent as basic auth, never printed)."
    ),
]
ReplayTraceOpt = Annotated[
    Path, typer.Option("--trace", "-t", help="Trace file (any format `llmcap trace inspect` reads).")
]
ServedModelOpt = Annotated[str | None, typer.Option(help="Served model name (default: the server's first model).")]
RequestRateOpt = Annotated[
    float | None,
    typer.Option("--request-rate", help="Replay at this mean rate, req/s (the trace's burst shape kept)."),
]
RateScaleOpt = Annotated[float, typer.Option(help="Or: multiply the trace's own rate by this.")]
MaxConcurrencyOpt = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Closed loop instead (as vLLM bench's --max-concurrency with no rate): "
        "N clients, each sending its next request when its last one ended; the "
        "trace's order and lengths, not its arrival times. Describes N concurrent "
        "users, not capacity.",
    ),
]
MaxRequestsOpt = Annotated[int | None, typer.Option(min=1, help="Replay only the first N requests.")]
SloTtftOpt = Annotated[float | None, typer.Option(help="TTFT target per request (ms): report attainment.")]
SloItlOpt = Annotated[float | None, typer.Option(help="Per-request P99 ITL target (ms): report attainment.")]
MaxLatenessOpt = Annotated[float, typer.Option(help="A send later than this makes the run INVALID (exit 3).")]
MaxFailedOpt = Annotated[
    float,
    typer.Option(
        min=0.0,
        max=1.0,
        help="Share of requests that may be rejected or unfinished before the "
        "run FAILED (exit 5; none served: UNREACHABLE, exit 4).",
    ),
]
AttainmentOpt = Annotated[
    float,
    typer.Option(
        min=0.01,
        max=1.0,
        help="With SLO targets: below this steady-window attainment the run exits 6 (SLO MISSED).",
    ),
]
TimeoutOpt = Annotated[float, typer.Option(min=0.001, help="Per-read timeout of a stream, s (a miss, not a retry).")]
MaxDrainOpt = Annotated[
    float | None,
    typer.Option(
        min=0.0,
        help="Cut requests still streaming this many s after the last send "
        "(unfinished; default: only --timeout bounds them).",
    ),
]
VocabSizeOpt = Annotated[int, typer.Option(min=8, help="Token ids are drawn from [4, vocab_size).")]
BlockTokensOpt = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Tokens per prefix hash block: equal hashes become equal token blocks (default: the trace's block size).",
    ),
]
SeedOpt = Annotated[int, typer.Option(help="Seed of the prompts' token ids.")]
ApiOpt = Annotated[
    str,
    typer.Option(
        help="completions (token-id prompts: exact ISL) or chat (/v1/chat/completions; text prompts: ISL approximate)."
    ),
]
ProcessesOpt = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Load generator processes (default: one per "
        f"{RATE_PER_PROCESS:,.0f} req/s of the busiest second, at most one per core).",
    ),
]
OutOpt = Annotated[Path | None, typer.Option(help="Write records.parquet (the request schema) and summary.json here.")]
ApiKeyEnvOpt = Annotated[
    str | None,
    typer.Option(
        "--api-key-env",
        metavar="NAME",
        help=f"Environment variable holding the API key (default: {DEFAULT_API_KEY_ENV} if set).",
    ),
]
JsonOutOpt = Annotated[bool, typer.Option("--json", help="Print the summary as one JSON object.")]
