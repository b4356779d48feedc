"""Provenance per pool of the chosen plan (issue 34, item 6): what each pool is and what sized it, in the capacity
summary (`llmcap.planning.pool_provenance`), the report's header and the MLflow tags (`ops.decision`), with an
unknown value said as "unknown", never "None"."""

from __future__ import annotations

from llmcap.planning import StepTimes, describe_provenance, pool_provenance
from ops.decision import pool_tags, step_model_tags

POOLS = {
    "prefill": {"configuration": "H100-SXM-80GB/fp8/kv-fp8/tp2pp1ep1/seqs32/mbt16384/blk16"},
    "decode": {"configuration": "H200-SXM-141GB/fp8/kv-fp8/tp4pp1ep1/seqs256/mbt2048/blk16"},
}
CALIBRATIONS = {"H100-SXM-80GB": {"file": "H100-SXM-80GB/roofline.yaml", "sha256": "504acc1c1ceba079"}}
# the profile target params.yaml describes (H100 TP4 bf16): no pool of the plan
TARGET = {
    "engine": "vllm",
    "engine_version": "0.12.0",
    "engine_commit": None,
    "driver_version": None,
    "runtime_version": None,
    "device_sku": "H100-SXM-80GB",
    "tp": 4,
    "pp": 1,
    "ep": 1,
    "quantization": "bf16",
    "kv_dtype": "bf16",
    "model_revision": None,
}


def test_a_roofline_plan_names_each_pools_configuration_not_the_profile_target() -> None:
    rows = pool_provenance(
        StepTimes("roofline-fallback", {"fingerprint": TARGET, "fingerprint_hash": "ab" * 32}), POOLS, CALIBRATIONS
    )
    p, d = rows["prefill"], rows["decode"]
    assert (p["gpu"], p["tp"], p["pp"], p["ep"], p["weights"], p["kv_dtype"]) == (
        "H100-SXM-80GB",
        "2",
        "1",
        "1",
        "fp8",
        "fp8",
    )
    assert (d["gpu"], d["tp"], d["weights"], d["kv_dtype"]) == ("H200-SXM-141GB", "4", "fp8", "fp8")
    assert p["step_model"] == d["step_model"] == "roofline" and "profile_fingerprint_hash" not in p
    assert p["roofline_calibration"] == "H100-SXM-80GB/roofline.yaml sha256 504acc1c1ceb"
    assert d["roofline_calibration"] == "documented default efficiencies"  # no calibration given for the H200
    assert (
        p["engine_version"] == "0.12.0"
        and p["driver_version"] == p["runtime_version"] == p["engine_commit"] == "unknown"
    )
    assert "not measured" in p["environment"]
    assert all("None" not in v for row in rows.values() for v in row.values())
    line = describe_provenance(p)
    assert (
        line.startswith("H100-SXM-80GB TP2 PP1 EP1, weights fp8, KV fp8 — step times: roofline, not measured")
        and "driver unknown" in line
    )


def test_a_pool_the_profile_measured_names_the_profile() -> None:
    measured = {
        **TARGET,
        "device_sku": "H200-SXM-141GB",
        "quantization": "fp8",
        "kv_dtype": "fp8",
        "driver_version": "550.54",
    }
    rows = pool_provenance(
        StepTimes("profile-measured", {"fingerprint": measured, "fingerprint_hash": "cd" * 32}), POOLS, CALIBRATIONS
    )
    assert (
        rows["decode"]["step_model"] == "profile-measured" and rows["decode"]["profile_fingerprint_hash"] == "cd" * 32
    )
    assert rows["decode"]["driver_version"] == "550.54" and rows["decode"]["environment"] == "measured by the profile"
    assert rows["prefill"]["step_model"] == "roofline"  # measured on the H200 TP4 only
    assert "measured profile (fingerprint cdcdcdcdcdcd)" in describe_provenance(rows["decode"])


def test_tags_say_unknown_never_none() -> None:
    tags = step_model_tags(
        {"source": "roofline-fallback", "fingerprint": TARGET, "fingerprint_hash": None, "step_model": {}}
    )
    assert (
        tags["step_model.fingerprint.driver_version"] == "unknown" and tags["step_model.fingerprint_hash"] == "unknown"
    )
    rows = pool_provenance(StepTimes("roofline-fallback", {"fingerprint": TARGET}), POOLS, CALIBRATIONS)
    pools = pool_tags({"pool_provenance": rows})
    assert (
        pools["plan.decode.gpu"] == "H200-SXM-141GB"
        and pools["plan.prefill.tp"] == "2"
        and pools["plan.prefill.engine_version"] == "0.12.0"
    )
    assert "None" not in {**tags, **pools}.values()
    assert pool_tags({}) == {}  # a summary written before pool provenance existed
