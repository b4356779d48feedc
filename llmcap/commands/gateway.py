"""`llmcap gateway --baseline URL [--candidate URL --weight W] [--shadow NAME=URL,SHARE] ...`: serve the
traffic gateway (see `llmcap.gateway`). Prints one line with its URL and serves until SIGINT/SIGTERM;
then, with `--record`, the rows are also written as Parquet next to the JSON lines, and the exit code
says how the requests fared (`llmcap.exit_codes`).

    curl -s localhost:8100/admin/weights -d '{"candidate": 0.25}'   # move a quarter of traffic (loopback only)
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path
from typing import Annotated

import pyarrow as pa
import pyarrow.parquet as pq
import typer

from llmcap import exit_codes
from llmcap.commands._common import user_errors
from llmcap.errors import LlmcapError
from llmcap.gateway import Gateway, GatewayConfig, ShadowTarget
from llmcap.gateway.split import PREFIX_TOKENS


def parse_shadow(text: str, max_in_flight: int) -> ShadowTarget:
    """NAME=URL or NAME=URL,SHARE, e.g. `new=http://10.0.0.5:8000,0.1` (a tenth of requests)."""
    name, sep, rest = text.partition("=")
    url, _, share = rest.partition(",")
    if not sep or not name or not url.startswith(("http://", "https://")):
        raise LlmcapError(f"--shadow {text!r}: write NAME=URL or NAME=URL,SHARE, e.g. new=http://127.0.0.1:8001,0.1")
    try:
        value = float(share) if share else 1.0
    except ValueError:
        value = -1.0
    if not 0 < value <= 1:
        raise LlmcapError(f"--shadow {text!r}: the share after the comma is a number in (0, 1]")
    return ShadowTarget(name, url, value, max_in_flight)


@user_errors
def gateway(
    baseline: Annotated[str, typer.Option(help="the deployment serving production now (URL)")],
    candidate: Annotated[str | None, typer.Option(help="the deployment being rolled out (URL)")] = None,
    weight: Annotated[float, typer.Option(min=0.0, max=1.0, help="the candidate's share of traffic at start")] = 0.0,
    shadow: Annotated[
        list[str] | None,
        typer.Option(
            help="NAME=URL or NAME=URL,SHARE: copy SHARE (default all) of requests there, answers discarded (repeatable)"
        ),
    ] = None,
    shadow_max_in_flight: Annotated[
        int, typer.Option(min=1, help="copies in flight per shadow; past it copies are dropped (counted)")
    ] = 16,
    prefix_tokens: Annotated[
        int,
        typer.Option(min=0, help="sticky routing key: the prompt's first N tokens when no session header (0: none)"),
    ] = PREFIX_TOKENS,
    record: Annotated[
        Path | None, typer.Option(help="append one JSON line per finished request here (and write .parquet at exit)")
    ] = None,
    host: Annotated[
        str, typer.Option(help="address to bind (the admin API answers loopback clients only)")
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="port (0: any free one; the printed URL says which)")
    ] = 8100,
    max_failed: Annotated[
        float,
        typer.Option(
            "--max-failed",
            min=0.0,
            max=1.0,
            help="share of requests that may go unserved before the exit says FAILED (5)",
        ),
    ] = 0.01,
) -> None:
    """Split traffic between a baseline and a candidate by weight, mirror a share to shadows, record every request.

    On SIGINT/SIGTERM it stops and exits by how the requests it took fared: 0 every one served (or
    abandoned by its client); 4 UNREACHABLE (requests came, none was served); 5 FAILED (more than
    --max-failed unserved). Shadow copies do not count: their answers are discarded."""
    try:
        config = GatewayConfig(
            baseline=baseline,
            candidate=candidate,
            candidate_weight=weight,
            shadows=tuple(parse_shadow(s, shadow_max_in_flight) for s in shadow or ()),
            prefix_tokens=prefix_tokens,
        )
    except ValueError as exc:
        raise LlmcapError(str(exc)) from None
    gw = Gateway(config, record=record)
    asyncio.run(_serve(gw, host, port))
    table = gw.table()
    if record is not None:
        pq.write_table(table, record.with_suffix(".parquet"))
    code, why = served_outcome(table, max_failed)
    print(f"llmcap gateway: {exit_codes.NAMES[code]}: {why}", file=sys.stderr if code else sys.stdout, flush=True)
    if code:
        raise typer.Exit(code)


def served_outcome(table: pa.Table, max_failed: float) -> tuple[int, str]:
    """How the requests the gateway took fared, as an exit code (llmcap.exit_codes) and why. A request
    its client abandoned is not the deployment's failure; every other request that was not served is."""
    outcome = table.column("outcome").to_pylist()
    taken = len(outcome) - outcome.count("client_gone")
    return exit_codes.served(taken, outcome.count("ok"), max_failed)


async def _serve(gw: Gateway, host: str, port: int) -> None:
    try:
        url = await gw.start(host, port)
    except OSError as exc:
        raise LlmcapError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    sides = f"baseline {gw.config.baseline}" + (
        f", candidate {gw.config.candidate} at {gw.split.candidate_weight:g}" if gw.config.candidate else ""
    )
    print(f"llmcap gateway: {sides} at {url}", flush=True)
    await stop.wait()
    await gw.stop()
