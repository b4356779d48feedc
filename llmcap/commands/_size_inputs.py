"""`llmcap size`'s inputs: the options turned into sizing params, the catalog grid, the engine presets, a candidates file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import typer

from llmcap.catalog import get_gpu
from llmcap.catalog.quant import kv_dtype_bytes, weight_format
from llmcap.commands._common import (
    given_options,
)
from llmcap.commands._goodput import (
    SIZE,
    SloTargets,
    check_itl_stat,
    parse_goodput,
    steady_window,
)
from llmcap.commands._trace_input import (
    plausible_rate,
    positive,
)
from llmcap.config import Params, load_params
from llmcap.engine_presets import EnginePreset, presets_for
from llmcap.errors import InputFileError, LlmcapError
from llmcap.policy_names import admission_option
from llmcap.sizing.params import ComputeParams, DistributionTarget, SizeParams, SloParams


def lengths_summary(isl: np.ndarray, osl: np.ndarray) -> dict:
    def stats(x: np.ndarray) -> dict:
        p = np.percentile(x, [50, 90, 99])
        return {
            "mean": float(x.mean()),
            "p50": float(p[0]),
            "p90": float(p[1]),
            "p99": float(p[2]),
            "max": float(x.max()),
        }

    return {"isl": stats(isl), "osl": stats(osl)}


def slo_targets(ttft_ms: float | None, itl_ms: float | None, goodput: list[str] | None) -> SloTargets:
    """SloParams' target fields from --slo-ttft-p99 / --slo-itl-p99 and --goodput (unset targets are None)."""
    targets = parse_goodput(goodput)
    for name, field, value in (("--slo-ttft-p99", "ttft_ms", ttft_ms), ("--slo-itl-p99", "itl_ms", itl_ms)):
        if value is not None:
            if field in targets:
                raise LlmcapError(
                    f"{name} and --goodput {field.removesuffix('_ms')}:MS both set the same target; give one"
                )
            targets[field] = value
    if not targets:
        raise LlmcapError(
            "no SLO target: give --goodput KEY:MS (ttft, tpot, e2el, itl) or --slo-ttft-p99 / --slo-itl-p99"
        )
    return SloTargets(
        ttft_ms=targets.get("ttft_ms"),
        itl_ms=targets.get("itl_ms"),
        tpot_ms=targets.get("tpot_ms"),
        e2e_ms=targets.get("e2e_ms"),
    )


def listed(values: list[str], option: str) -> list[str]:
    """An option given as comma lists and/or repeated (`--tp 1,2 --tp 4`), in order, without repeats."""
    items = [v.strip() for text in values for v in text.split(",")]
    if not items or not all(items):
        raise LlmcapError(f"{option} {','.join(values)!r}: an empty item; give comma-separated values")
    return list(dict.fromkeys(items))


def tp_degrees(values: list[str]) -> list[int]:
    items = listed(values, "--tp")
    if not all(v.isdigit() and int(v) >= 1 for v in items):
        raise LlmcapError(f"--tp {','.join(values)!r}: TP degrees are positive integers")
    return [int(v) for v in items]


def catalog_grid(
    gpu: list[str], weight_quant: list[str], kv_dtype: list[str], tp: list[str]
) -> tuple[list[str], list[str], list[str], list[int]]:
    """The --gpu/--weight-quant/--kv-dtype/--tp lists, each name checked against the catalog before any file is read
    (a typo fails in a second, not after the trace)."""
    gpus, quants, kv_dtypes = (
        listed(gpu, "--gpu"),
        listed(weight_quant, "--weight-quant"),
        listed(kv_dtype, "--kv-dtype"),
    )
    tps = tp_degrees(tp)
    for name in gpus:
        get_gpu(name)
    for q in quants:
        weight_format(q)
    for k in kv_dtypes:
        kv_dtype_bytes(k)
    return gpus, quants, kv_dtypes, tps


# the options --params replaces (its `size` section holds them), by the function's parameter names
SIZE_KNOBS = (
    "slo_ttft_p99",
    "slo_itl_p99",
    "goodput",
    "slo_percentile",
    "slo_availability",
    "itl_stat",
    "ttft_handoff",
    "target_rps",
    "ttft_per_1k_isl",
    "attainment",
    "shortlist",
    "excerpt",
    "workers",
    "dask_address",
    "admission_policy",
    "max_usd_per_hour",
    "tier",
)


def params_from_file(ctx: typer.Context, path: Path) -> Params:
    """The params file, after checking no option it replaces was given too (the file would silently win)."""
    given = [f"--{n.replace('_', '-')}" for n in given_options(ctx, SIZE_KNOBS)]
    if given:
        raise LlmcapError(
            f"--params {path} sets every sizing knob from its `size` section; drop {', '.join(given)} or --params"
        )
    return load_params(path)


def size_params_from_options(
    ttft_ms: float | None,
    itl_ms: float | None,
    goodput: list[str] | None,
    itl_stat: str,
    ttft_handoff: bool,
    target_rps: float | None,
    ttft_per_1k_isl: float,
    attainment: float,
    pd: bool,
    shortlist: int,
    excerpt: int,
    workers: int,
    dask_address: str | None,
    pools_split_isl: int | None,
    admission_policy: str,
    max_usd_per_hour: float | None = None,
    distribution: tuple[DistributionTarget, ...] = (),
    availability: float | None = None,
) -> SizeParams:
    """SizeParams from the command line's options."""
    targets = slo_targets(ttft_ms, itl_ms, goodput)
    admission_option(admission_policy)
    itl = check_itl_stat(itl_stat)
    positive("--target-rps", target_rps)
    if target_rps is not None:
        plausible_rate("--target-rps", target_rps)
    return SizeParams(
        slo=SloParams(
            **targets,
            ttft_ms_per_1k_isl=ttft_per_1k_isl,
            itl_stat=itl,
            ttft_includes_handoff=ttft_handoff,
            attainment_target=attainment,
            distribution=distribution,
            availability=availability,
            **steady_window(),
        ),
        search=SIZE.search,
        target_rps=target_rps,
        shortlist=shortlist,
        pd_prefill_shortlist=SIZE.pd_prefill_shortlist if pd else 0,
        excerpt_requests=excerpt,
        compute=ComputeParams(workers=workers, dask_address=dask_address),
        pools_split_isl=pools_split_isl,
        admission_policy=admission_policy,
        max_usd_per_hour=max_usd_per_hour,
    )


def engine_presets_for(
    engine: str | None, gpus: list[str] | None, candidates_file: Path | None
) -> dict[str, EnginePreset]:
    """Each GPU's preset of `engine` (none without --engine)."""
    if engine is None:
        return {}
    if gpus is None:
        raise LlmcapError(
            f"--engine sets the candidates' scheduler knobs; --candidates {candidates_file} already fixes them: give one"
        )
    return presets_for(engine, [get_gpu(g) for g in gpus])


def read_candidates(path: Path) -> pd.DataFrame:
    """An enumerated candidates table (the enumerate stage's candidates.parquet)."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path).to_pandas()
    except (OSError, pa.ArrowInvalid) as exc:
        raise InputFileError(path, f"not a readable candidates parquet ({exc})") from None
    if "feasible" not in table.columns:
        raise InputFileError(
            path, "not a candidates table: no `feasible` column (write one with the enumerate stage)", field="feasible"
        )
    return table
