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
2(n-1)/n of the bytes at the link's bandwidth x comm_efficiency.
`fit` finds the knobs by robust least squares on log time (soft-L1) over the rows in the roofline's scope:
operations with at least `MIN_WORK_S` of work at the datasheet peaks, and every all-reduce. Smaller
kernels spend much of their time on a fixed cost the roofline does not model (launch, setup, tail), and
fitting them would pass that cost off as low efficiency for every large kernel; their error is reported
apart. `cross_validate` refits with each group of in-scope rows (one GEMM shape or model layer, one head
layout and prompt length, one decode batch, one all-reduce width) left out and predicts it: the error to
expect on an operation the fit has not seen. The fitted knobs are data
(`llmcap/catalog/data/calibration/<GPU>/roofline.yaml`, with their sources and the set's sha256), applied
by `calibrated_params` to every roofline of that GPU — except a knob group that predicts the GPU's
independent timings (`measured_ops.json`, never fitted) worse than the defaults do: there the defaults stay.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields, replace
from functools import cache
from pathlib import Path

import numpy as np
import yaml
from numpy.typing import NDArray

from llmcap.catalog.gpus import GpuSpec, get_gpu
from llmcap.perf.comm import link_for, ring_allreduce_time
from llmcap.perf.efficiency import RooflineParams, attention_half, matmul_efficiency

F64 = NDArray[np.float64]
CALIBRATION_DIR = Path(__file__).resolve().parents[1] / "catalog" / "data" / "calibration"
MATMUL_DTYPES = ("bf16", "fp8")
OPS = ("gemm", "attn_prefill", "attn_decode", "copy", "allreduce")
# bounds of the fitted knobs: per matmul dtype (max, half); attention (max, half); hbm; comm (efficiency, latency per step)
_MATMUL_BOUNDS = ((0.02, 1.0), (0.0, 8192.0))
_CORE_BOUNDS = ((0.02, 1.0), (0.0, 65536.0), (0.05, 1.0))
_COMM_BOUNDS = ((0.05, 1.0), (0.0, 50e-6))
_ROBUST_SCALE = 0.1  # log-time residual where soft-L1 turns from quadratic to linear (~10%)
MIN_WORK_S = 50e-6  # the roofline's scope: operations whose work takes this long at the datasheet peaks


@dataclass(frozen=True)
class OpRows:
    """The timed operations of one calibration set, as arrays (one entry per row)."""

    op: NDArray[np.str_]
    dtype: NDArray[np.str_]
    group: NDArray[np.str_]  # what cross-validation leaves out together
    tokens: F64  # GEMM rows or prefill tokens (1 for the others)
    ranks: F64  # GPUs of an all-reduce (1 for the others)
    flops: F64
    nbytes: F64
    time_s: F64

    def __len__(self) -> int:
        return int(self.time_s.size)

    def subset(self, keep: NDArray[np.bool_]) -> OpRows:
        return OpRows(*(getattr(self, f.name)[keep] for f in fields(self)))

    def with_times(self, time_s: F64) -> OpRows:
        return replace(self, time_s=np.asarray(time_s, dtype=np.float64))


def _group(r: dict) -> str:
    """A row's cross-validation group: its own `group`, or for measure_ops.py rows one layer / length / batch."""
    if "group" in r:
        return str(r["group"])
    if r["op"] == "gemm":
        return f"gemm {r['dtype']} {r['model']} tp{r['tp']} {r['layer']}"
    if r["op"] == "attn_prefill":
        return f"attn_prefill T={r['tokens']}"
    if r["op"] == "attn_decode":
        return f"attn_decode B={r['batch']}"
    return r["op"]


def load_rows(path: Path) -> tuple[OpRows, dict]:
    """(timed rows, the set's environment) of a calibration set; untimed rows (a refused shape) are left out."""
    doc = json.loads(Path(path).read_text())
    rows = [r for r in doc["rows"] if "time_s" in r and r["op"] in OPS and (r["op"] != "gemm" or r["dtype"] in MATMUL_DTYPES)]
    if not rows:
        raise ValueError(f"{path}: no timed rows")
    tokens = [float(r.get("m", r.get("tokens", 1))) for r in rows]
    return OpRows(np.array([r["op"] for r in rows]), np.array([r["dtype"] for r in rows]), np.array([_group(r) for r in rows]),
                  np.array(tokens), np.array([float(r.get("ranks", 1)) for r in rows]), np.array([float(r["flops"]) for r in rows]),
                  np.array([float(r["bytes"]) for r in rows]), np.array([float(r["time_s"]) for r in rows])), doc.get("environment", {})


@dataclass(frozen=True)
class RooflineFit:
    """Fitted knobs of one GPU: per matmul dtype timed (efficiency max, half tokens), attention's, HBM's, and
    where all-reduces were timed the collective's (efficiency of the link, latency per ring step)."""

    matmul: dict[str, tuple[float, float]]
    attention_efficiency_max: float
    attention_half_tokens: float
    hbm_efficiency: float
    comm: tuple[float, float] | None = None

    @classmethod
    def from_params(cls, p: RooflineParams) -> RooflineFit:
        """The uncalibrated defaults in the same shape (one matmul curve for every dtype)."""
        return cls({d: (p.matmul_efficiency_max, p.matmul_half_tokens) for d in MATMUL_DTYPES}, p.attention_efficiency_max,
                   attention_half(p), p.hbm_efficiency, (p.comm_efficiency, p.scale_up_latency_s))

    def vector(self) -> F64:
        """Every knob it has, in the fit's order."""
        return _Layout(tuple(d for d in MATMUL_DTYPES if d in self.matmul), self.comm is not None).vector(self)

    def params(self, compute_dtype: str, base: RooflineParams | None = None) -> RooflineParams:
        """RooflineParams for rooflines whose GEMMs run in `compute_dtype` (bf16's curve for a dtype not fitted)."""
        mm_max, mm_half = self.matmul.get(compute_dtype, self.matmul["bf16"])
        update = {"matmul_efficiency_max": mm_max, "matmul_half_tokens": mm_half, "attention_efficiency_max": self.attention_efficiency_max,
                  "attention_half_tokens": self.attention_half_tokens, "hbm_efficiency": self.hbm_efficiency}
        if self.comm is not None:
            update |= {"comm_efficiency": self.comm[0], "scale_up_latency_s": self.comm[1]}
        return (base or RooflineParams()).model_copy(update=update)


@dataclass(frozen=True)
class _Layout:
    """Which knobs a fit moves: the matmul dtypes it has GEMMs of, and the collective's if it has all-reduces."""

    dtypes: tuple[str, ...]
    comm: bool

    @classmethod
    def of(cls, rows: OpRows) -> _Layout:
        return cls(tuple(d for d in MATMUL_DTYPES if ((rows.op == "gemm") & (rows.dtype == d)).any()), bool((rows.op == "allreduce").any()))

    def bounds(self) -> tuple[list[float], list[float]]:
        b = [*_MATMUL_BOUNDS * len(self.dtypes), *_CORE_BOUNDS, *(_COMM_BOUNDS if self.comm else ())]
        return [lo for lo, _ in b], [hi for _, hi in b]

    def vector(self, f: RooflineFit) -> F64:
        return np.array([v for d in self.dtypes for v in f.matmul[d]]
                        + [f.attention_efficiency_max, f.attention_half_tokens, f.hbm_efficiency] + list(f.comm or () if self.comm else ()))

    def fit(self, x: F64) -> RooflineFit:
        n = 2 * len(self.dtypes)
        return RooflineFit({d: (float(x[2 * i]), float(x[2 * i + 1])) for i, d in enumerate(self.dtypes)},
                           float(x[n]), float(x[n + 1]), float(x[n + 2]), (float(x[n + 3]), float(x[n + 4])) if self.comm else None)


def predict(rows: OpRows, fit: RooflineFit, gpu: GpuSpec) -> F64:
    """The roofline's time for each row under `fit` (the formulas of the module docstring)."""
    bw = gpu.hbm_bandwidth_bytes_s * fit.hbm_efficiency
    memory = rows.nbytes / bw
    compute = np.zeros(len(rows))
    for d in MATMUL_DTYPES:
        sel = (rows.op == "gemm") & (rows.dtype == d)
        if sel.any():
            compute[sel] = rows.flops[sel] / (gpu.peak_flops(d) * matmul_efficiency(rows.tokens[sel], *fit.matmul.get(d, fit.matmul["bf16"])))
    bf16 = gpu.peak_flops("bf16")
    pre = rows.op == "attn_prefill"
    eff = matmul_efficiency(rows.tokens[pre], fit.attention_efficiency_max, fit.attention_half_tokens)
    compute[pre] = rows.flops[pre] / (bf16 * eff)
    dec = rows.op == "attn_decode"
    compute[dec] = rows.flops[dec] / (bf16 * fit.attention_efficiency_max)
    time = np.maximum(compute, memory)
    ar = rows.op == "allreduce"
    if ar.any():
        params = fit.params("bf16")
        for n in np.unique(rows.ranks[ar]):
            sel = ar & (rows.ranks == n)
            time[sel] = ring_allreduce_time(rows.nbytes[sel], int(n), link_for(gpu, int(n), params))
    return time


def ideal_time(rows: OpRows, gpu: GpuSpec) -> F64:
    """Each row's time at the datasheet peaks (every efficiency 1, no latency): the size of its work."""
    return predict(rows, RooflineFit({d: (1.0, 0.0) for d in MATMUL_DTYPES}, 1.0, 0.0, 1.0, (1.0, 0.0)), gpu)


def in_scope(rows: OpRows, gpu: GpuSpec) -> NDArray[np.bool_]:
    """Rows whose work takes at least `MIN_WORK_S` at the peaks, and every all-reduce (whose latency per step
    is a knob: small messages are what fit it). A kernel also has a fixed cost the roofline does not model
    (launch, setup, tail: about 5-15 us in the shipped sets), which would otherwise pass for low efficiency."""
    return (ideal_time(rows, gpu) >= MIN_WORK_S) | (rows.op == "allreduce")


def fit(rows: OpRows, gpu: GpuSpec, start: RooflineFit | None = None) -> RooflineFit:
    """The knobs that best predict the in-scope `rows` (robust least squares on log time, bounded to physical ranges)."""
    from scipy.optimize import least_squares  # only fitting needs it; every roofline imports this module

    rows = rows.subset(in_scope(rows, gpu))
    if len(rows) == 0:
        raise ValueError(f"no timed operation has {MIN_WORK_S * 1e6:g} us of work or more at the datasheet peaks")
    layout = _Layout.of(rows)
    lower, upper = layout.bounds()
    defaults = RooflineFit.from_params(RooflineParams())
    if start is not None:
        start = replace(start, matmul=defaults.matmul | start.matmul, comm=start.comm or defaults.comm)
    x0 = np.clip(layout.vector(start or defaults), np.array(lower) + 1e-12, np.array(upper) - 1e-12)
    log_t = np.log(rows.time_s)
    res = least_squares(lambda x: np.log(predict(rows, layout.fit(x), gpu)) - log_t, x0,
                        bounds=(lower, upper), loss="soft_l1", f_scale=_ROBUST_SCALE, x_scale="jac")
    return layout.fit(res.x)


def relative_errors(rows: OpRows, fit_: RooflineFit, gpu: GpuSpec) -> F64:
    """predicted / measured - 1 per row."""
    return predict(rows, fit_, gpu) / rows.time_s - 1.0


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
        return [{"op": o, "rows": n, "uncalibrated": u, "calibrated": c, "held_out": h}
                for o, n, u, c, h in zip(self.op, self.count, self.uncalibrated, self.in_sample, self.held_out, strict=True)]


BELOW_SCOPE = "below scope"


def cross_validate(rows: OpRows, gpu: GpuSpec, full: RooflineFit | None = None) -> CrossValidation:
    """Leave-one-group-out over the in-scope rows: each group predicted by a fit on all the others."""
    full = full or fit(rows, gpu)
    scope = in_scope(rows, gpu)
    held = np.full(len(rows), np.nan)
    groups = np.unique(rows.group[scope])
    for g in groups:
        out = scope & (rows.group == g)
        held[out] = relative_errors(rows.subset(out), fit(rows.subset(~out), gpu, start=full), gpu)
    base = relative_errors(rows, RooflineFit.from_params(RooflineParams()), gpu)
    cal = relative_errors(rows, full, gpu)
    sets = [(o, scope & (rows.op == o)) for o in OPS if (scope & (rows.op == o)).any()] + [("all", scope), (BELOW_SCOPE, ~scope)]
    sets = [(name, sel) for name, sel in sets if sel.any()]

    def med(e: F64) -> tuple[float, ...]:
        return tuple(float(np.median(np.abs(e[sel]))) for _, sel in sets)

    return CrossValidation(tuple(n for n, _ in sets), tuple(int(sel.sum()) for _, sel in sets), med(base), med(cal), med(held),
                           int(groups.size))


def _rounded(v: float | int | str) -> float | int | str | None:
    """A figure for the YAML: 4 decimals, None for no figure (NaN)."""
    if isinstance(v, float):
        return None if np.isnan(v) else round(v, 4)
    return v


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def calibration_doc(gpu: GpuSpec, measurements: Path, environment: dict, fit_: RooflineFit, cv: CrossValidation) -> dict:
    """The YAML document of a calibration: the knobs, where they come from (each source's URL and licence), how well they predict."""
    header = json.loads(Path(measurements).read_text())
    source: dict = {"measurements": measurements.name, "sha256": sha256(measurements), "environment": environment,
                    "script": header.get("script", "benchmarks/gpu/measure_ops.py"), "fitted_by": "llmcap.perf.calibration.fit"}
    if "sources" in header:
        source["sources"] = [{"name": k, **{f: v[f] for f in ("url", "licence", "package", "file", "sha256", "engine", "kernel")}}
                             for k, v in header["sources"].items()]
    doc: dict = {
        "gpu": gpu.name,
        "source": source,
        "matmul": {d: {"efficiency_max": round(m, 6), "half_tokens": round(h, 4)} for d, (m, h) in fit_.matmul.items()},
        "attention": {"efficiency_max": round(fit_.attention_efficiency_max, 6), "half_tokens": round(fit_.attention_half_tokens, 4)},
        "hbm_efficiency": round(fit_.hbm_efficiency, 6),
    }
    if fit_.comm is not None:
        doc["comm"] = {"efficiency": round(fit_.comm[0], 6), "scale_up_latency_s": float(f"{fit_.comm[1]:.4g}")}
    return doc | {
        "scope": {"min_work_s": MIN_WORK_S, "note": "operations with less work at the datasheet peaks are dominated by a kernel's "
                  "fixed cost, which the roofline does not model: not fitted (all-reduces excepted: their latency per step is a knob)"},
        "median_abs_error": {r["op"]: {k: _rounded(v) for k, v in r.items() if k != "op"} for r in cv.rows()},
        "cross_validation_groups": cv.groups,
    }


#: A fit's knob groups and the operations that judge each on independent timings.
KNOB_GROUPS: dict[str, Callable[[OpRows], NDArray[np.bool_]]] = {
    "gemm:bf16": lambda r: (r.op == "gemm") & (r.dtype == "bf16"),
    "gemm:fp8": lambda r: (r.op == "gemm") & (r.dtype == "fp8"),
    "attention": lambda r: r.op == "attn_prefill",
    "hbm": lambda r: (r.op == "attn_decode") | (r.op == "copy"),  # decode attention and copies are bound by HBM bytes
    "comm": lambda r: r.op == "allreduce",
}
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
    """Each knob group with in-scope independent rows, judged on them (the fit against the documented defaults)."""
    rows = rows.subset(in_scope(rows, gpu))
    fitted = np.abs(relative_errors(rows, fit_, gpu))
    defaults = np.abs(relative_errors(rows, RooflineFit.from_params(RooflineParams()), gpu))
    return tuple(GroupCheck(g, int(sel.sum()), float(np.median(fitted[sel])), float(np.median(defaults[sel])))
                 for g, judged in KNOB_GROUPS.items() if (sel := judged(rows)).any())  # fmt: skip


def with_defaults(fit_: RooflineFit, groups: Iterable[str]) -> RooflineFit:
    """`fit_` with the named knob groups back at the documented defaults."""
    d = RooflineFit.from_params(RooflineParams())
    out = fit_
    for g in groups:
        if g.startswith("gemm:"):
            dtype = g.removeprefix("gemm:")
            out = replace(out, matmul=out.matmul | {dtype: d.matmul[dtype]})
        elif g == "attention":
            out = replace(out, attention_efficiency_max=d.attention_efficiency_max, attention_half_tokens=d.attention_half_tokens)
        elif g == "hbm":
            out = replace(out, hbm_efficiency=d.hbm_efficiency)
        elif g == "comm":
            out = replace(out, comm=d.comm)
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
            out |= {"independent": f"{self.path.parent.name}/{INDEPENDENT_FILE}", "independent_sha256": self.independent_sha256,
                    "not_applied": ", ".join(self.not_applied) or "none"}  # fmt: skip
        return out


def read_calibration(path: Path) -> Calibration:
    doc = yaml.safe_load(Path(path).read_text())
    try:
        comm = doc.get("comm")
        f = RooflineFit({d: (float(v["efficiency_max"]), float(v["half_tokens"])) for d, v in doc["matmul"].items()},
                        float(doc["attention"]["efficiency_max"]), float(doc["attention"]["half_tokens"]), float(doc["hbm_efficiency"]),
                        None if comm is None else (float(comm["efficiency"]), float(comm["scale_up_latency_s"])))
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
    return [c for p in sorted(CALIBRATION_DIR.glob("*/roofline.yaml")) if (c := shipped_calibration(p.parent.name)) is not None]


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
    found = [(float(e["uncalibrated"]), c.gpu) for c in shipped_calibrations() if (e := _median_errors(c.path).get("all", {})).get("uncalibrated") is not None]
    return max(found) if found else None
