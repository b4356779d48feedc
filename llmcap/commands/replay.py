"""`llmcap replay --endpoint URL --trace T`: send a trace open loop to any OpenAI-compatible streaming
server (vLLM, SGLang, TensorRT-LLM serve, `llmcap twin serve`) and report what came back.

Every request leaves at its scheduled time whatever the server does (`llmcap.live.trace_replay`); errors,
timeouts and cut streams are rows with their status and count as SLO misses. `--max-concurrency N` replays
closed loop instead (`llmcap.live.closedloop`): a product's concurrency, not capacity, and the output says so.

Exit codes (`llmcap.exit_codes`), the first that applies: 3 INVALID (a send later than `--max-lateness-ms`: the
client's latency, not the server's); 4 UNREACHABLE (not one request was served: a dead server or a closed
port); 5 FAILED (more than `--max-failed` of the requests rejected or unfinished); 6 SLO MISSED (with SLO
targets, steady-window attainment below `--attainment`); 0 otherwise. `valid` in the summary is false for
3, 4 and 5.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.table import Table

from llmcap import exit_codes
from llmcap.commands._common import dumps, err_console, out_console, print_json, user_errors
from llmcap.commands._goodput import SLO, steady_window
from llmcap.commands._replay_options import (
    ApiKeyEnvOpt,
    ApiOpt,
    AttainmentOpt,
    BlockTokensOpt,
    EndpointOpt,
    JsonOutOpt,
    MaxConcurrencyOpt,
    MaxDrainOpt,
    MaxFailedOpt,
    MaxLatenessOpt,
    MaxRequestsOpt,
    OutOpt,
    ProcessesOpt,
    RateScaleOpt,
    ReplayTraceOpt,
    RequestRateOpt,
    SeedOpt,
    ServedModelOpt,
    SloItlOpt,
    SloTtftOpt,
    TimeoutOpt,
    VocabSizeOpt,
)
from llmcap.commands._trace_input import (
    ArrivalRateOpt,
    BlockSizeOpt,
    ColumnOpt,
    DuplicatesOpt,
    FormatOpt,
    GenerateArrivalsOpt,
    TimeUnitOpt,
    account_json,
    plausible_rate,
    positive,
    read_trace_input,
    validated,
)
from llmcap.config import ReplayParams
from llmcap.credentials import api_key_from_env, redact_url
from llmcap.errors import LlmcapError
from llmcap.live.closedloop import CAVEAT
from llmcap.live.prompts import APIS
from llmcap.live.served import first_served_model
from llmcap.live.trace_replay import ReplayResult, replay_async
from llmcap.sizing.params import SloParams
from llmcap.sizing.slo import goodput
from llmcap.trace import mean_rate, write_table
from llmcap.trace.clean import CleanReport
from llmcap.trace.synth import spread_ties

REPLAY = ReplayParams()  # the replay stage's knobs: this command's defaults where they are the same knob


def outcome(summary: dict[str, Any], max_failed: float, attainment_target: float) -> tuple[int, str]:
    """The exit code of a summarized run and why (module docstring: the first that applies)."""
    st, n = summary["status"], summary["requests"]
    if not summary["send_valid"]:
        late = summary["send_lateness_ms"]
        return (
            exit_codes.INVALID,
            f"sends ran up to {late['max']:.0f} ms late (> {summary['max_lateness_ms']:.0f} ms): the client's latency, not the server's",
        )
    code, why = exit_codes.served(n, st["ok"], max_failed)
    if code:
        return code, f"{why} ({st['rejected']:,} rejected, {st['unfinished']:,} unfinished)"
    slo = summary.get("slo")
    if slo is not None and slo["attainment"] < attainment_target:
        return exit_codes.SLO_MISSED, f"SLO attainment {slo['attainment']:.1%} < --attainment {attainment_target:.1%}"
    return 0, why + ("" if slo is None else f"; SLO attainment {slo['attainment']:.1%}")


def _pct_ms(values: np.ndarray) -> dict[str, float | None]:
    v = values[np.isfinite(values)]
    if v.size == 0:
        return {"p50": None, "p90": None, "p99": None}
    p = np.percentile(v, [50, 90, 99]) * 1e3
    return {"p50": float(p[0]), "p90": float(p[1]), "p99": float(p[2])}


def summarize(result: ReplayResult, slo: SloParams | None, max_lateness_s: float) -> dict[str, Any]:
    """What a replay measured: statuses, latency percentiles (ITL over every token), send lateness, the
    verdict on the run's validity, and SLO attainment when targets are given."""
    rec = result.requests
    status = np.asarray(rec.column("status").to_numpy(zero_copy_only=False))
    col = lambda name: rec.column(name).to_numpy(zero_copy_only=False).astype(np.float64)  # noqa: E731
    ok = status == "ok"
    lateness = result.lateness_s
    out_tokens = int(np.asarray(rec.column("osl").to_numpy())[ok].sum())
    summary: dict[str, Any] = {
        "requests": int(rec.num_rows),
        "status": {s: int((status == s).sum()) for s in ("ok", "unfinished", "rejected")},
        "ttft_ms": _pct_ms(col("ttft_s")[ok]),
        "itl_ms": _pct_ms(result.itls),
        "tpot_ms": _pct_ms(col("tpot_s")[ok]),
        "e2e_ms": _pct_ms(col("e2e_s")[ok]),
        "output_tok_s": out_tokens / result.wall_s if result.wall_s > 0 else None,
        "wall_s": result.wall_s,
        "send_lateness_ms": {
            "p50": float(np.percentile(lateness, 50) * 1e3),
            "p99": float(np.percentile(lateness, 99) * 1e3),
            "max": float(lateness.max() * 1e3),
        }
        if lateness.size
        else None,
        "max_lateness_ms": max_lateness_s * 1e3,
        "client": {
            "processes": result.processes,
            "cpu_s": result.client_cpu_s,
            "cpu_us_per_request": result.client_cpu_s / rec.num_rows * 1e6 if rec.num_rows else None,
        },
    }
    late = float(lateness.max()) if lateness.size else 0.0
    summary["send_valid"] = late <= max_lateness_s
    if result.clients is not None:  # closed loop: no schedule to be late for
        summary["send_lateness_ms"], summary["send_valid"] = None, True
    if slo is not None:
        g = goodput(rec, slo)
        summary["slo"] = {
            "attainment": g.attainment,
            "goodput_rps": g.goodput_rps,
            "offered_rps": g.offered_rps,
            "requests_in_window": g.requests,
            "misses": g.misses,
        }
    return summary


@user_errors
def replay(
    endpoint: EndpointOpt,
    trace: ReplayTraceOpt,
    model: ServedModelOpt = None,
    request_rate: RequestRateOpt = None,
    rate_scale: RateScaleOpt = 1.0,
    max_concurrency: MaxConcurrencyOpt = None,
    max_requests: MaxRequestsOpt = None,
    slo_ttft_ms: SloTtftOpt = None,
    slo_itl_ms: SloItlOpt = None,
    max_lateness_ms: MaxLatenessOpt = REPLAY.max_lateness_ms,
    max_failed: MaxFailedOpt = 0.01,
    attainment: AttainmentOpt = SLO.attainment_target,
    timeout: TimeoutOpt = 600.0,
    max_drain: MaxDrainOpt = None,
    vocab_size: VocabSizeOpt = REPLAY.vocab_size,
    block_tokens: BlockTokensOpt = None,
    seed: SeedOpt = 0,
    api: ApiOpt = "completions",
    processes: ProcessesOpt = None,
    out: OutOpt = None,
    fmt: FormatOpt = "auto",
    time_unit: TimeUnitOpt = "auto",
    column: ColumnOpt = None,
    hash_block_size: BlockSizeOpt = None,
    generate_arrivals: GenerateArrivalsOpt = False,
    arrival_rate: ArrivalRateOpt = 1.0,
    duplicates: DuplicatesOpt = "by_id",
    api_key_env: ApiKeyEnvOpt = None,
    json_out: JsonOutOpt = False,
) -> None:
    """Replay TRACE open loop against ENDPOINT: every request accounted for, latencies, lateness, attainment.

    Exit codes: 0 ok; 3 INVALID (sends ran late: the client's latency); 4 UNREACHABLE (nothing served);
    5 FAILED (more than --max-failed rejected or unfinished); 6 SLO MISSED (attainment below --attainment)."""
    _check_options(rate_scale, request_rate, max_concurrency, processes, max_drain, max_lateness_ms, api, out)
    api_key = api_key_from_env(api_key_env)
    base, shown = endpoint.rstrip("/"), redact_url(endpoint.rstrip("/"))
    cleaned = read_trace_input(
        trace,
        fmt,
        time_unit,
        column,
        hash_block_size,
        generate_arrivals,
        arrival_rate,
        duplicates,
        announce=not json_out,
    )
    table = _selected(cleaned.trace, trace, max_requests, seed)
    scale = _rate_scale(table, rate_scale, request_rate, max_concurrency)
    slo = _slo(slo_ttft_ms, slo_itl_ms)
    model = model or first_served_model(base, shown, api_key)
    result = _run(
        base,
        model,
        table,
        scale,
        timeout,
        vocab_size,
        block_tokens or cleaned.report.block_size,
        seed,
        api_key,
        quiet=json_out,
        api=api,
        processes=processes,
        max_drain=max_drain,
        clients=max_concurrency,
    )
    summary = _summary(shown, model, table, scale, max_concurrency, result, slo, max_lateness_ms, cleaned.report)
    code = _judge(summary, max_concurrency, max_failed, attainment)
    _output(summary, result, out, json_out)
    if code:
        raise typer.Exit(code)


def _check_options(
    rate_scale: float,
    request_rate: float | None,
    max_concurrency: int | None,
    processes: int | None,
    max_drain: float | None,
    max_lateness_ms: float,
    api: str,
    out: Path | None,
) -> None:
    """The options' one-line errors, before the trace is read or the server asked."""
    positive("--rate-scale", rate_scale)
    if max_concurrency is not None:
        given = [
            o
            for o, v in (
                ("--request-rate", request_rate),
                ("--rate-scale", rate_scale != 1.0),
                ("--processes", processes),
                ("--max-drain", max_drain),
            )
            if v
        ]
        if given:
            raise LlmcapError(f"--max-concurrency replays closed loop, with no schedule: drop {', '.join(given)}")
    positive("--request-rate", request_rate)
    positive("--max-lateness-ms", max_lateness_ms)
    if api not in APIS:
        raise LlmcapError(f"--api must be one of {', '.join(APIS)}, not {api!r}")
    if out is not None and out.exists() and not out.is_dir():
        raise LlmcapError(f"{out}: is a file; --out names a directory")


def _selected(table: pa.Table, trace: Path, max_requests: int | None, seed: int) -> pa.Table:
    """The requests to replay: the first `max_requests`, ties in arrival time spread."""
    table = table if max_requests is None else table.slice(0, max_requests)
    # a clock coarser than the rate logs distinct requests at one tick: spread them within it, as simulate does
    table = spread_ties(table, np.random.default_rng(seed))
    if table.num_rows < 2:
        raise LlmcapError(f"{trace}: a replay needs at least 2 requests, {table.num_rows} selected")
    return table


def _slo(slo_ttft_ms: float | None, slo_itl_ms: float | None) -> SloParams | None:
    """The SLO to judge attainment against, when a target is given."""
    if slo_ttft_ms is None and slo_itl_ms is None:
        return None
    return validated(SloParams, ttft_ms=slo_ttft_ms, itl_ms=slo_itl_ms, **steady_window())


def _rate_scale(table: pa.Table, rate_scale: float, request_rate: float | None, max_concurrency: int | None) -> float:
    """The factor on the trace's arrival rate: --request-rate over the trace's mean rate, else --rate-scale."""
    scale = rate_scale if request_rate is None else request_rate / mean_rate(table)
    if max_concurrency is None:
        plausible_rate("the replay's mean rate", mean_rate(table) * scale)
    return scale


def _summary(
    endpoint: str,
    model: str,
    table: pa.Table,
    scale: float,
    max_concurrency: int | None,
    result: ReplayResult,
    slo: SloParams | None,
    max_lateness_ms: float,
    report: CleanReport,
) -> dict[str, Any]:
    """What the run offered (the loop and its mean rate), what came back (`summarize`) and what was read."""
    offered = (
        mean_rate(table) * scale if max_concurrency is None else table.num_rows / result.wall_s
    )  # closed loop: what the clients reached
    return {
        "endpoint": endpoint,
        "model": model,
        "mode": "open loop" if max_concurrency is None else "closed loop",
        "max_concurrency": max_concurrency,
        "rate_scale": scale,
        "mean_rate_rps": offered,
        **summarize(result, slo, max_lateness_ms / 1e3),
        "input_accounting": account_json(report),
    }


def _judge(summary: dict[str, Any], max_concurrency: int | None, max_failed: float, attainment: float) -> int:
    """Add the caveat of a closed loop and the run's outcome to `summary`; its exit code."""
    if max_concurrency is not None:
        summary["caveat"] = CAVEAT
    code, why = outcome(summary, max_failed, attainment)
    summary |= {
        "valid": code not in exit_codes.NOT_VALID,
        "exit_code": code,
        "outcome": exit_codes.NAMES[code],
        "outcome_reason": why,
    }
    return code


def _output(summary: dict[str, Any], result: ReplayResult, out: Path | None, json_out: bool) -> None:
    """The records and summary to --out, when given; the summary on stdout, as JSON or for people."""
    if out is not None:
        write_table(result.requests, out / "records.parquet")
        (out / "summary.json").write_text(dumps(summary, indent=2) + "\n", encoding="utf-8")
    if json_out:
        print_json(summary)
    else:
        _print(summary)


def _run(
    base: str,
    model: str,
    table,
    scale: float,
    timeout: float,
    vocab: int,
    block: int | None,
    seed: int,
    api_key: str | None,
    quiet: bool,
    api: str,
    processes: int | None,
    max_drain: float | None,
    clients: int | None,
) -> ReplayResult:
    kwargs: dict[str, Any] = dict(
        request_id=table.column("request_id").to_numpy(),
        rate_scale=scale,
        hash_ids=table.column("hash_ids").to_pylist(),
        block_tokens=block,
        vocab_size=vocab,
        seed=seed,
        timeout_s=timeout,
        api_key=api_key,
        api=api,
        processes=processes,
        max_drain_s=max_drain,
        clients=clients,
    )
    args = (
        base,
        model,
        table.column("arrival_s").to_numpy(),
        table.column("isl").to_numpy(),
        table.column("osl").to_numpy(),
    )
    if quiet:
        return asyncio.run(replay_async(*args, **kwargs))
    with Progress(
        "replaying", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err_console, transient=True
    ) as bar:
        task = bar.add_task("requests", total=table.num_rows)
        return asyncio.run(replay_async(*args, on_done=lambda: bar.advance(task), **kwargs))


def _print(s: dict[str, Any]) -> None:
    console = out_console()
    loop = "open loop" if s["max_concurrency"] is None else f"closed loop, {s['max_concurrency']} clients"
    t = Table(
        title=f"{s['model']} @ {s['endpoint']}: {s['requests']:,} requests at {s['mean_rate_rps']:.3g} req/s ({loop})"
    )
    for c in ("metric", "p50", "p90", "p99"):
        t.add_column(c, justify="right")
    for key in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
        t.add_row(key, *("-" if v is None else f"{v:,.1f}" for v in s[key].values()))
    console.print(t)
    st, late = s["status"], s["send_lateness_ms"]
    console.print(
        f"status: ok {st['ok']:,}, unfinished {st['unfinished']:,}, rejected {st['rejected']:,}; "
        f"output {s['output_tok_s'] or 0:,.0f} tok/s over {s['wall_s']:,.1f} s",
        highlight=False,
    )
    if late is not None:
        console.print(
            f"send lateness p50 {late['p50']:.1f} ms, p99 {late['p99']:.1f} ms, max {late['max']:.1f} ms "
            f"(bound {s['max_lateness_ms']:.0f} ms); client: {s['client']['processes']} process(es), "
            f"{s['client']['cpu_s']:.2f} CPU s",
            highlight=False,
        )
    if "caveat" in s:
        console.print(f"[yellow]{s['caveat']}[/]", highlight=False)
    if "slo" in s:
        g = s["slo"]
        console.print(
            f"SLO attainment {g['attainment']:.1%} of {g['requests_in_window']:,} steady-window requests; "
            f"misses {json.dumps(g['misses'])}",
            highlight=False,
        )
    if s["exit_code"]:
        console.print(f"[bold red]{s['outcome']}[/] (exit {s['exit_code']}): {s['outcome_reason']}", highlight=False)
