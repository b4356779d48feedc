"""`llmcap size`'s own options, declared once (the shared ones live beside the code that reads them)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

SizeTraceOpt = Annotated[
    Path, typer.Option("--trace", "-t", help="Request trace (any format `llmcap trace inspect` reads).")
]

ModelsOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--model",
        "-m",
        help="Catalog model name or a path to config.json / its directory (with --params: "
        "enumerate.model by default). A trace of several models: LABEL=MODEL for each of its `model` labels, a pool per model "
        "and the fleet's total.",
    ),
]

ClassByOpt = Annotated[
    str | None,
    typer.Option(
        "--class-by",
        help="tenant | feature: one model's traffic as a pool per value of that label, the fleet and the one-pool view.",
    ),
]

SloTtftP99Opt = Annotated[
    float | None,
    typer.Option(
        "--slo-ttft-p99",
        min=0.001,
        help="TTFT target (ms) that 99% (--attainment) of requests must meet (= --goodput ttft:MS).",
    ),
]

SloItlP99Opt = Annotated[
    float | None,
    typer.Option(
        "--slo-itl-p99",
        min=0.001,
        help="Inter-token latency target (ms), judged by --itl-stat (= --goodput itl:MS).",
    ),
]

TtftHandoffOpt = Annotated[
    bool,
    typer.Option(
        "--ttft-includes-handoff/--ttft-at-prefill",
        help="P/D: TTFT ends at the first token the user sees (after the KV handoff), or when prefill computes it.",
    ),
]

TargetRpsOpt = Annotated[
    float | None,
    typer.Option("--target-rps", "--request-rate", help="Planning rate (req/s); default: the trace's mean rate."),
]

TtftPer1kIslOpt = Annotated[
    float, typer.Option("--slo-ttft-per-1k-isl", min=0, help="Extra TTFT allowance (ms) per 1,000 prompt tokens.")
]

AttainmentOpt = Annotated[float, typer.Option(min=0.01, max=1.0, help="Share of requests that must meet every SLO.")]

SloAvailabilityOpt = Annotated[
    float | None,
    typer.Option(
        "--slo-availability",
        min=0.01,
        max=0.999999,
        help="Share of requests within the "
        "SLOs over the long run, with nodes failing and being repaired (params: headroom.node_mtbf_h, node_repair_h).",
    ),
]

GpuGridOpt = Annotated[
    list[str], typer.Option("--gpu", "-g", help="GPUs to consider: a comma list or the option repeated.")
]

WeightQuantGridOpt = Annotated[list[str], typer.Option(help="Weight formats to consider (comma list or repeated).")]

TpGridOpt = Annotated[list[str], typer.Option(help="TP degrees to consider (comma list or repeated).")]

KvDtypeGridOpt = Annotated[list[str], typer.Option(help="KV cache dtypes to consider (comma list or repeated).")]

EngineOpt = Annotated[
    str | None,
    typer.Option(
        help="vllm | sglang | trtllm: size for that engine's own defaults on each GPU "
        "(admission policy, chunk, max batch, KV block; sources in the output); an "
        "explicit --admission-policy still wins"
    ),
]

StepModelOpt = Annotated[
    Path | None,
    typer.Option(
        help="The profile stage's step_model.json (its profile and written-back corrections) instead of --profile."
    ),
]

ParamsFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--params",
        help="Take every sizing knob (SLOs, search, headroom, pools) from this params.yaml's `size` section, as the pipeline does.",
    ),
]

CandidatesFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--candidates",
        help="Size these enumerated candidates (the enumerate stage's parquet) instead of the --gpu/--tp/... grid.",
    ),
]

PoolsSplitIslOpt = Annotated[
    int | None,
    typer.Option(
        min=1, help="Also compare one shared pool with a pool per request class (prompts ≤ N tokens vs longer)."
    ),
]

PoolsSplitCapOpt = Annotated[
    float | None,
    typer.Option(
        min=1.0001, help="Or a pool for requests whose max_tokens exceeds this × the median output vs the rest."
    ),
]

AlsoPdOpt = Annotated[bool, typer.Option("--pd/--no-pd", help="Also size disaggregated prefill/decode deployments.")]

MaxUsdPerHourOpt = Annotated[
    float | None,
    typer.Option(
        min=0.01,
        help="Cost limit ($/h): no plan above it; when none below it passes every scenario, exit 1 with the closest miss.",
    ),
]

ShortlistOpt = Annotated[int, typer.Option(min=1, help="Aggregated candidates to simulate.")]

ExcerptOpt = Annotated[int, typer.Option(min=10, help="Requests replayed per search evaluation.")]

WorkersOpt = Annotated[int, typer.Option(min=1, help="Local worker processes for the search.")]

DaskAddressOpt = Annotated[str | None, typer.Option(help="Run the search on this Dask scheduler instead.")]

MaxLorasOpt = Annotated[
    int,
    typer.Option(
        min=0,
        help="LoRA adapters resident at once (vLLM --max-loras): their buffers on every "
        "rank leave less KV; 0 = no LoRA.",
    ),
]

MaxLoraRankOpt = Annotated[int, typer.Option(min=1, help="The largest adapter rank (vLLM --max-lora-rank).")]

SizeMaxModelLenOpt = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Longest prompt + output a deployment accepts (default: the trace's longest, "
        "within the model's max_position_embeddings); longer requests are rejected: SLO misses.",
    ),
]

ReportDirOpt = Annotated[Path | None, typer.Option(help="Write capacity.parquet/.md/.html and summary.json here.")]
