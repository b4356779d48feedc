"""Stage `profile` (step 3): the step-time model the plan uses, and where it came from.

    python -m stages.profile --catalog-dir llmcap/catalog/data --profile data/profiles/target
        --step-model data/processed/step_model.json --report-dir data/reports/profile

The target environment (params `profile` + `enumerate.model`) has a fingerprint. A stored profile
whose fingerprint equals it is reused. Otherwise the stored one is stale (the differing fields are
listed): with `profile.endpoint` set the endpoint is profiled afresh (written to the report dir),
without one the stage falls back to the roofline model and says so loudly — on stderr and as
`source: roofline-fallback` in step_model.json. The step-time corrections reconciliation wrote back
(`--corrections`, `llmcap correct`) are resolved by `profile.corrections_alias` per configuration and
recorded in step_model.json (`corrections`), which the size, autoscale and replay stages apply.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from stages._runner import path, stage_main
from stages.env import ROOT

ARGUMENTS = [
    ("--catalog-dir", path(help="holds gpus.yaml and models/")),
    ("--profile", path(help="the stored profile directory to reuse when its fingerprint matches")),
    (
        "--corrections",
        path(required=False, help="written-back step-time corrections, one file per configuration (`llmcap correct`)"),
    ),
    ("--step-model", path(help="output: step_model.json")),
    ("--report-dir", path()),
]
PROFILE_FILES = ("fingerprint.json", "points.parquet", "steps.parquet", "fit.json", "manifest.json")


def points_suite(gxe) -> list:
    """A profile table: positive grid keys, and every measured time positive."""
    times = ("ttft_s", "itl_mean_s", "itl_p50_s", "itl_p99_s")
    return [
        gxe.ExpectTableRowCountToBeBetween(min_value=1),
        *[gxe.ExpectColumnValuesToBeBetween(column=c, min_value=1) for c in ("isl", "osl", "concurrency", "repeats")],
        *[gxe.ExpectColumnValuesToBeBetween(column=c, min_value=0, strict_min=True) for c in times],
        gxe.ExpectColumnValuesToBeBetween(column="cache_hit", min_value=0, max_value=1),
    ]


def _loud(message: str) -> None:
    bar = "!" * 78
    print(f"{bar}\n[profile] {message}\n{bar}", file=sys.stderr)


def run(args: argparse.Namespace) -> str:
    from llmcap.catalog import load_model
    from llmcap.config import load_params
    from llmcap.live.target import measure_target, roofline_fallback, target_fingerprint
    from llmcap.perf import is_stale, read_profile
    from llmcap.perf.calibration import shipped_calibrations
    from llmcap.perf.corrections import describe, resolve_all
    from stages import tracking, validation

    all_params = load_params(args.params, catalog_dir=args.catalog_dir)
    params, model_name = all_params.profile, all_params.enumerate.model
    model = load_model(model_name, models_dir=args.catalog_dir / "models")
    current = target_fingerprint(params, model.name, args.catalog_dir)
    stored = read_profile(args.profile) if (args.profile / "fingerprint.json").exists() else None
    changes = is_stale(stored.fingerprint, current) if stored else None
    out = {
        "model": model.name,
        "fingerprint": current.model_dump(mode="json"),
        "fingerprint_hash": current.tags()["fingerprint.hash"],
        "stored_profile": str(args.profile),
        "stored_fingerprint_hash": stored.fingerprint_hash if stored else None,
        "stale": stored is None or bool(changes),
        "stale_fields": [c.__dict__ for c in changes or []],
    }
    args.report_dir.mkdir(parents=True, exist_ok=True)
    profile = None
    if stored is not None and not changes:
        out["source"], profile = "profile", stored
    elif params.endpoint:
        profile = measure_target(params, model.name, current)
        profile.write(args.report_dir / "measured")
        out["source"], out["measured_profile"] = "profile-measured", str(args.report_dir / "measured")
        out["measured_fingerprint_changes"] = [c.__dict__ for c in is_stale(current, profile.fingerprint)]
    else:
        why = "no stored profile" if stored is None else "stored profile is STALE: " + "; ".join(map(str, changes))
        _loud(
            f"{why}; no profile.endpoint to re-profile -> FALLING BACK TO THE ROOFLINE MODEL "
            f"({model.name} on {current.device_sku} TP{params.tp}). Set profile.endpoint to measure."
        )
        out["source"], out["step_model"] = "roofline-fallback", roofline_fallback(params, model, args.catalog_dir)
    check = None
    if profile is not None:
        out["step_model"] = profile.fit.to_dict() if profile.fit else None
        if profile.manifest.get("kv_capacity_tokens"):  # what the engine stated: sizing's KV budget (size.kv_budget)
            out["kv_capacity_tokens"] = int(profile.manifest["kv_capacity_tokens"])
        check = validation.validate(profile.points.to_pandas(), "profile_points", points_suite)
        check.write(args.report_dir / "validation.json")
    out["corrections"] = resolve_all(args.corrections, params.corrections_alias)
    # every roofline of a GPU listed here (the size stage's candidates too) uses that GPU's fitted efficiencies
    out["roofline_calibrations"] = {c.gpu: c.describe() for c in shipped_calibrations()}
    args.step_model.parent.mkdir(parents=True, exist_ok=True)
    args.step_model.write_text(json.dumps(out, indent=2, default=str) + "\n", encoding="utf-8")

    inputs = {"model_config": Path(model.source), "gpu_catalog": args.catalog_dir / "gpus.yaml"}
    if stored is not None:
        inputs["stored_profile"] = args.profile
    with tracking.stage_run(ROOT, "profile", {"profile": params.model_dump(mode="json")}, inputs) as mlflow:
        mlflow.set_tags(
            {
                **current.tags(),
                "source": out["source"],
                "stale": str(out["stale"]).lower(),
                "stale_fields": ",".join(c["field"] for c in out["stale_fields"]) or "none",
                "step_model.corrections": describe(out["corrections"]),
                "roofline.calibrations": ",".join(
                    f"{g}@{c['sha256'][:12]}" for g, c in out["roofline_calibrations"].items()
                )
                or "none",
            }
        )
        mlflow.log_artifact(str(args.step_model), artifact_path="profile")
        # the fitted efficiencies with their sources, as every plan of these GPUs used them
        for c in shipped_calibrations():
            mlflow.log_artifact(str(c.path), artifact_path=f"profile/roofline_calibration/{c.gpu}")
        if profile is not None:
            src = args.profile if out["source"] == "profile" else args.report_dir / "measured"
            for name in PROFILE_FILES:
                if (src / name).exists():
                    mlflow.log_artifact(str(src / name), artifact_path="profile/table")
            if profile.fit:
                mlflow.log_metrics(
                    {
                        "fit.median_abs_rel_error": profile.fit.median_abs_rel_error,
                        "fit.max_abs_rel_error": profile.fit.max_abs_rel_error,
                    }
                )
    if check is not None:
        validation.require(check)
    stale = (
        f"stale ({len(out['stale_fields'])} fields differ)"
        if stored and changes
        else ("no stored profile" if stored is None else "fresh")
    )
    return f"{model.name}: step model from {out['source'].upper()} [{stale}], corrections: {describe(out['corrections'])} → {args.step_model}"


def main(argv: list[str] | None = None) -> int:
    return stage_main("profile", __doc__, ARGUMENTS, run, argv)


if __name__ == "__main__":
    sys.exit(main())
