"""Prefect flow `correct`: write reconciliation's step-time corrections back, versioned.

    python -m flows.correct [--alias champion]          (what `llmcap correct` runs)

Reads the last plan's reconciliation (data/processed/reconcile.json) and, when it decided on
corrections, adds a version to the correction file of every configuration the plan's replay ran
(data/profiles/corrections/<registered model>.json: the alias's current corrections plus the new
ones, since the replay was predicted with them) and registers it in the MLflow model registry (one
registered model per configuration, the alias moved to the new version). A P/D plan's prefill and
decode configurations both get the factor: the replay measured the two together.

Nothing is re-planned here: commit the files and re-plan (`make plan`, `llmcap plan`); the profile stage
resolves the alias, the plan applies the corrections and records the version, and `llmcap diff` shows
what the correction changed in the decision.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import sys
from pathlib import Path

import yaml

from stages.env import ROOT, apply_defaults

apply_defaults()  # before Prefect/MLflow read their settings

from prefect import flow  # noqa: E402

from ops import registry  # noqa: E402
from stages import provenance, tracking  # noqa: E402

RECONCILE, SUMMARY, CANDIDATES, REPLAY = (
    "data/processed/reconcile.json",
    "data/reports/capacity/summary.json",
    "data/processed/candidates.parquet",
    "data/reports/replay/summary.json",
)


def corrections_dir(root: Path) -> Path:
    """Where the profile stage reads corrections from (its `--corrections` in dvc.yaml: dvc.yaml owns paths)."""
    cmd = shlex.split(yaml.safe_load((root / "dvc.yaml").read_text())["stages"]["profile"]["cmd"])
    return root / cmd[cmd.index("--corrections") + 1]


def plan_configurations(root: Path) -> list[dict]:
    """The (GPU, TP, PP, EP, weight quant, KV dtype) of every pool of the plan the replay ran."""
    import pyarrow.parquet as pq

    from llmcap.perf.corrections import CONFIGURATION_FIELDS
    from llmcap.sizing.autoscale_plan import ROLES
    from llmcap.sizing.units import candidate_row

    summary = json.loads((root / SUMMARY).read_text(encoding="utf-8"))
    candidates = pq.read_table(root / CANDIDATES).to_pandas()
    out = []
    for pool, q in summary["pool_plans"].items():
        row = candidate_row(candidates, q["configuration"], ROLES[pool])
        conf = {f: (int(row[f]) if f in ("tp", "pp", "ep") else str(row[f])) for f in CONFIGURATION_FIELDS}
        if conf not in out:
            out.append(conf)
    return out


@flow(name="correct")
def correct(root: str = str(ROOT), alias: str = "champion") -> dict:
    from llmcap.perf.corrections import StepCorrection, describe_factors, history_for, write_history

    base = Path(root)
    raw = (base / RECONCILE).read_bytes()
    rec = json.loads(raw)["reconciliation"]
    found = [StepCorrection.model_validate(c) for c in rec["corrections"]]
    decisions = sorted({b["decision"] for b in rec["buckets"]})
    if not found:
        return {"written": [], "decisions": decisions}
    replay = json.loads((base / REPLAY).read_text(encoding="utf-8"))
    measured_on = "digital twin" if replay.get("endpoint") is None else str(replay["endpoint"])
    git = provenance.git_state(base)
    tracking.use_experiment()
    written = []
    for conf in plan_configurations(base):
        history = history_for(corrections_dir(base), conf)
        v = history.add(found, hashlib.sha256(raw).hexdigest(), measured_on, alias, git["git.commit"])
        path = write_history(corrections_dir(base), history)  # the version's content, then its registry links
        run_id, number = registry.register(history, v.version, [path, base / RECONCILE], {**git, "alias": alias})
        history.record_registry(v.version, run_id, number)
        write_history(corrections_dir(base), history)
        factors = describe_factors([c.model_dump() for c in v.corrections])
        written.append(
            {
                "registered_model": history.registered_model,
                "version": v.version,
                "mlflow_version": number,
                "mlflow_run_id": run_id,
                "file": str(path.relative_to(base)),
                "alias": alias,
                "text": f"{history.registered_model}: v{v.version} ({factors}; registry version {number}, alias {alias})",
            }
        )
    return {"written": written, "decisions": decisions}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="flows.correct", description=__doc__.splitlines()[0])
    ap.add_argument("--project", type=Path, default=ROOT, help="the project directory")
    ap.add_argument(
        "--alias",
        default="champion",
        help="the alias the new versions get (params.yaml profile.corrections_alias applies one)",
    )
    args = ap.parse_args(argv)
    missing = [rel for rel in (RECONCILE, SUMMARY, CANDIDATES, REPLAY) if not (args.project / rel).is_file()]
    if missing:
        print(f"error: {', '.join(missing)} missing: run the plan first (`make plan`)", file=sys.stderr)
        return 2
    result = correct(str(args.project.resolve()), args.alias)
    if not result["written"]:
        print(
            f"nothing to write back: reconciliation decided no correction (bucket decisions: {', '.join(result['decisions']) or 'none'})"
        )
        return 0
    for w in result["written"]:
        print(f"{w['text']} → {w['file']}")
    print(
        "re-plan to apply them (`make plan` or `llmcap plan`), commit the files with dvc.lock, and compare the "
        "decisions with `llmcap diff`"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
