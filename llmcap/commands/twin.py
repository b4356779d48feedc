"""`llmcap twin serve --model M --gpu G [--tp N] [--replicas R | --pd P:D] ...`: serve the simulated
deployment as an OpenAI-compatible endpoint (see `llmcap.twin`). Prints one line with its URL, serves
until SIGINT/SIGTERM (exit 0) or a simulated crash (exit 3).
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

import typer

from llmcap.catalog import get_gpu, load_model
from llmcap.commands._common import user_errors
from llmcap.commands._deployment import (
    DecodeGpuOpt,
    DecodeMaxBatchedOpt,
    DecodeMaxNumSeqsOpt,
    DecodeNumBlocksOpt,
    DecodeTpOpt,
    FirstTokenFromOpt,
    GpuMemUtilOpt,
    GpuOpt,
    HostBlocksOpt,
    HostGbpsOpt,
    KvBlockSizeOpt,
    KvDtypeOpt,
    LinkGbpsOpt,
    LinkLatencyOpt,
    MaxBatchedOpt,
    MaxModelLenOpt,
    MaxNumSeqsOpt,
    ModelOpt,
    NumBlocksOpt,
    PdOpt,
    PrefixCachingOpt,
    QuantOpt,
    ReplicasOpt,
    RouterOpt,
    TpOpt,
)
from llmcap.commands._twin_options import (
    CrashAfterOpt,
    DilationOpt,
    EngineVersionOpt,
    ErrorRateOpt,
    HostOpt,
    LongPromptSlowdownOpt,
    LongPromptTokensOpt,
    MaxInFlightOpt,
    PortOpt,
    ServedModelNameOpt,
    SlowdownOpt,
    StallAtOpt,
    StallSOpt,
    TwinSeedOpt,
)
from llmcap.deployment import (
    ENGINE,
    EngineOptions,
    check_choices,
    decode_step_model,
    deployment_label,
    sim_config,
    step_model,
)
from llmcap.errors import LlmcapError
from llmcap.twin import Twin, TwinSpec

CRASH_EXIT = 3

app = typer.Typer(
    help="The digital twin: the simulator behind an OpenAI-compatible API (not a measurement).", no_args_is_help=True
)


@app.command("serve")
@user_errors
def serve(
    model: ModelOpt,
    gpu: GpuOpt,
    tp: TpOpt = ENGINE.tp,
    replicas: ReplicasOpt = ENGINE.replicas,
    pd: PdOpt = None,
    router: RouterOpt = ENGINE.router,
    first_token_from: FirstTokenFromOpt = ENGINE.first_token_from,
    link_gbps: LinkGbpsOpt = ENGINE.link_gbps,
    link_latency_ms: LinkLatencyOpt = ENGINE.link_latency_ms,
    quant: QuantOpt = ENGINE.quant,
    kv_dtype: KvDtypeOpt = ENGINE.kv_dtype,
    max_num_seqs: MaxNumSeqsOpt = ENGINE.max_num_seqs,
    max_num_batched_tokens: MaxBatchedOpt = ENGINE.max_num_batched_tokens,
    block_size: KvBlockSizeOpt = ENGINE.block_size,
    num_blocks: NumBlocksOpt = None,
    gpu_memory_utilization: GpuMemUtilOpt = ENGINE.gpu_memory_utilization,
    prefix_caching: PrefixCachingOpt = ENGINE.prefix_caching,
    host_blocks: HostBlocksOpt = ENGINE.host_blocks,
    host_gbps: HostGbpsOpt = ENGINE.host_gbps,
    max_model_len: MaxModelLenOpt = None,
    decode_gpu: DecodeGpuOpt = None,
    decode_tp: DecodeTpOpt = None,
    decode_max_num_seqs: DecodeMaxNumSeqsOpt = None,
    decode_max_num_batched_tokens: DecodeMaxBatchedOpt = None,
    decode_num_blocks: DecodeNumBlocksOpt = None,
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 8000,
    served_model_name: ServedModelNameOpt = None,
    dilation: DilationOpt = TwinSpec.dilation,
    slowdown: SlowdownOpt = TwinSpec.slowdown,
    error_rate: ErrorRateOpt = TwinSpec.error_rate,
    crash_after: CrashAfterOpt = TwinSpec.crash_after,
    stall_s: StallSOpt = TwinSpec.stall_s,
    stall_at: StallAtOpt = TwinSpec.stall_at,
    long_prompt_slowdown: LongPromptSlowdownOpt = TwinSpec.long_prompt_slowdown,
    long_prompt_tokens: LongPromptTokensOpt = TwinSpec.long_prompt_tokens,
    seed: TwinSeedOpt = TwinSpec.seed,
    max_in_flight: MaxInFlightOpt = TwinSpec.slots,
    engine_version: EngineVersionOpt = TwinSpec.engine_version,
) -> None:
    """Serve MODEL on GPU (TP, replicas or P/D pools) as a simulated OpenAI-compatible endpoint."""
    opts = _engine_options(locals())  # first, while the locals are the parameters alone
    check_choices(opts)
    twin_spec, what = _twin_spec(
        model,
        gpu,
        opts,
        served_model_name,
        dilation=dilation,
        slowdown=slowdown,
        error_rate=error_rate,
        crash_after=crash_after,
        stall_s=stall_s,
        stall_at=stall_at,
        seed=seed,
        slots=max_in_flight,
        long_prompt_slowdown=long_prompt_slowdown,
        long_prompt_tokens=long_prompt_tokens,
        engine_version=engine_version,
    )
    served_before_crash = asyncio.run(_serve(twin_spec, host, port, what))
    if served_before_crash is not None:
        print(
            f"llmcap twin: simulated crash at completion request {served_before_crash} (injected fault)",
            file=sys.stderr,
        )
        raise typer.Exit(CRASH_EXIT)


def _engine_options(params: Mapping[str, Any]) -> EngineOptions:
    """The deployment's `EngineOptions` from the command's parameters: each engine option is the parameter named
    as its field (tests/test_cli_defaults.py holds them to the fields' defaults); the fields with no option keep
    their defaults."""
    return EngineOptions(**{f.name: params[f.name] for f in fields(EngineOptions) if f.name in params})


def _twin_spec(
    model: str,
    gpu: str,
    opts: EngineOptions,
    served_model_name: str | None,
    *,
    dilation: float,
    slowdown: float,
    error_rate: float,
    crash_after: int | None,
    stall_s: float,
    stall_at: float,
    seed: int,
    slots: int,
    long_prompt_slowdown: float,
    long_prompt_tokens: int,
    engine_version: str,
) -> tuple[TwinSpec, str]:
    """The twin of MODEL on GPU with these options and behaviour (`TwinSpec`'s fields), and a line saying what it
    serves."""
    spec = load_model(model)
    g = get_gpu(gpu)
    cfg = sim_config(spec, g, opts)
    label = deployment_label(cfg)
    tp = opts.tp
    twin_spec = TwinSpec(
        config=cfg,
        step_model=step_model(model, gpu, tp, opts.quant, opts.kv_dtype),
        served_model_name=served_model_name or spec.name,
        info={"model": spec.name, "gpu": g.name, "tp": str(tp), "deployment": label, "dilation": f"{dilation:g}"},
        vocab_size=spec.vocab_size,
        max_model_len=cfg.engine.max_model_len,
        dilation=dilation,
        decode_step_model=decode_step_model(model, gpu, opts),
        slowdown=slowdown,
        error_rate=error_rate,
        crash_after=crash_after,
        stall_s=stall_s,
        stall_at=stall_at,
        seed=seed,
        slots=slots,
        long_prompt_slowdown=long_prompt_slowdown,
        long_prompt_tokens=long_prompt_tokens,
        engine_version=engine_version,
    )
    return twin_spec, f"{spec.name} on {g.name} TP{tp}, {label}"


async def _serve(spec: TwinSpec, host: str, port: int, what: str) -> int | None:
    """Serve until a signal (None) or a simulated crash (the completion request that crashed it, counted
    from 1; the fault is set by --crash-after or later through the faults endpoint)."""
    twin = Twin(spec)
    try:
        url = await twin.start(host, port)
    except OSError as exc:
        raise LlmcapError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, twin.ended.set)
    print(f"llmcap twin (simulated, not a measurement): {what} at {url}", flush=True)
    await twin.ended.wait()
    crashed_at = twin.faults.requests if twin.crashed else None
    await twin.stop()
    return crashed_at
