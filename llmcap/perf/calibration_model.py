"""A calibration set's timed operations (`OpRows`), the roofline's knobs (`RooflineFit`), and the time the
roofline predicts for each operation under them (`predict`; the formulas are llmcap.perf.calibration's).

llmcap.perf.calibration fits the knobs to the timings and ships them per GPU; this module holds what both the
fit and its checks evaluate.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from llmcap.catalog.gpus import GpuSpec
from llmcap.perf.allreduce import allreduce_time
from llmcap.perf.comm import link_for
from llmcap.perf.efficiency import RooflineParams, attention_half, matmul_efficiency
from llmcap.perf.model import F64

MATMUL_DTYPES = ("bf16", "fp8")
OPS = ("gemm", "attn_prefill", "attn_decode", "copy", "allreduce")
# bounds of the fitted knobs: per matmul dtype (max, half); attention (max, half); hbm; comm (efficiency, latency per step)
_MATMUL_BOUNDS = ((0.02, 1.0), (0.0, 8192.0))
_CORE_BOUNDS = ((0.02, 1.0), (0.0, 65536.0), (0.05, 1.0))
_COMM_BOUNDS = ((0.05, 1.0), (0.0, 50e-6))
_KV_BOUNDS = ((0.05, 1.0),)
_FIXED_BOUNDS = ((0.0, 50e-6), (0.0, 50e-6))
_ONESHOT_BOUNDS = ((0.0, 50e-6),)
#: The step-time terms beyond the efficiencies, each fitted and kept only where held-out error improves
#: (`select_terms`): decode attention's own KV-read efficiency, vLLM's one-shot all-reduce, a fixed cost per kernel.
TERMS = ("oneshot", "fixed", "kv")
TERM_TARGET = {"oneshot": "allreduce", "fixed": "all", "kv": "attn_decode"}  # the held-out figure each term must lower

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
    rows = [
        r
        for r in doc["rows"]
        if "time_s" in r and r["op"] in OPS and (r["op"] != "gemm" or r["dtype"] in MATMUL_DTYPES)
    ]
    if not rows:
        raise ValueError(f"{path}: no timed rows")
    tokens = [float(r.get("m", r.get("tokens", 1))) for r in rows]
    return OpRows(
        np.array([r["op"] for r in rows]),
        np.array([r["dtype"] for r in rows]),
        np.array([_group(r) for r in rows]),
        np.array(tokens),
        np.array([float(r.get("ranks", 1)) for r in rows]),
        np.array([float(r["flops"]) for r in rows]),
        np.array([float(r["bytes"]) for r in rows]),
        np.array([float(r["time_s"]) for r in rows]),
    ), doc.get("environment", {})


@dataclass(frozen=True)
class RooflineFit:
    """Fitted knobs of one GPU: per matmul dtype timed (efficiency max, half tokens), attention's, HBM's, and
    where all-reduces were timed the collective's (efficiency of the link, latency per ring step)."""

    matmul: dict[str, tuple[float, float]]
    attention_efficiency_max: float
    attention_half_tokens: float
    hbm_efficiency: float
    comm: tuple[float, float] | None = None
    kv_efficiency: float | None = None  # decode attention's KV reads; None: hbm_efficiency
    fixed_s: tuple[float, float] | None = None  # fixed cost per kernel: (GEMM, attention); None: none
    oneshot_latency_s: float | None = None  # vLLM's one-shot all-reduce; None: the ring at every size

    @classmethod
    def from_params(cls, p: RooflineParams) -> RooflineFit:
        """The uncalibrated defaults in the same shape (one matmul curve for every dtype)."""
        fixed = (p.gemm_kernel_s, p.attention_kernel_s) if p.gemm_kernel_s or p.attention_kernel_s else None
        return cls(
            {d: (p.matmul_efficiency_max, p.matmul_half_tokens) for d in MATMUL_DTYPES},
            p.attention_efficiency_max,
            attention_half(p),
            p.hbm_efficiency,
            (p.comm_efficiency, p.scale_up_latency_s),
            p.kv_hbm_efficiency,
            fixed,
            p.allreduce_oneshot_latency_s,
        )

    @property
    def terms(self) -> tuple[str, ...]:
        """The step-time terms (`TERMS`) this fit has."""
        have = {
            "kv": self.kv_efficiency is not None,
            "oneshot": self.oneshot_latency_s is not None,
            "fixed": self.fixed_s is not None,
        }
        return tuple(t for t in TERMS if have[t])

    def vector(self) -> F64:
        """Every knob it has, in the fit's order."""
        return KnobLayout(
            tuple(d for d in MATMUL_DTYPES if d in self.matmul), self.comm is not None, self.terms
        ).vector(self)

    def params(self, compute_dtype: str, base: RooflineParams | None = None) -> RooflineParams:
        """RooflineParams for rooflines whose GEMMs run in `compute_dtype` (bf16's curve for a dtype not fitted)."""
        mm_max, mm_half = self.matmul.get(compute_dtype, self.matmul["bf16"])
        update: dict[str, float | None] = {
            "matmul_efficiency_max": mm_max,
            "matmul_half_tokens": mm_half,
            "attention_efficiency_max": self.attention_efficiency_max,
            "attention_half_tokens": self.attention_half_tokens,
            "hbm_efficiency": self.hbm_efficiency,
        }
        if self.comm is not None:
            update |= {"comm_efficiency": self.comm[0], "scale_up_latency_s": self.comm[1]}
        update |= {
            "kv_hbm_efficiency": self.kv_efficiency,
            "allreduce_oneshot_latency_s": self.oneshot_latency_s,
            "gemm_kernel_s": (self.fixed_s or (0.0, 0.0))[0],
            "attention_kernel_s": (self.fixed_s or (0.0, 0.0))[1],
        }
        return (base or RooflineParams()).model_copy(update=update)


@dataclass(frozen=True)
class KnobLayout:
    """Which knobs a fit moves: the matmul dtypes it has GEMMs of, and the collective's if it has all-reduces."""

    dtypes: tuple[str, ...]
    comm: bool
    terms: tuple[str, ...] = ()  # of TERMS, in that order ("oneshot" only with `comm`)

    @classmethod
    def of(cls, rows: OpRows, terms: Iterable[str] = ()) -> KnobLayout:
        comm = bool((rows.op == "allreduce").any())
        return cls(
            tuple(d for d in MATMUL_DTYPES if ((rows.op == "gemm") & (rows.dtype == d)).any()),
            comm,
            tuple(t for t in TERMS if t in set(terms) and (comm or t != "oneshot")),
        )

    def bounds(self) -> tuple[list[float], list[float]]:
        b = [
            *_MATMUL_BOUNDS * len(self.dtypes),
            *_CORE_BOUNDS,
            *(_KV_BOUNDS if "kv" in self.terms else ()),
            *(_FIXED_BOUNDS if "fixed" in self.terms else ()),
            *(_COMM_BOUNDS if self.comm else ()),
            *(_ONESHOT_BOUNDS if "oneshot" in self.terms else ()),
        ]
        return [lo for lo, _ in b], [hi for _, hi in b]

    def vector(self, f: RooflineFit) -> F64:
        kv = [f.kv_efficiency if f.kv_efficiency is not None else f.hbm_efficiency] if "kv" in self.terms else []
        fixed = list(f.fixed_s or (0.0, 0.0)) if "fixed" in self.terms else []
        oneshot = [f.oneshot_latency_s or 0.0] if "oneshot" in self.terms else []
        return np.array(
            [v for d in self.dtypes for v in f.matmul[d]]
            + [f.attention_efficiency_max, f.attention_half_tokens, f.hbm_efficiency]
            + kv
            + fixed
            + list(f.comm or () if self.comm else ())
            + oneshot
        )

    def fit(self, x: F64) -> RooflineFit:
        it = iter(float(v) for v in x)
        matmul = {d: (next(it), next(it)) for d in self.dtypes}
        core = (next(it), next(it), next(it))
        kv = next(it) if "kv" in self.terms else None
        fixed = (next(it), next(it)) if "fixed" in self.terms else None
        comm = (next(it), next(it)) if self.comm else None
        oneshot = next(it) if "oneshot" in self.terms else None
        return RooflineFit(matmul, *core, comm, kv, fixed, oneshot)


def predict(rows: OpRows, fit: RooflineFit, gpu: GpuSpec) -> F64:
    """The roofline's time for each row under `fit` (the formulas of the module docstring)."""
    bw = gpu.hbm_bandwidth_bytes_s * fit.hbm_efficiency
    memory = rows.nbytes / bw
    dec = rows.op == "attn_decode"
    if fit.kv_efficiency is not None:
        memory[dec] = rows.nbytes[dec] / (gpu.hbm_bandwidth_bytes_s * fit.kv_efficiency)
    compute = np.zeros(len(rows))
    for d in MATMUL_DTYPES:
        sel = (rows.op == "gemm") & (rows.dtype == d)
        if sel.any():
            compute[sel] = rows.flops[sel] / (
                gpu.peak_flops(d) * matmul_efficiency(rows.tokens[sel], *fit.matmul.get(d, fit.matmul["bf16"]))
            )
    bf16 = gpu.peak_flops("bf16")
    pre = rows.op == "attn_prefill"
    eff = matmul_efficiency(rows.tokens[pre], fit.attention_efficiency_max, fit.attention_half_tokens)
    compute[pre] = rows.flops[pre] / (bf16 * eff)
    compute[dec] = rows.flops[dec] / (bf16 * fit.attention_efficiency_max)
    time = np.maximum(compute, memory)
    if fit.fixed_s is not None:
        time = time + np.where(rows.op == "gemm", fit.fixed_s[0], 0.0) + np.where(pre | dec, fit.fixed_s[1], 0.0)
    ar = rows.op == "allreduce"
    if ar.any():
        params = fit.params("bf16")
        for n in np.unique(rows.ranks[ar]):
            sel = ar & (rows.ranks == n)
            time[sel] = allreduce_time(rows.nbytes[sel], int(n), link_for(gpu, int(n), params), fit.oneshot_latency_s)
    return time


def ideal_time(rows: OpRows, gpu: GpuSpec) -> F64:
    """Each row's time at the datasheet peaks (every efficiency 1, no latency, no fixed cost): the size of its work."""
    return predict(rows, RooflineFit({d: (1.0, 0.0) for d in MATMUL_DTYPES}, 1.0, 0.0, 1.0, (1.0, 0.0)), gpu)


def in_scope(rows: OpRows, gpu: GpuSpec) -> NDArray[np.bool_]:
    """Rows whose work takes at least `MIN_WORK_S` at the peaks, and every all-reduce (whose latency per step
    is a knob: small messages are what fit it). A kernel also has a fixed cost the roofline does not model
    (launch, setup, tail: about 5-15 us in the shipped sets), which would otherwise pass for low efficiency."""
    return (ideal_time(rows, gpu) >= MIN_WORK_S) | (rows.op == "allreduce")


def relative_errors(rows: OpRows, fit_: RooflineFit, gpu: GpuSpec) -> F64:
    """predicted / measured - 1 per row."""
    return predict(rows, fit_, gpu) / rows.time_s - 1.0
