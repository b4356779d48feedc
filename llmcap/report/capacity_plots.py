"""Capacity-report plots as PNG bytes (embedded base64 in the HTML report).

matplotlib with the Agg backend; PNG metadata is stripped ("Software": None) and nothing depends on
the clock, so the same inputs give the same bytes. Figures are saved with a tight bounding box (no title,
label or legend is cut off); legends sit outside the data; axes whose values span decades are logarithmic.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
from numpy.typing import ArrayLike, NDArray  # noqa: E402

from llmcap.sizing.headroom import CapacityPlan  # noqa: E402
from llmcap.sizing.params import SloParams  # noqa: E402
from llmcap.sizing.search import SearchResult  # noqa: E402
from llmcap.sizing.slo import bounds, itl_column, itl_name  # noqa: E402

_PNG_META = {"Software": None}
_DPI = 100


def _png(fig: plt.Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI, metadata=_PNG_META, bbox_inches="tight", pad_inches=0.1)
    plt.close(fig)
    return buf.getvalue()


def _empty(ax: plt.Axes, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what}", ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()


def plot_attainment(curves: Mapping[str, SearchResult], target: float) -> bytes:
    """Mean attainment vs arrival rate per candidate; the knee (max feasible rate) marked."""
    fig, ax = plt.subplots(figsize=(7, 4.5))  # the legend (long configuration names) goes to the right of it
    for key in sorted(curves):
        res = curves[key]
        pts = res.curve()
        if not pts:
            continue
        x, y = zip(*pts, strict=True)
        (line,) = ax.plot(x, y, marker="o", ms=3, lw=1, label=f"{key} (λ* {res.max_rate:.3g})")
        if res.confirmation is not None:  # whole-trace runs: points only, they are not the excerpts' curve
            conf = [(p.rate, p.mean_attainment) for p in res.confirmation.points]
            ax.plot(*zip(*conf, strict=True), ls="none", marker="x", ms=5, color=line.get_color())
        best = res.best
        if res.max_rate > 0 and best is not None:
            ax.plot([res.max_rate], [best.mean_attainment], marker="*", ms=12, color=line.get_color())
    ax.axhline(target, color="k", ls="--", lw=0.8, label=f"target {target:g}")
    ax.set_xscale("log")
    ax.set_xlabel("arrival rate λ (req/s)")
    ax.set_ylabel("SLO attainment (mean over seeds)")
    ax.set_title("Attainment vs arrival rate\n(★ = max feasible rate, × = whole-trace confirmation)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return _png(fig)


def plot_goodput_per_gpu(table: pa.Table) -> bytes:
    """Goodput per GPU at each candidate's max feasible rate (the planning unit)."""
    keys = [
        f"{c} ({m})"
        for c, m in zip(table.column("candidate").to_pylist(), table.column("mode").to_pylist(), strict=True)
    ]
    vals = np.array([v or 0.0 for v in table.column("goodput_per_gpu").to_pylist()], dtype=float)
    fig, ax = plt.subplots(figsize=(7, 0.3 * max(len(keys), 3) + 1.2))
    if keys and (vals > 0).any():
        y = np.arange(len(keys))
        positive = vals[vals > 0]
        floor = positive.min() / 2  # bars start here: on a log axis they need a positive left edge
        ax.barh(y, np.where(vals > 0, vals - floor, 0.0), left=floor, color="tab:green")
        for yi, v in zip(y, vals, strict=True):
            ax.text(max(v, floor), float(yi), f" {v:.3g}", va="center", fontsize=7)
        ax.set_yticks(y, keys, fontsize=7)
        ax.invert_yaxis()
        if positive.max() / positive.min() > 10:  # spans a decade or more
            ax.set_xscale("log")
        ax.set_xlim(floor, positive.max() * 3)
        ax.set_xlabel("goodput per GPU (qualified req/s per GPU)")
    else:
        _empty(ax, "candidates")
    ax.set_title("Goodput per GPU at the max feasible rate")
    return _png(fig)


@dataclass(frozen=True)
class LatencyPanel:
    """One CDF panel: each request's value, divided by its own target where one bounds it (`own_target`: 1 is
    the target of every request) or in ms where none does."""

    label: str  # the x axis
    values: NDArray[np.float64]  # sorted, finished requests only
    own_target: bool


def _target_words(col: str, slo: SloParams, bound: float | NDArray[np.float64]) -> str:
    if col == "ttft_s" and slo.ttft_ms is not None and slo.ttft_ms_per_1k_isl > 0:
        return f"{slo.ttft_ms:g} ms + {slo.ttft_ms_per_1k_isl:g} ms per 1,000 prompt tokens"
    return f"{float(np.max(bound)) * 1e3:g} ms"


def itl_shown(slo: SloParams) -> tuple[str, str]:
    """(records column, name) of the ITL the CDFs show: the SLO's per-request statistic, else the per-request p99 gap."""
    col = itl_column(slo.itl_stat)
    return (col, itl_name(slo.itl_stat)) if col is not None else ("itl_p99_s", itl_name("p99"))


def latency_panels(records: pa.Table, slo: SloParams) -> list[LatencyPanel]:
    """TTFT and ITL (the SLO's per-request statistic) of each request against the target the sizing judged it
    by (`llmcap.sizing.slo.bounds`: TTFT's grows with the prompt when `ttft_ms_per_1k_isl` is set), so a
    request left of 1 met its own target whatever its length. A token-level ITL target bounds no request:
    the per-request p99 gap is shown in ms, unmarked."""
    own = bounds(records, slo)
    out = []
    for col, name in (("ttft_s", "TTFT"), itl_shown(slo)):
        v = records.column(col).to_numpy(zero_copy_only=False).astype(np.float64)
        bound = own.get(col)
        if bound is None:
            x, label = v * 1e3, f"{name} (ms)"
        else:
            x, label = (
                v / bound,
                f"{name} ÷ the request's own target\n(target {_target_words(col, slo, bound)}; 1 = at the target)",
            )
        out.append(LatencyPanel(label, np.sort(x[~np.isnan(x)]), bound is not None))
    return out


def plot_latency_cdfs(records: pa.Table | None, slo: SloParams) -> bytes:
    """CDFs of per-request TTFT and ITL at the chosen point, each against its own target (`latency_panels`)."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    panels = latency_panels(records, slo) if records is not None else []
    for k, ax in enumerate(axes):
        p = panels[k] if k < len(panels) else None
        if p is None or p.values.size == 0:
            _empty(ax, "latency values")
            continue
        v = p.values
        ax.step(v, np.arange(1, v.size + 1) / v.size, where="post", label=f"{v.size:,} requests")
        if p.own_target:
            ax.axvline(1.0, color="r", ls="--", lw=0.8, label=f"own target: {np.mean(v <= 1.0):.1%} within")
        if v[0] > 0 and v[-1] / v[0] > 30:  # spans decades
            ax.set_xscale("log")
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=2)
        ax.set_xlabel(p.label)
        ax.set_ylabel("fraction of requests ≤ x")
        ax.grid(alpha=0.3)
    fig.suptitle("Latency CDFs of the chosen deployment")
    fig.tight_layout()
    return _png(fig)


def plot_kv_usage(series: Mapping[str, tuple[ArrayLike, ArrayLike]] | None) -> bytes:
    """KV-cache usage (fraction of capacity) over time, one line per series (e.g. a pool's mean and max over replicas)."""
    fig, ax = plt.subplots(figsize=(8, 3.5))
    if not series:
        _empty(ax, "KV usage series")
    else:
        for name in sorted(series):
            t, u = series[name]
            ax.step(np.asarray(t, dtype=float), np.asarray(u, dtype=float), where="post", lw=0.8, label=name)
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("time (s)")
        ax.set_ylabel("KV usage")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ax.set_title("KV-cache usage over time")
    return _png(fig)


def plot_headroom(plan: CapacityPlan) -> bytes:
    """GPUs per pool stacked by reason: base, then each risk's headroom instances (× the pool's GPUs per instance)."""
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.7 * len(plan.pools)))
    colors = dict(
        zip(
            ("base", "traffic", "memory", "failure", "deployment", "control", "fit"),
            plt.rcParams["axes.prop_cycle"].by_key()["color"],
            strict=False,  # the first colours of a longer cycle
        )
    )
    seen: set[str] = set()
    for y, q in enumerate(plan.pools):
        g = q.pool.gpus_per_instance
        parts = [("base", q.base_instances)] + [(i.risk, i.instances) for i in q.items]
        parts.append(("fit", q.instances - q.base_instances - sum(i.instances for i in q.items)))  # simulation's change
        left = 0
        for label, n in parts:
            if n > 0:
                ax.barh([y], [n * g], left=left, color=colors[label], label=None if label in seen else label)
                ax.text(left + n * g / 2, y, str(n * g), ha="center", va="center", fontsize=8)
                seen.add(label)
                left += n * g
    ax.set_yticks(
        range(len(plan.pools)), [f"{q.name} ({q.instances} × {q.pool.gpus_per_instance} GPU)" for q in plan.pools]
    )
    ax.set_xlabel(f"GPUs — total {plan.total_gpus}")
    ax.set_title("Base and headroom per pool")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return _png(fig)
