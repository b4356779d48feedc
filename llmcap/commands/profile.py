"""`llmcap profile --endpoint URL`: measure an OpenAI-compatible server, fit the step model, write the profile."""

from __future__ import annotations

from pathlib import Path
from statistics import median
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from llmcap import exit_codes
from llmcap.commands._common import out_console, print_json, user_errors
from llmcap.credentials import DEFAULT_API_KEY_ENV, api_key_from_env, redact_url
from llmcap.errors import FailedError, LlmcapError, UnreachableError

if TYPE_CHECKING:  # the command imports the profiler only when it runs (the CLI starts fast)
    from llmcap.live.profiler import EndpointMeasurement
    from llmcap.live.readiness import ReadyRecord
    from llmcap.perf.profile import Profile


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise LlmcapError(f"--{what} takes comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise LlmcapError(f"--{what} needs positive integers, got {text!r}")
    return values


def _shares(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.replace(" ", "").split(",") if v)
    except ValueError:
        raise LlmcapError(f"--cache-hit takes comma-separated shares, got {text!r}") from None
    if any(not 0 < v < 1 for v in values):
        raise LlmcapError(f"--cache-hit shares lie strictly between 0 and 1 (0 is always timed), got {text!r}")
    return values


#: httpx errors that mean nothing answered (refused, no route, no connection in time).
CONNECT_ERRORS = ("ConnectError", "ConnectTimeout")


EndpointOpt = Annotated[
    str,
    typer.Option(
        help="Base URL of an OpenAI-compatible streaming server, e.g. http://127.0.0.1:8000 "
        "(user:password@ in it is sent as basic auth and never printed)."
    ),
]
ServedModelOpt = Annotated[str | None, typer.Option(help="Served model name (default: the server's first model).")]
IslListOpt = Annotated[str, typer.Option(help="Prompt lengths in tokens, comma-separated.")]
ConcurrencyListOpt = Annotated[str, typer.Option(help="Concurrency levels, comma-separated.")]
CacheHitOpt = Annotated[
    str,
    typer.Option(
        help="Prefix-cache hit shares to time TTFT at besides 0, comma-separated (e.g. 0.5,0.9): "
        "a request alone whose leading blocks the one before it left cached."
    ),
]
BlockSizeOpt = Annotated[int, typer.Option(min=1, help="The engine's KV block (a cached prefix is whole blocks).")]
OslOpt = Annotated[int, typer.Option(min=2, help="Output tokens per request (exact: max_tokens + ignore_eos).")]
RepeatsOpt = Annotated[int, typer.Option(min=1, help="Runs per cell (medians across runs).")]
VocabSizeOpt = Annotated[int, typer.Option(min=8, help="Token ids are drawn from [4, vocab_size).")]
ChunkOpt = Annotated[int | None, typer.Option(help="The engine's prefill chunk (tokens per step), if known.")]
DeviceOpt = Annotated[str | None, typer.Option(help="Device SKU for the fingerprint, e.g. H100-SXM-80GB.")]
ServerTpOpt = Annotated[int, typer.Option(min=1, help="Tensor parallel degree of the server (fingerprint).")]
WeightQuantOpt = Annotated[
    str | None,
    typer.Option(help="The server's weight format, e.g. bf16, fp8 (fingerprint; `size --profile` matches on it)."),
]
KvDtypeOpt = Annotated[
    str | None,
    typer.Option(help="The server's KV cache dtype (fingerprint; default: what its /metrics tell, if anything)."),
]
OutDirOpt = Annotated[Path, typer.Option(help="Directory to write the profile into.")]
MaxFailedOpt = Annotated[
    float,
    typer.Option("--max-failed", min=0.0, max=1.0, help="Share of runs that may fail before the exit says FAILED (5)."),
]
JsonOutOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")]
ServeCmdOpt = Annotated[
    str | None,
    typer.Option(
        "--serve-cmd",
        metavar="CMD",
        help="Start the engine with this command line first (e.g. 'vllm serve MODEL --port 8000'), time its start → first healthy "
        "ENDPOINT/health (model-ready, recorded in the manifest), profile it, then stop it.",
    ),
]
ReadyTimeoutOpt = Annotated[
    float, typer.Option("--ready-timeout", min=1.0, help="Seconds --serve-cmd's engine may take to be healthy.")
]
ApiKeyEnvOpt = Annotated[
    str | None,
    typer.Option(
        "--api-key-env",
        metavar="NAME",
        help=f"Environment variable holding the endpoint's API key, sent as 'Authorization: Bearer' "
        f"(e.g. OPENAI_API_KEY; default: {DEFAULT_API_KEY_ENV} if set, else no key).",
    ),
]


@user_errors
def profile(
    endpoint: EndpointOpt,
    model: ServedModelOpt = None,
    isl: IslListOpt = "128,512,2048",
    concurrency: ConcurrencyListOpt = "1,4,16",
    cache_hit: CacheHitOpt = "",
    block_size: BlockSizeOpt = 16,
    osl: OslOpt = 128,
    repeats: RepeatsOpt = 3,
    vocab_size: VocabSizeOpt = 1000,
    max_num_batched_tokens: ChunkOpt = None,
    device: DeviceOpt = None,
    tp: ServerTpOpt = 1,
    weight_quant: WeightQuantOpt = None,
    kv_dtype: KvDtypeOpt = None,
    out: OutDirOpt = Path("profile"),
    max_failed: MaxFailedOpt = 0.0,
    json_out: JsonOutOpt = False,
    serve_cmd: ServeCmdOpt = None,
    ready_timeout: ReadyTimeoutOpt = 1800.0,
    api_key_env: ApiKeyEnvOpt = None,
) -> None:
    """Profile ENDPOINT over ISL x concurrency; write points/steps parquet, fit.json and fingerprint.json to OUT.
    With --serve-cmd, start the engine first and record its model-ready time (start → first healthy /health).

    Exit codes: 0 ok; 2 unusable options; 4 UNREACHABLE (no answer at all); 5 FAILED (more than --max-failed
    of the runs failed: the profile is written from the rest, or not at all when every run failed)."""
    from contextlib import nullcontext

    from llmcap.live.profiler import ProfileSpec, endpoint_fingerprint, measure_endpoint, to_profile
    from llmcap.live.readiness import given_endpoint, started_engine
    from llmcap.live.served import first_served_model

    api_key = api_key_from_env(api_key_env)
    base = endpoint.rstrip("/")
    shown = redact_url(base)  # everything printed below names the endpoint by this
    spec = ProfileSpec.grid(
        _ints(isl, "isl"),
        _ints(concurrency, "concurrency"),
        osl=osl,
        repeats=repeats,
        vocab_size=vocab_size,
        max_num_batched_tokens=max_num_batched_tokens,
        cache_hits=_shares(cache_hit),
        block_tokens=block_size,
    )
    with started_engine(serve_cmd, base, ready_timeout) if serve_cmd else nullcontext(given_endpoint()) as ready:
        model = model or first_served_model(base, shown, api_key)
        m = measure_endpoint(base, model, spec, progress=not json_out, api_key=api_key)
    _raise_if_nothing_answered(m, shown)
    code, why = exit_codes.served(len(m.runs), len(m.runs) - len(m.failed_runs), max_failed, what="runs")
    stated = {"quantization": weight_quant} | ({"kv_dtype": kv_dtype} if kv_dtype is not None else {})
    fp = endpoint_fingerprint(m, device_sku=device, device_count=tp, tp=tp, **stated)
    try:
        prof = to_profile(m, fp, ready=ready.to_dict())
    except ValueError as exc:
        raise LlmcapError(f"nothing to fit: {exc}") from None
    prof.write(out)
    if json_out:
        print_json(_summary(m, prof, ready, shown, model, out, code, why))
        if code:
            raise typer.Exit(code)
        return
    _print_report(m, prof, ready, shown, model, repeats, out)
    if code:
        out_console().print(
            f"[bold red]{exit_codes.NAMES[code]}[/] (exit {code}): {why}; the profile holds the runs that completed",
            highlight=False,
        )
        raise typer.Exit(code)


def _raise_if_nothing_answered(m: EndpointMeasurement, shown: str) -> None:
    """Every run failed: UNREACHABLE when nothing connected at all, else FAILED (no profile is written)."""
    if len(m.failed_runs) == len(m.runs):
        errors = [r.error for run in m.runs for r in run.results if r.error]
        why = f"every request to {shown} failed: {errors[0] if errors else 'no tokens came back'}"
        raise (UnreachableError if errors and all(e.startswith(CONNECT_ERRORS) for e in errors) else FailedError)(why)


def _summary(
    m: EndpointMeasurement, prof: Profile, ready: ReadyRecord, shown: str, model: str, out: Path, code: int, why: str
) -> dict[str, Any]:
    """The --json object."""
    fit = prof.fit
    assert fit is not None
    return {
        "endpoint": shown,
        "model": model,
        "engine_version": m.version,
        "out": str(out),
        "fingerprint_hash": prof.fingerprint_hash,
        "wall_s": round(m.wall_s, 2),
        "failed_runs": len(m.failed_runs),
        "fit": fit.to_dict(),
        "points": prof.points.to_pylist(),
        "ready": ready.to_dict(),
        "valid": code not in exit_codes.NOT_VALID,
        "exit_code": code,
        "outcome": exit_codes.NAMES[code],
        "outcome_reason": why,
    }


def _print_report(
    m: EndpointMeasurement, prof: Profile, ready: ReadyRecord, shown: str, model: str, repeats: int, out: Path
) -> None:
    """The cells, the cached-prefix probes, the fit and where the profile went, for people."""
    fit = prof.fit
    assert fit is not None
    console = out_console()
    table = Table(title=f"{model} @ {shown} (engine {m.version}) — medians over {repeats} runs")
    for col in ("ISL", "conc", "TTFT ms", "mean ITL ms", "ITL p99 ms", "runs"):
        table.add_column(col, justify="right")
    for cell in m.cells.values():
        ms = lambda v: "—" if v is None else f"{v * 1e3:.2f}"  # noqa: E731
        table.add_row(
            str(cell.isl),
            str(cell.concurrency),
            ms(cell.ttft_s),
            ms(cell.itl_mean_s),
            ms(cell.itl_p99_s),
            str(cell.repeats),
        )
    console.print(table)
    for (n, cached), ttfts in sorted(m.hit_probes.items()):
        cold = m.cells[(n, 1)].ttft_s if (n, 1) in m.cells else None
        console.print(
            f"ISL {n} with {cached:,} tokens cached ({cached / n:.0%}): TTFT {median(ttfts) * 1e3:.2f} ms over {len(ttfts)} "
            f"probe(s)" + (f" (cold {cold * 1e3:.2f} ms)" if cold else ""),
            highlight=False,
        )
    coef = fit.to_dict()["coefficients"]
    console.print(
        "fit (NNLS): "
        + ", ".join(f"{k}={v:.3g}" for k, v in coef.items())
        + f"; median |rel err| {fit.median_abs_rel_error:.1%}"
    )
    console.print(
        f"model ready {ready.model_ready_s:.1f} s after the engine's start (first healthy /health)"
        if ready.model_ready_s is not None
        else f"model ready: {ready.note}"
    )
    console.print(f"profile written to {out} (fingerprint {prof.fingerprint_hash[:12]})")
