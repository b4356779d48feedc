"""Which step-time terms a GPU's calibration keeps, and the YAML document that ships it.

`select_terms` tries each term of llmcap.perf.calibration.TERMS in turn (vLLM's one-shot all-reduce, a fixed
cost per kernel, decode attention's own KV-read efficiency) and keeps it only where leave-one-group-out
cross-validation says it predicts operations the fit has not seen better: its target op's held-out error
falls and the held-out error over every in-scope op does not rise. `calibration_doc` records the knobs, the
choice and both cross-validations.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llmcap.catalog.gpus import GpuSpec
from llmcap.perf.calibration import (
    BELOW_SCOPE_WEIGHT,
    MIN_WORK_S,
    TERM_TARGET,
    TERMS,
    CrossValidation,
    OpRows,
    RooflineFit,
    cross_validate,
    fit,
    sha256,
)


@dataclass(frozen=True)
class TermChoice:
    """Each step-time term tried in TERMS order: the held-out error of its target op and of every in-scope op,
    without and with it; kept where the target gets better and the whole gets no worse."""

    term: str
    target: str
    without: tuple[float, float]  # (target, all)
    with_: tuple[float, float]

    @property
    def kept(self) -> bool:
        return self.with_[0] < self.without[0] and self.with_[1] <= self.without[1]


def select_terms(
    rows: OpRows, gpu: GpuSpec
) -> tuple[RooflineFit, CrossValidation, CrossValidation, tuple[TermChoice, ...]]:
    """Forward selection of the step-time terms by held-out error: (the fit with the terms kept, its cross-validation,
    the cross-validation without any term, each term's choice)."""
    terms: tuple[str, ...] = ()
    base = cv = cross_validate(rows, gpu, terms=())
    choices = []
    for t in TERMS:
        if t == "oneshot" and not (rows.op == "allreduce").any():
            continue
        trial = cross_validate(rows, gpu, terms=(*terms, t))
        before, after = ({r["op"]: float(r["held_out"]) for r in c.rows()} for c in (cv, trial))
        choice = TermChoice(
            t, TERM_TARGET[t], (before[TERM_TARGET[t]], before["all"]), (after[TERM_TARGET[t]], after["all"])
        )
        choices.append(choice)
        if choice.kept:
            terms, cv = (*terms, t), trial
    return fit(rows, gpu, terms=terms), cv, base, tuple(choices)


def _rounded(v: float | int | str) -> float | int | str | None:
    """A figure for the YAML: 4 decimals, None for no figure (NaN)."""
    if isinstance(v, float):
        return None if np.isnan(v) else round(v, 4)
    return v


def calibration_doc(
    gpu: GpuSpec,
    measurements: Path,
    environment: dict,
    fit_: RooflineFit,
    cv: CrossValidation,
    base: CrossValidation | None = None,
    choices: tuple[TermChoice, ...] = (),
) -> dict:
    """The YAML document of a calibration: the knobs, where they come from (each source's URL and licence), how well they predict."""
    header = json.loads(Path(measurements).read_text())
    source: dict = {
        "measurements": measurements.name,
        "sha256": sha256(measurements),
        "environment": environment,
        "script": header.get("script", "benchmarks/gpu/measure_ops.py"),
        "fitted_by": "llmcap.perf.calibration.fit",
    }
    if "sources" in header:
        source["sources"] = [
            {"name": k, **{f: v[f] for f in ("url", "licence", "package", "file", "sha256", "engine", "kernel")}}
            for k, v in header["sources"].items()
        ]
    doc: dict = {
        "gpu": gpu.name,
        "source": source,
        "matmul": {d: {"efficiency_max": round(m, 6), "half_tokens": round(h, 4)} for d, (m, h) in fit_.matmul.items()},
        "attention": {
            "efficiency_max": round(fit_.attention_efficiency_max, 6),
            "half_tokens": round(fit_.attention_half_tokens, 4),
        },
        "hbm_efficiency": round(fit_.hbm_efficiency, 6),
    }
    if fit_.comm is not None:
        doc["comm"] = {"efficiency": round(fit_.comm[0], 6), "scale_up_latency_s": float(f"{fit_.comm[1]:.4g}")}
        if fit_.oneshot_latency_s is not None:
            doc["comm"]["oneshot_latency_s"] = float(f"{fit_.oneshot_latency_s:.4g}")
    if fit_.kv_efficiency is not None:
        doc["kv_hbm_efficiency"] = round(fit_.kv_efficiency, 6)
    if fit_.fixed_s is not None:
        doc["kernel_fixed_s"] = {"gemm": float(f"{fit_.fixed_s[0]:.4g}"), "attention": float(f"{fit_.fixed_s[1]:.4g}")}
    if choices:
        doc["terms"] = {
            c.term: {
                "kept": c.kept,
                "held_out": {
                    c.target: {"without": round(c.without[0], 4), "with": round(c.with_[0], 4)},
                    "all": {"without": round(c.without[1], 4), "with": round(c.with_[1], 4)},
                },
            }
            for c in choices
        }
    before = {r["op"]: r["held_out"] for r in base.rows()} if base is not None else {}
    return doc | {
        "scope": {
            "min_work_s": MIN_WORK_S,
            "note": "operations with less work at the datasheet peaks are dominated by a kernel's "
            "fixed cost: fitted only with that term (kernel_fixed_s), at weight below_scope_weight; all-reduces always "
            "(their latencies are knobs)",
            "below_scope_weight": BELOW_SCOPE_WEIGHT,
        },
        "median_abs_error": {
            r["op"]: {k: _rounded(v) for k, v in r.items() if k != "op"}
            | ({"held_out_without_terms": _rounded(before[r["op"]])} if r["op"] in before else {})
            for r in cv.rows()
        },
        "cross_validation_groups": cv.groups,
    }
