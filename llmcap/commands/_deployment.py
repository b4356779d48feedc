"""The command line's options of one deployment (`simulate`, `twin serve`, `autoscale`, `rollout`, `size`): option
types only; what they describe and build is `llmcap.deployment`, whose `EngineOptions` defaults they take (`ENGINE`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

ModelOpt = Annotated[str, typer.Option("--model", "-m", help="catalog model name or path to config.json")]
GpuOpt = Annotated[str, typer.Option("--gpu", "-g", help="GPU name or alias (e.g. h100)")]
MaxModelLenOpt = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="longest prompt + output the engine accepts; longer requests are rejected (default: the model's max_position_embeddings)",
    ),
]
TpOpt = Annotated[int, typer.Option(min=1, help="tensor parallel degree of one replica")]
ReplicasOpt = Annotated[int, typer.Option(min=1, help="aggregated replicas (ignored with --pd)")]
RouterOpt = Annotated[str, typer.Option(help="round_robin | least_outstanding_tokens | power_of_two | prefix_aware")]
AdmissionOpt = Annotated[
    str,
    typer.Option(help="the engine's admission: vllm | trtllm-guaranteed-no-evict | trtllm-max-utilization | sglang"),
]
SchedulingOpt = Annotated[
    str,
    typer.Option(
        help="the waiting queue's order (vLLM --scheduling-policy): fcfs | priority (the "
        "trace's `priority` column, lower first; it also picks whom to preempt)"
    ),
]
PdOpt = Annotated[str | None, typer.Option("--pd", help="disaggregated: P:D prefill and decode replicas")]
FirstTokenFromOpt = Annotated[
    str,
    typer.Option(
        help="P/D: where TTFT ends: 'decode' = the first token the user sees, after the "
        "KV handoff (as `size` judges it), or 'prefill' = when the prefill instance computes it"
    ),
]
LinkGbpsOpt = Annotated[float, typer.Option(min=0.001, help="P/D: KV link bandwidth per prefill replica, GB/s")]
LinkLatencyOpt = Annotated[float, typer.Option(min=0.0, help="P/D: link latency, ms")]
QuantOpt = Annotated[str, typer.Option("--weight-quant", "--quant", help="weight format (bf16, fp8, ...)")]
KvDtypeOpt = Annotated[str, typer.Option(help="KV cache dtype")]
MaxNumSeqsOpt = Annotated[int, typer.Option(min=1)]
MaxBatchedOpt = Annotated[int, typer.Option(min=1)]
KvBlockSizeOpt = Annotated[int, typer.Option(min=1, help="tokens per KV block")]
NumBlocksOpt = Annotated[int | None, typer.Option(min=1, help="KV blocks per replica (default: from the memory plan)")]
ProfileOpt = Annotated[
    Path | None,
    typer.Option(
        "--profile",
        help="a profile directory written by `llmcap profile`: its fitted step model times the configuration "
        "it was measured on, instead of the roofline",
    ),
]
KvFromLogOpt = Annotated[
    Path | None,
    typer.Option(
        "--kv-from-log",
        help="an engine's startup log (vLLM: 'GPU KV cache size: N tokens'): sizing uses its KV capacity instead of "
        "the memory plan's for the configuration it ran (--profile's, else the one this search considers)",
    ),
]
GpuMemUtilOpt = Annotated[float, typer.Option(min=0.01, max=1.0)]
PrefixCachingOpt = Annotated[bool, typer.Option("--prefix-caching/--no-prefix-caching")]
HostBlocksOpt = Annotated[int, typer.Option(min=0, help="host-memory KV tier, blocks per replica")]
HostGbpsOpt = Annotated[float, typer.Option(min=0.001, help="host tier load bandwidth, GB/s")]
TierOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--tier",
        help="an offload tier of the prefix cache below the host tier, "
        "NAME:GB:GBps[:lookup_ms] per replica (e.g. ssd:2000:6:0.2, remote:20000:2:2); "
        "repeat, nearest first",
    ),
]
# P/D pools on different GPUs or layouts (a plan may pair H100 prefill with H200 decode); None: as the prefill pool
DecodeGpuOpt = Annotated[str | None, typer.Option(help="P/D: the decode pool's GPU (default: --gpu)")]
DecodeTpOpt = Annotated[int | None, typer.Option(min=1, help="P/D: the decode pool's TP (default: --tp)")]
DecodeMaxNumSeqsOpt = Annotated[
    int | None, typer.Option(min=1, help="P/D: the decode pool's max_num_seqs (default: --max-num-seqs)")
]
DecodeMaxBatchedOpt = Annotated[int | None, typer.Option(min=1, help="P/D: the decode pool's max_num_batched_tokens")]
DecodeNumBlocksOpt = Annotated[
    int | None, typer.Option(min=1, help="P/D: KV blocks per decode replica (default: its memory plan)")
]
