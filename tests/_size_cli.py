"""The `llmcap size` command line the CLI tests share: a small aggregated search (one shortlisted candidate, short
excerpts) of fp8 weights and KV (`quant`) on H100, TTFT p99 ≤ 2 s and ITL p99 ≤ 100 ms, the summary as JSON on
stdout. Each test adds the options it is about."""

from __future__ import annotations

from pathlib import Path

SLOS = ("--slo-ttft-p99", "2000", "--slo-itl-p99", "100")


def size_args(
    *extra: str,
    trace: str | Path | None = None,
    models: tuple[str, ...] = ("Llama-3.1-8B",),
    tp: str = "1",
    quant: str = "fp8",
    excerpt: int = 100,
    slos: tuple[str, ...] = SLOS,
) -> list[str]:
    """`llmcap size` with the shared small search, then `extra` (no trace: the test names it in `extra`)."""
    return [
        "size",
        *(("--trace", str(trace)) if trace is not None else ()),
        *(arg for model in models for arg in ("--model", model)),
        *("--gpu", "h100", "--tp", tp, "--weight-quant", quant, "--kv-dtype", quant, "--no-pd"),
        *slos,
        *("--shortlist", "1", "--excerpt", str(excerpt), "--json"),
        *extra,
    ]
