"""A plan's numbers as flat files that version-control diffs read: DVC metrics (JSON) and plot data (CSV)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pyarrow as pa


def write_plan_metrics(summary: dict[str, Any], table: pa.Table, metrics_path: Path, plot_path: Path) -> None:
    """The decision's numbers as DVC metrics (JSON) and each candidate's rates as DVC plot data (CSV), so
    `dvc metrics diff A B` and `dvc plots diff A B` compare two plans."""
    metrics = {
        k: summary[k]
        for k in ("gpus", "base_gpus", "instances", "base_instances", "usd_per_hour", "target_rps", "max_rps_per_unit")
    }
    metrics["pools"] = {
        name: {k: q[k] for k in ("instances", "base_instances", "gpus", "usd_per_hour", "per_instance_rps")}
        for name, q in summary["pool_plans"].items()
    }
    metrics_path.parent.mkdir(parents=True, exist_ok=True)
    metrics_path.write_text(json.dumps(metrics, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    plot_path.parent.mkdir(parents=True, exist_ok=True)
    with plot_path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(["configuration", "max_rps", "goodput_per_gpu", "gpus"])
        for r in table.select(["mode", "candidate", "max_rps", "goodput_per_gpu", "gpus"]).to_pylist():
            w.writerow(
                [
                    f"{r['mode']}: {r['candidate']}",
                    repr(r["max_rps"]),
                    "" if r["goodput_per_gpu"] is None else repr(r["goodput_per_gpu"]),
                    r["gpus"] or "",
                ]
            )
