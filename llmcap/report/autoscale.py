"""The autoscaling what-if as a report: a Markdown table, a summary dict and a plot of instances over the day.

Every figure is simulated (the plan's deployment on a synthesized day), never measured: the report says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from llmcap.sizing.autoscale import AutoscaleWhatIf, PlanOutcome  # noqa: E402

_PNG_META = {"Software": "llmcap"}


def _row(p: PlanOutcome, target: float) -> dict[str, Any]:
    return {
        "plan": p.name, "floor_fraction": p.floor_fraction, "gpu_hours": p.gpu_hours, "instance_hours": p.replica_hours,
        "attainment": p.attainment, "worst_window_attainment": p.worst_window_attainment, "peak_instances": p.peak_replicas,
        "scale_ups": p.scale_ups, "keeps_target": p.keeps(target),
    }  # fmt: skip


def _targets(t: dict[str, float]) -> str:
    names = {"kv_usage": "KV usage", "running_per_replica": "requests running"}
    return ", ".join(f"{names.get(k, k)} {v:.3g}" for k, v in t.items()) or "none"


def summary(w: AutoscaleWhatIf) -> dict[str, Any]:
    best = w.floor
    return {
        "simulated": True,
        "day": {"mean_rps": w.day.mean_rps, "peak_rps": w.day.peak_rps, "amplitude": w.day.amplitude, "period_s": w.day.period_s,
                "duration_s": w.day.duration_s},
        "pools": {q.role: {"instance_rps": q.instance_rps, "gpus_per_instance": q.gpus_per_instance, "static_instances": w.static_counts[q.role],
                           "reactive_targets": w.reactive_targets[q.role]} for q in w.pools},
        "attainment_target": w.attainment_target,
        "plans": [_row(p, w.attainment_target) for p in (w.static, *w.autoscaled)],
        "floor_that_keeps_attainment": None if best is None else best.floor_fraction,
        "gpu_hours_saved": w.saving,
    }  # fmt: skip


def markdown(w: AutoscaleWhatIf, plot: str | None = None) -> str:
    day = w.day
    pools = "; ".join(f"{q.role if q.role != 'both' else 'instances'}: G {q.instance_rps:.4g} req/s × {q.gpus_per_instance} GPU, "
                      f"static {w.static_counts[q.role]}, reactive target {_targets(w.reactive_targets[q.role])}" for q in w.pools)  # fmt: skip
    lines = [
        "# Autoscaling what-if (simulated, not a measurement)",
        "",
        f"The chosen deployment on a synthesized diurnal day: rate = {day.mean_rps:.4g} × (1 + {day.amplitude:g} sin 2πt/{day.period_s:,.0f} s) "
        f"req/s over {day.duration_s:,.0f} s (peak {day.peak_rps:.4g} req/s), requests drawn whole from the trace. Static: ⌈peak ÷ G⌉ "
        "instances per pool all day. Autoscaled, each pool on its own: N_target = max(forecast floor × f, HPA-style reactive layer on waiting "
        "requests and a utilisation gauge), T_ready and a cold prefix cache on every new instance, start-up and drain paid for.",
        "",
        f"Pools — {pools}.",
        "",
        "| plan | GPU-hours | attainment | worst window | peak instances | scale-ups | keeps target |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for p in (w.static, *w.autoscaled):
        lines.append(f"| {p.name} | {p.gpu_hours:,.1f} | {p.attainment:.4f} | {p.worst_window_attainment:.4f} | {p.peak_replicas} | "
                     f"{p.scale_ups} | {'yes' if p.keeps(w.attainment_target) else 'NO'} |")  # fmt: skip
    lines.append("")
    best = w.floor
    if best is None:
        lines.append(f"No autoscaled plan keeps attainment {w.attainment_target:g}: serve this day statically, or raise the floor.")
    else:
        change = f"{w.saving:.1%} fewer" if (w.saving or 0) > 0 else f"{-(w.saving or 0):.1%} more: autoscaling does not pay here"
        lines.append(f"Smallest floor that keeps attainment {w.attainment_target:g}: **{best.floor_fraction:g} × the forecast floor**, "
                     f"{best.gpu_hours:,.1f} GPU-hours against {w.static.gpu_hours:,.1f} static ({change}).")  # fmt: skip
    if plot:
        lines += ["", f"![instances over the day]({plot})"]
    return "\n".join(lines) + "\n"


def plot_instances(w: AutoscaleWhatIf, path: Path) -> Path:
    """Instances (ready + starting, every pool) over the day per plan, with the rate curve."""
    fig, ax = plt.subplots(figsize=(9, 3.6))
    end = w.day.duration_s
    ax.step([0, end], [sum(w.static_counts.values())] * 2, where="post", color="k", lw=1.2, label="static")
    for p in w.autoscaled:
        assert p.log is not None
        ticks = p.log.ticks.to_pandas()
        total = (ticks.ready + ticks.starting).groupby(ticks.t_s).sum()
        ax.step(total.index.to_numpy(), total.to_numpy(), where="post", lw=0.9, label=f"{p.name} ({p.gpu_hours:,.0f} GPU-h, {p.attainment:.3f})")
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
