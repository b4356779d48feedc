"""SLO options shared by `llmcap size`, `simulate`, `replay` and `autoscale`: vLLM's `--goodput KEY:MS` convention, and
their defaults, which are `SloParams`' own (`SLO`).

`vllm bench serve --goodput ttft:MS tpot:MS e2el:MS` counts a request as good when it meets every target
given: TTFT, TPOT (the request's mean gap after the first token) and end-to-end latency, in ms. The same
keys mean the same here, plus `itl:MS`, judged by `--itl-stat` (a per-request statistic of the request's
gaps, or a token-level percentile across the run). Repeat the option or give several pairs in one value.
"""

from __future__ import annotations

from typing import Annotated, TypedDict, get_args

import typer

from llmcap.errors import LlmcapError
from llmcap.sizing.params import DistMetric, DistributionTarget, ItlStat, SizeParams, SloParams

GOODPUT_KEYS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "e2el": "e2e_ms", "itl": "itl_ms"}  # vLLM name -> SloParams field
ITL_STATS: tuple[str, ...] = get_args(ItlStat)
SLO = SloParams()  # the SLO options' defaults: one definition for every command (tests/test_cli_defaults.py)
SIZE = SizeParams()  # size's own knobs (search, window, shortlists) where the command line does not set them


class SteadyWindow(TypedDict):
    """SloParams' window fields: the shares of a run's arrivals left out at its start and at its end."""

    warmup_frac: float
    drain_frac: float


def steady_window() -> SteadyWindow:
    """The warm-up and drain shares `size` judges a run by (SizeParams' SLO); `replay` judges its runs the same way."""
    return SteadyWindow(warmup_frac=SIZE.slo.warmup_frac, drain_frac=SIZE.slo.drain_frac)


class SloTargets(TypedDict):
    """SloParams' per-request target fields, each set or None (`SloParams(**targets)`)."""

    ttft_ms: float | None
    itl_ms: float | None
    tpot_ms: float | None
    e2e_ms: float | None


GoodputOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--goodput",
        help="SLO targets as vLLM's --goodput: KEY:MS with KEY ttft | tpot | e2el (vLLM's) | itl (judged by --itl-stat); "
        "repeat or space-separate, e.g. --goodput 'ttft:2000 tpot:50'",
    ),
]
ItlStatOpt = Annotated[
    str,
    typer.Option(
        "--itl-stat",
        help="how itl:MS is judged: per request p50 | p99 | max (worst gap) | mean (= TPOT), or token_p50 | token_p90 | "
        "token_p95 | token_p99 | token_p99.9 (percentile of every token's gap across the run, as vllm bench reports ITL)",
    ),
]


def parse_goodput(values: list[str] | None) -> dict[str, float]:
    """`["ttft:2000 tpot:50", "e2el:30000"]` -> {"ttft_ms": 2000.0, "tpot_ms": 50.0, "e2e_ms": 30000.0}."""
    out: dict[str, float] = {}
    for pair in " ".join(values or []).split():
        key, sep, ms = pair.partition(":")
        if not sep or key not in GOODPUT_KEYS:
            raise LlmcapError(f"--goodput {pair!r}: expected KEY:MS with KEY one of {', '.join(GOODPUT_KEYS)}")
        try:
            value = float(ms)
        except ValueError:
            raise LlmcapError(f"--goodput {pair!r}: {ms!r} is not a number of milliseconds") from None
        if not 0 < value < float("inf"):
            raise LlmcapError(f"--goodput {pair!r}: the target must be a positive, finite number of milliseconds")
        if GOODPUT_KEYS[key] in out:
            raise LlmcapError(f"--goodput: {key} is given twice")
        out[GOODPUT_KEYS[key]] = value
    return out


def check_itl_stat(stat: str) -> ItlStat:
    if stat not in ITL_STATS:
        raise LlmcapError(f"--itl-stat {stat!r}: expected one of {', '.join(ITL_STATS)}")
    return stat  # type: ignore[return-value]


SloPercentileOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--slo-percentile",
        help="a target on a run's distribution, METRIC:PNN:MS with METRIC ttft | tpot | e2e | queue | itl_p50 | itl_p99 | itl_max, "
        "e.g. ttft:p90:1000 beside --slo-ttft-p99 2000; repeatable; a run that misses one fails whatever its attainment",
    ),
]


def parse_percentiles(values: list[str] | None) -> tuple[DistributionTarget, ...]:
    """`["ttft:p90:1000"]` -> (DistributionTarget(metric="ttft", percentile=90, target_ms=1000),)."""
    out: list[DistributionTarget] = []
    for text in values or []:
        metric, _, rest = text.partition(":")
        pct, _, ms = rest.partition(":")
        try:
            target = DistributionTarget(metric=metric, percentile=float(pct.removeprefix("p")), target_ms=float(ms))  # type: ignore[arg-type]
        except ValueError as exc:  # pydantic's ValidationError and float()'s
            raise LlmcapError(
                f"--slo-percentile {text!r}: expected METRIC:PNN:MS, e.g. ttft:p90:1000 "
                f"(METRIC one of {', '.join(get_args(DistMetric))}, 0 < NN ≤ 100, MS > 0)"
            ) from exc
        if any((t.metric, t.percentile) == (target.metric, target.percentile) for t in out):
            raise LlmcapError(f"--slo-percentile: {metric} P{target.percentile:g} is given twice")
        out.append(target)
    return tuple(out)
