"""The live checks' fidelity table: per case and metric, the prediction, every repeat, their median and
spread, the error and the verdict of the repeat-envelope rule (llmcap.reconcile.repeatability).

Each check writes it before it asserts (so a failing run keeps its numbers) under
`.work/live-fidelity/<check>.{json,md}` and logs it to MLflow (experiment `llmcap-live-fidelity`, one run
per check, tagged with the commit), so accuracy can be followed across commits.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llmcap.reconcile.repeatability import EnvelopeVerdict

REPO = Path(__file__).resolve().parents[2]
OUT_DIR = REPO / ".work" / "live-fidelity"
EXPERIMENT = "llmcap-live-fidelity"


@dataclass(frozen=True)
class FidelityRow:
    case: str  # e.g. "rho 0.3 (2.9 req/s)" or "ISL 512 x 8"
    metric: str  # e.g. "ttft_p50"
    verdict: EnvelopeVerdict
    unscaled: float | None = None  # the prediction without in-situ scaling (printed beside)

    def as_dict(self) -> dict:
        v = self.verdict
        return {
            "case": self.case,
            "metric": self.metric,
            "predicted": list(v.predicted),
            "measured": list(v.measured),
            "median_measured": float(np.median(v.measured)),
            "spread_iqr_over_median": v.spread,
            "error": v.error,
            "agree": v.agree,
            "inside_range": v.inside_range,
            "passed": v.passed,
            "unscaled_predicted": self.unscaled,
            "reason": v.reason,
            **(
                {"band_low": list(v.band[0]), "band_high": list(v.band[1]), "band_width": v.band_width}
                if v.band
                else {}
            ),
        }


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def render(check: str, rows: list[FidelityRow], unit: str = "ms", scale: float = 1e3) -> str:
    head = (
        f"| case | metric | predicted {unit} | repeats {unit} | median {unit} | spread | error | verdict |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    lines = [f"# {check}", "", head]
    for r in rows:
        v = r.verdict
        pred = (
            f"{np.median(v.predicted) * scale:.2f}"
            if v.band is None
            else f"{np.median(v.band[0]) * scale:.2f}-{np.median(v.band[1]) * scale:.2f}"
        )
        if r.unscaled is not None:
            pred += f" (unscaled {r.unscaled * scale:.2f})"
        reps = ", ".join(f"{x * scale:.2f}" for x in v.measured)
        lines.append(
            f"| {r.case} | {r.metric} | {pred} | {reps} | {np.median(v.measured) * scale:.2f} | {v.spread:.1%} | "
            f"{v.error:+.1%} | {'pass' if v.passed else 'FAIL'} |"
        )
    return "\n".join(lines) + "\n"


def write_fidelity_table(
    check: str, rows: list[FidelityRow], context: dict, unit: str = "ms", scale: float = 1e3
) -> Path:
    """Write the table (json + markdown) under .work/live-fidelity/ and log it to MLflow; print the markdown."""
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    commit = _commit()
    doc = {"check": check, "commit": commit, "context": context, "rows": [r.as_dict() for r in rows]}
    json_path = OUT_DIR / f"{check}.json"
    json_path.write_text(json.dumps(doc, indent=2, default=float))
    md = render(check, rows, unit, scale)
    md_path = OUT_DIR / f"{check}.md"
    md_path.write_text(md)
    print("\n" + md)
    _log_mlflow(check, commit, rows, [json_path, md_path])
    return json_path


def _log_mlflow(check: str, commit: str, rows: list[FidelityRow], paths: list[Path]) -> None:
    import mlflow

    mlflow.set_tracking_uri(os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{REPO / '.work' / 'mlflow.db'}")
    if mlflow.get_experiment_by_name(EXPERIMENT) is None:
        mlflow.create_experiment(EXPERIMENT, artifact_location=(REPO / ".work" / "mlartifacts" / EXPERIMENT).as_uri())
    mlflow.set_experiment(EXPERIMENT)
    with mlflow.start_run(run_name=check, tags={"commit": commit, "check": check}):
        metrics = {"rows": len(rows), "passed": sum(r.verdict.passed for r in rows)}
        if rows:  # a check with yes/no verdicts only (the max rate) keeps them in its context
            metrics["max_abs_error"] = max(abs(r.verdict.error) for r in rows)
        mlflow.log_metrics(metrics)
        for p in paths:
            mlflow.log_artifact(str(p))
