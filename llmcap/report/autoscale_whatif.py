"""The autoscaling what-if as a report: a Markdown table, a summary dict and a plot of instances over the day.

Every figure is simulated (the plan's deployment on a synthesized day), never measured: the report says so.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from llmcap.sizing.autoscale_whatif import AutoscaleWhatIf, PlanOutcome, scale_up_points  # noqa: E402

_PNG_META = {"Software": "llmcap"}


def _row(p: PlanOutcome, target: float) -> dict[str, Any]:
    return {
        "plan": p.name,
        "floor_fraction": p.floor_fraction,
        "gpu_hours": p.gpu_hours,
        "instance_hours": p.replica_hours,
        "attainment": p.attainment,
        "worst_window_attainment": p.worst_window_attainment,
        "peak_instances": p.peak_replicas,
        "scale_ups": p.scale_ups,
        "keeps_target": p.keeps(target),
    }


def _targets(t: dict[str, float]) -> str:
    names = {"kv_usage": "KV usage", "running_per_replica": "requests running"}
    return ", ".join(f"{names.get(k, k)} {v:.3g}" for k, v in t.items()) or "none"


def _finite(x: float) -> float | None:
    return None if math.isnan(x) else x


def ready_points(w: AutoscaleWhatIf) -> dict[str, Any]:
    """T_ready's points after the ask, and each autoscaled plan's first scale-up as the four points of its timeline."""
    out: dict[str, Any] = {}
    if w.ready_s is not None:
        running, ready, admitted = w.ready_s
        out["after_ask_s"] = {
            "pod_running": _finite(running),
            "model_ready": _finite(ready),
            "router_admitted": admitted,
        }
    firsts = {}
    for p in (*w.autoscaled, *([w.flat] if w.flat else [])):
        ups = scale_up_points(p.log) if p.log is not None else []
        if ups:
            firsts[p.name] = {k: (_finite(v) if isinstance(v, float) else v) for k, v in ups[0].items()} | {
                "scale_ups_admitted": len(ups)
            }
    out["first_scale_up"] = firsts
    return out


def summary(w: AutoscaleWhatIf) -> dict[str, Any]:
    best = w.floor
    return {
        "simulated": True,
        "day": w.day.to_dict(),
        "forecast": {
            "kind": w.forecast.kind if w.forecast else "synthetic",
            "error": w.forecast.error if w.forecast else None,
            "note": w.forecast_note,
            "flat_plan": _row(w.flat, w.attainment_target) if w.flat else None,
        },
        "max_total_gpus": w.max_total_gpus,
        "scale_up": ready_points(w),
        "pools": {
            q.role: {
                "instance_rps": q.instance_rps,
                "gpus_per_instance": q.gpus_per_instance,
                "static_instances": w.static_counts[q.role],
                "reactive_targets": w.reactive_targets[q.role],
            }
            for q in w.pools
        },
        "attainment_target": w.attainment_target,
        "plans": [_row(p, w.attainment_target) for p in (w.static, *w.autoscaled)],
        "floor_that_keeps_attainment": None if best is None else best.floor_fraction,
        "gpu_hours_saved": w.saving,
    }


def markdown(w: AutoscaleWhatIf, plot: str | None = None) -> str:
    day = w.day
    pools = "; ".join(
        f"{q.role if q.role != 'both' else 'instances'}: G {q.instance_rps:.4g} req/s × {q.gpus_per_instance} GPU, "
        f"static {w.static_counts[q.role]}, reactive target {_targets(w.reactive_targets[q.role])}"
        for q in w.pools
    )
    lines = [
        "# Autoscaling what-if (simulated, not a measurement)",
        "",
        f"The chosen deployment on {day.describe()}. Static: ⌈peak ÷ G⌉ "
        "instances per pool all day. Autoscaled, each pool on its own: N_target = max(forecast floor × f, HPA-style reactive layer on waiting "
        "requests and a utilisation gauge), T_ready and a cold prefix cache on every new instance, start-up and drain paid for.",
        "",
        f"Pools — {pools}.",
        "",
        *forecast_lines(w),
        "| plan | GPU-hours | attainment | worst window | peak instances | scale-ups | keeps target |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for p in (w.static, *w.autoscaled, *([w.flat] if w.flat else [])):
        lines.append(
            f"| {p.name} | {p.gpu_hours:,.1f} | {p.attainment:.4f} | {p.worst_window_attainment:.4f} | {p.peak_replicas} | "
            f"{p.scale_ups} | {'yes' if p.keeps(w.attainment_target) else 'NO'} |"
        )
    lines.append("")
    best = w.floor
    if best is None:
        lines.append(
            f"No autoscaled plan keeps attainment {w.attainment_target:g}: serve this day statically, or raise the floor."
        )
    else:
        change = (
            f"{w.saving:.1%} fewer"
            if (w.saving or 0) > 0
            else f"{-(w.saving or 0):.1%} more: autoscaling does not pay here"
        )
        lines.append(
            f"Smallest floor that keeps attainment {w.attainment_target:g}: **{best.floor_fraction:g} × the forecast floor**, "
            f"{best.gpu_hours:,.1f} GPU-hours against {w.static.gpu_hours:,.1f} static ({change})."
        )
    versus = flat_comparison(w)
    if versus:
        lines.append(versus)
    if plot:
        lines += ["", f"![instances over the day]({plot})"]
    return "\n".join(lines) + "\n"


def flat_comparison(w: AutoscaleWhatIf) -> str | None:
    """The fitted floor against the flat one at the same fraction: fewer GPU-hours at no lower attainment beats it."""
    fitted = next((p for p in w.autoscaled if w.flat is not None and p.floor_fraction == w.flat.floor_fraction), None)
    if w.flat is None or fitted is None:
        return None
    beats = fitted.gpu_hours < w.flat.gpu_hours and fitted.attainment >= w.flat.attainment
    return (
        f"Fitted vs flat forecast at floor × {w.flat.floor_fraction:g}: {fitted.gpu_hours:,.1f} vs {w.flat.gpu_hours:,.1f} GPU-hours, "
        f"attainment {fitted.attainment:.4f} vs {w.flat.attainment:.4f} — the fitted floor {'beats' if beats else 'does NOT beat'} the flat one."
    )


def forecast_lines(w: AutoscaleWhatIf) -> list[str]:
    lines = [f"Forecast: {w.forecast.description if w.forecast else 'the day curve'}."]
    if w.forecast_note:
        lines.append(f"{w.forecast_note}.")
    if w.max_total_gpus is not None:
        static = sum(n * q.gpus_per_instance for q in w.pools for role, n in w.static_counts.items() if role == q.role)
        lines.append(
            f"The autoscaled pools share a budget of {w.max_total_gpus} GPUs: each keeps what it holds, the rest goes to the pool "
            f"with the larger unmet share of its target (ties: decode){f'; the static plan needs {static}, above it' if static > w.max_total_gpus else ''}."
        )
    r = ready_points(w)
    if "after_ask_s" in r:
        a = r["after_ask_s"]
        fmt = lambda x: "not known" if x is None else f"{x:,.0f} s"  # noqa: E731
        lines.append(
            f"T_ready {a['router_admitted']:,.0f} s after the target is set: pod running at {fmt(a['pod_running'])}, model ready "
            f"at {fmt(a['model_ready'])}, router admitted at {fmt(a['router_admitted'])} (params: autoscale.ready)."
        )
    for name, up in r["first_scale_up"].items():
        fmt = lambda x: "—" if x is None else f"{x:,.0f}"  # noqa: E731
        lines.append(
            f"{name}: first scale-up ({up['pool']}) target set {fmt(up['target_s'])} s → pod running {fmt(up['running_s'])} → model "
            f"ready {fmt(up['model_ready_s'])} → router admitted {fmt(up['admitted_s'])} s; {up['scale_ups_admitted']} admitted in all."
        )
    return [" ".join(lines), ""]


def plot_instances(w: AutoscaleWhatIf, path: Path) -> Path:
    """Instances (ready + starting, every pool) over the day per plan, with the rate curve."""
    fig, ax = plt.subplots(figsize=(9, 3.6))
    end = w.day.duration_s
    ax.step([0, end], [sum(w.static_counts.values())] * 2, where="post", color="k", lw=1.2, label="static")
    for p in (*w.autoscaled, *([w.flat] if w.flat else [])):
        assert p.log is not None
        ticks = p.log.ticks.to_pandas()
        total = (ticks.ready + ticks.starting).groupby(ticks.t_s).sum()
        ax.step(
            total.index.to_numpy(),
            total.to_numpy(),
            where="post",
            lw=0.9,
            label=f"{p.name} ({p.gpu_hours:,.0f} GPU-h, {p.attainment:.3f})",
        )
    ax.set_xlabel("time (s)")
    ax.set_ylabel("instances")
    rate = ax.twinx()
    t = np.linspace(0.0, end, 400)
    rate.plot(t, w.day.rate_at(t), color="grey", ls=":", lw=1.0)
    rate.set_ylabel("rate (req/s, dotted)")
    ax.legend(loc="upper right", fontsize=7)
    ax.set_title("simulated: instances over the what-if day")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata=_PNG_META)
    plt.close(fig)
    return path
