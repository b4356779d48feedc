"""The roofline's efficiency knobs fitted per GPU to timed operations, and the cross-validation that says how far to trust them.

A calibration set is a JSON file of timed operations on one GPU, each row with the FLOPs and bytes the
roofline counts for it: either imported from the public per-operation timings of NVIDIA's
aiconfigurator-core (benchmarks/gpu/import_aiconfigurator.py: vLLM's GEMM, attention and all-reduce
kernels; every row names its source file, URL and licence) or timed by this project on a lent GPU
(benchmarks/gpu/measure_ops.py). The roofline predicts a row's time as
max(FLOPs / (peak x eff), bytes / (HBM bandwidth x hbm_efficiency)) with
- GEMMs: eff = matmul_efficiency_max[dtype] x T / (T + matmul_half_tokens[dtype]), T rows;
- prefill attention: eff = attention_efficiency_max x T / (T + attention_half_tokens);
- decode attention: eff = attention_efficiency_max (the bytes side binds);
- copy: the bytes side alone;
and an all-reduce over n GPUs as llmcap.perf.comm's ring: 2(n-1) steps of `scale_up_latency_s` plus
2(n-1)/n of the bytes at the link's bandwidth x comm_efficiency. Three step-time terms (`TERMS`) may be
added, each kept only where it lowers the held-out error (llmcap.perf.calibration_terms.select_terms):
vLLM's one-shot all-reduce for small messages (llmcap.perf.allreduce), a fixed cost per GEMM and per
attention kernel added to its roofline time, and decode attention's own KV-read efficiency in place of
hbm_efficiency.
`fit` finds the knobs by robust least squares on log time (soft-L1) over the rows in the roofline's scope:
operations with at least `MIN_WORK_S` of work at the datasheet peaks, and every all-reduce. Smaller
kernels spend much of their time on a fixed cost, and without that term fitting them would pass it off as
low efficiency for every large kernel: they are fitted only with the fixed cost, at `BELOW_SCOPE_WEIGHT`,
and their error is reported apart. `cross_validate` refits with each group of fitted rows (one GEMM shape or
model layer, one head layout and prompt length, one decode batch, one all-reduce width) left out and
predicts it: the error to expect on an operation the fit has not seen. The fitted knobs are data
(`llmcap/catalog/data/calibration/<GPU>/roofline.yaml`, with their sources and the set's sha256), applied
by `calibrated_params` to every roofline of that GPU — except a knob group that predicts the GPU's
independent timings (`measured_ops.json`, never fitted) worse than the defaults do: there the defaults stay.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

import numpy as np
import yaml
from numpy.typing import NDArray

from llmcap.catalog.gpus import GpuSpec, get_gpu
from llmcap.perf.calibration_model import (
    F64,
    MATMUL_DTYPES,
    MIN_WORK_S,
    OPS,
    TERM_TARGET,
    TERMS,
    KnobLayout,
    OpRows,
    RooflineFit,
    ideal_time,
    in_scope,
    load_rows,
    predict,
    relative_errors,
)
from llmcap.perf.efficiency import RooflineParams

# the set, the knobs and their prediction (llmcap.perf.calibration_model), re-exported: users reach them here
__all__ = [
    "MATMUL_DTYPES",
    "MIN_WORK_S",
    "OPS",
    "TERMS",
    "TERM_TARGET",
    "OpRows",
    "RooflineFit",
    "ideal_time",
    "in_scope",
    "load_rows",
    "predict",
    "relative_errors",
]
__all__ += [
    "BELOW_SCOPE",
    "BELOW_SCOPE_WEIGHT",
    "CALIBRATION_DIR",
    "INDEPENDENT_FILE",
    "KNOB_GROUPS",
    "Calibration",
    "CrossValidation",
    "GroupCheck",
    "calibrated_params",
    "cross_validate",
    "default_efficiencies_error",
    "fit",
    "fitted_rows",
    "held_out_error",
    "independent_check",
    "read_calibration",
    "sha256",
    "shipped_calibration",
    "shipped_calibrations",
    "with_defaults",
]

CALIBRATION_DIR = Path(__file__).resolve().parents[1] / "catalog" / "data" / "calibration"
_ROBUST_SCALE = 0.1  # log-time residual where soft-L1 turns from quadratic to linear (~10%)


def fitted_rows(rows: OpRows, gpu: GpuSpec, terms: Iterable[str] = ()) -> NDArray[np.bool_]:
    """The rows a fit with `terms` uses: the in-scope ones; with the fixed cost per kernel, which models what
    dominates small kernels, every row."""
    return np.ones(len(rows), dtype=bool) if "fixed" in set(terms) else in_scope(rows, gpu)


# With the fixed cost, rows below the scope are fitted too, each at this weight on its log residual: the small
# kernels outnumber the large ones ~3:1, and at full weight they would trade the large ones' accuracy for theirs
# (H100, in-scope held-out error: 12.1% without the fixed cost, 13.9% with it at weight 1; with the one-shot
# all-reduce too, 10.6% at weight 0.3 and 9.2% at 0.1).
BELOW_SCOPE_WEIGHT = 0.1


def fit(rows: OpRows, gpu: GpuSpec, start: RooflineFit | None = None, terms: Iterable[str] = ()) -> RooflineFit:
    """The knobs (with the step-time `terms` named, of TERMS) that best predict `rows` (the in-scope ones, or all
    with the fixed cost: `fitted_rows`), by robust least squares on log time, bounded to physical ranges."""
    from scipy.optimize import least_squares  # only fitting needs it; every roofline imports this module

    terms = tuple(terms)
    rows = rows.subset(fitted_rows(rows, gpu, terms))
    if len(rows) == 0:
        raise ValueError(f"no timed operation has {MIN_WORK_S * 1e6:g} us of work or more at the datasheet peaks")
    layout = KnobLayout.of(rows, terms)
    lower, upper = layout.bounds()
    defaults = RooflineFit.from_params(RooflineParams())
    seed = start or defaults
    seed = replace(
        seed,
        matmul=defaults.matmul | seed.matmul,
        comm=seed.comm or defaults.comm,
        kv_efficiency=seed.kv_efficiency or seed.hbm_efficiency,
        fixed_s=seed.fixed_s or _FIXED_START,
        oneshot_latency_s=seed.oneshot_latency_s or _ONESHOT_START,
    )
    x0 = np.clip(layout.vector(seed), np.array(lower) + 1e-12, np.array(upper) - 1e-12)
    log_t = np.log(rows.time_s)
    weight = np.where(in_scope(rows, gpu), 1.0, BELOW_SCOPE_WEIGHT)
    res = least_squares(
        lambda x: (np.log(predict(rows, layout.fit(x), gpu)) - log_t) * weight,
        x0,
        bounds=(lower, upper),
        loss="soft_l1",
        f_scale=_ROBUST_SCALE,
        x_scale="jac",
    )
    return layout.fit(res.x)


_FIXED_START = (3e-6, 8e-6)  # where a fit of the fixed costs starts (s): GEMM, attention
_ONESHOT_START = 4e-6


@dataclass(frozen=True)
class CrossValidation:
    """Per op (in scope): median |error| of the defaults, of the fit on every row, and of each row predicted by
    a fit without its group; then all in-scope rows, and the rows below the scope (not fitted, no held-out figure)."""

    op: tuple[str, ...]
    count: tuple[int, ...]
    uncalibrated: tuple[float, ...]
    in_sample: tuple[float, ...]
    held_out: tuple[float, ...]
    groups: int

    def rows(self) -> list[dict[str, float | int | str]]:
        return [
            {"op": o, "rows": n, "uncalibrated": u, "calibrated": c, "held_out": h}
            for o, n, u, c, h in zip(self.op, self.count, self.uncalibrated, self.in_sample, self.held_out, strict=True)
        ]


BELOW_SCOPE = "below scope"


def cross_validate(
    rows: OpRows, gpu: GpuSpec, full: RooflineFit | None = None, terms: Iterable[str] | None = None
) -> CrossValidation:
    """Leave-one-group-out over the fitted rows: each group predicted by a fit (with `terms`; default: `full`'s)
    on all the others."""
    terms = tuple(full.terms if terms is None and full is not None else terms or ())
    full = full or fit(rows, gpu, terms=terms)
    scope = in_scope(rows, gpu)
    fitted = fitted_rows(rows, gpu, terms)
    held = np.full(len(rows), np.nan)
    groups = np.unique(rows.group[fitted])
    for g in groups:
        out = fitted & (rows.group == g)
        held[out] = relative_errors(rows.subset(out), fit(rows.subset(~out), gpu, start=full, terms=terms), gpu)
    base = relative_errors(rows, RooflineFit.from_params(RooflineParams()), gpu)
    cal_ = relative_errors(rows, full, gpu)
    sets = [(o, scope & (rows.op == o)) for o in OPS if (scope & (rows.op == o)).any()] + [
        ("all", scope),
        (BELOW_SCOPE, ~scope),
    ]
    sets = [(name, sel) for name, sel in sets if sel.any()]

    def med(e: F64) -> tuple[float, ...]:
        return tuple(
            float(np.median(np.abs(e[sel]))) if not np.isnan(e[sel]).all() else float("nan") for _, sel in sets
        )

    return CrossValidation(
        tuple(n for n, _ in sets),
        tuple(int(sel.sum()) for _, sel in sets),
        med(base),
        med(cal_),
        med(held),
        int(groups.size),
    )


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


#: A fit's knob groups and the operations that judge each on independent timings.
KNOB_GROUPS: dict[str, Callable[[OpRows], NDArray[np.bool_]]] = {
    "gemm:bf16": lambda r: (r.op == "gemm") & (r.dtype == "bf16"),
    "gemm:fp8": lambda r: (r.op == "gemm") & (r.dtype == "fp8"),
    "attention": lambda r: r.op == "attn_prefill",
    "hbm": lambda r: (r.op == "attn_decode") | (r.op == "copy"),  # decode attention and copies are bound by HBM bytes
    "comm": lambda r: r.op == "allreduce",
    # the step-time terms: the fixed cost per kernel on every GEMM and attention kernel, the KV-read efficiency on decode
    # attention (the one-shot all-reduce goes with "comm")
    "kernel": lambda r: (r.op == "gemm") | (r.op == "attn_prefill") | (r.op == "attn_decode"),
    "kv": lambda r: r.op == "attn_decode",
}
_GROUP_TERM = {"kernel": "fixed", "kv": "kv"}  # a fit without the term has no such group to judge
INDEPENDENT_FILE = "measured_ops.json"  # timings of the GPU from another source than the fitted set, never fitted


@dataclass(frozen=True)
class GroupCheck:
    """One knob group judged on independent timings: median |relative error| of the fit and of the defaults."""

    group: str
    rows: int
    calibrated: float
    uncalibrated: float

    @property
    def applied(self) -> bool:
        """Where the fit predicts the independent timings no worse than the defaults, it is used."""
        return self.calibrated <= self.uncalibrated


def independent_check(fit_: RooflineFit, rows: OpRows, gpu: GpuSpec) -> tuple[GroupCheck, ...]:
    """Each knob group with in-scope independent rows, judged on them: an efficiency group as the fit against the
    documented defaults; a step-time term's group, in turn, as what it adds: the fit as applied so far (the
    efficiency groups and earlier terms that hold) with the term against the same without it."""
    rows = rows.subset(in_scope(rows, gpu))

    def errors(f: RooflineFit) -> F64:
        return np.abs(relative_errors(rows, f, gpu))

    judged = {
        g: sel
        for g, pick in KNOB_GROUPS.items()
        if (sel := pick(rows)).any() and _GROUP_TERM.get(g, "") in ("", *fit_.terms)
    }
    fitted, defaults = errors(fit_), errors(RooflineFit.from_params(RooflineParams()))
    checks = [
        GroupCheck(g, int(sel.sum()), float(np.median(fitted[sel])), float(np.median(defaults[sel])))
        for g, sel in judged.items()
        if g not in _GROUP_TERM
    ]
    base = with_defaults(fit_, (c.group for c in checks if not c.applied))
    for g, sel in judged.items():
        if g in _GROUP_TERM:
            without = with_defaults(base, [g])
            check = GroupCheck(
                g, int(sel.sum()), float(np.median(errors(base)[sel])), float(np.median(errors(without)[sel]))
            )
            checks.append(check)
            base = base if check.applied else without
    return tuple(checks)


def with_defaults(fit_: RooflineFit, groups: Iterable[str]) -> RooflineFit:
    """`fit_` with the named knob groups back at the documented defaults."""
    d = RooflineFit.from_params(RooflineParams())
    out = fit_
    for g in groups:
        if g.startswith("gemm:"):
            dtype = g.removeprefix("gemm:")
            out = replace(out, matmul=out.matmul | {dtype: d.matmul[dtype]})
        elif g == "attention":
            out = replace(
                out, attention_efficiency_max=d.attention_efficiency_max, attention_half_tokens=d.attention_half_tokens
            )
        elif g == "hbm":
            out = replace(out, hbm_efficiency=d.hbm_efficiency)
        elif g == "comm":
            out = replace(out, comm=d.comm, oneshot_latency_s=d.oneshot_latency_s)
        elif g == "kernel":
            out = replace(out, fixed_s=d.fixed_s)
        elif g == "kv":
            out = replace(out, kv_efficiency=d.kv_efficiency)
    return out


@dataclass(frozen=True)
class Calibration:
    """One GPU's shipped calibration: the knobs applied, the fit they come from, and its identity (the YAML's
    sha256). Where the GPU also has independent timings, a knob group the fit predicts them worse than the
    defaults is not applied: `fit` keeps the defaults there, `fitted` is the YAML's, `checks` say why."""

    gpu: str
    fit: RooflineFit
    sha256: str
    path: Path
    fitted: RooflineFit | None = None  # None: the same as `fit`
    checks: tuple[GroupCheck, ...] = ()
    independent_sha256: str | None = None  # of the independent timings `checks` were judged on

    @property
    def not_applied(self) -> tuple[str, ...]:
        return tuple(c.group for c in self.checks if not c.applied)

    def describe(self) -> dict[str, str]:
        out = {"gpu": self.gpu, "file": f"{self.path.parent.name}/{self.path.name}", "sha256": self.sha256}
        if self.independent_sha256 is not None:
            out |= {
                "independent": f"{self.path.parent.name}/{INDEPENDENT_FILE}",
                "independent_sha256": self.independent_sha256,
                "not_applied": ", ".join(self.not_applied) or "none",
            }
        return out


def read_calibration(path: Path) -> Calibration:
    doc = yaml.safe_load(Path(path).read_text())
    try:
        comm, kv, fixed = doc.get("comm"), doc.get("kv_hbm_efficiency"), doc.get("kernel_fixed_s")
        f = RooflineFit(
            {d: (float(v["efficiency_max"]), float(v["half_tokens"])) for d, v in doc["matmul"].items()},
            float(doc["attention"]["efficiency_max"]),
            float(doc["attention"]["half_tokens"]),
            float(doc["hbm_efficiency"]),
            None if comm is None else (float(comm["efficiency"]), float(comm["scale_up_latency_s"])),
            None if kv is None else float(kv),
            None if fixed is None else (float(fixed["gemm"]), float(fixed["attention"])),
            None if comm is None or comm.get("oneshot_latency_s") is None else float(comm["oneshot_latency_s"]),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: not a roofline calibration ({type(e).__name__}: {e})") from e
    return Calibration(str(doc["gpu"]), f, sha256(path), Path(path))


@cache
def shipped_calibration(gpu_name: str) -> Calibration | None:
    """The calibration shipped for catalog GPU `gpu_name`, if any, judged on its independent timings where it has them."""
    path = CALIBRATION_DIR / gpu_name / "roofline.yaml"
    if not path.is_file():
        return None
    cal = read_calibration(path)
    independent = path.parent / INDEPENDENT_FILE
    if not independent.is_file():
        return cal
    checks = independent_check(cal.fit, load_rows(independent)[0], get_gpu(gpu_name))
    applied = with_defaults(cal.fit, (c.group for c in checks if not c.applied))
    return replace(cal, fit=applied, fitted=cal.fit, checks=checks, independent_sha256=sha256(independent))


def calibrated_params(gpu: GpuSpec, compute_dtype: str) -> tuple[RooflineParams, Calibration | None]:
    """(RooflineParams for this GPU and GEMM dtype, the calibration they come from; None: the documented defaults)."""
    cal = shipped_calibration(gpu.name)
    return (RooflineParams(), None) if cal is None else (cal.fit.params(compute_dtype), cal)


def shipped_calibrations() -> list[Calibration]:
    """Every shipped calibration, by GPU name."""
    return [
        c
        for p in sorted(CALIBRATION_DIR.glob("*/roofline.yaml"))
        if (c := shipped_calibration(p.parent.name)) is not None
    ]


@cache
def _median_errors(path: Path) -> dict:
    return dict(yaml.safe_load(Path(path).read_text()).get("median_abs_error") or {})


def held_out_error(cal: Calibration) -> float | None:
    """The calibration's held-out median |relative error| over every in-scope operation (each group predicted by a fit
    that left it out); None when the file records none."""
    value = _median_errors(cal.path).get("all", {}).get("held_out")
    return None if value is None else float(value)


def default_efficiencies_error() -> tuple[float, str] | None:
    """The documented default efficiencies' median |relative error| on the shipped timings: the worst GPU's, and which."""
    found = [
        (float(e["uncalibrated"]), c.gpu)
        for c in shipped_calibrations()
        if (e := _median_errors(c.path).get("all", {})).get("uncalibrated") is not None
    ]
    return max(found) if found else None
