"""The upgrade watch's decision (ops.watch) and the promotion gates, without a Prefect server: what a real
twin reports, when an observation is an upgrade, how it is written into params.yaml. The flows against a
real server: tests/pipeline/test_watch_approvals.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from llmcap.config import load_params
from ops.common import OpsError
from ops.watch import changes_key, mark_stale, observe_endpoint, read_fingerprint_file, upgrade_changes
from tests.conftest import ROOT
from tests.twin.test_replay_cli import twin

PLANNED = {
    "engine": "vllm",
    "engine_version": "0.11.0",
    "driver_version": None,
    "block_size": 16,
    "enable_prefix_caching": True,
}


def test_a_twin_reports_its_engine_version_and_cache_config() -> None:
    with twin("--engine-version", "0.12.1", "--block-size", "32", "--served-model-name", "m8") as url:
        observed = observe_endpoint(url)
    assert observed == {
        "engine_version": "0.12.1",
        "served_models": ["m8"],
        "block_size": 32,
        "enable_prefix_caching": True,
    }


def test_an_unreachable_endpoint_is_an_error_not_no_upgrade() -> None:
    with pytest.raises(OpsError, match=r"watch: http://127.0.0.1:9/version"):
        observe_endpoint("http://127.0.0.1:9", timeout_s=2.0)


def test_only_a_changed_observed_field_is_an_upgrade() -> None:
    same = {"http://a": {"engine_version": "0.11.0", "block_size": 16, "served_models": ["x"]}}
    assert upgrade_changes(PLANNED, same) == []
    unknown = {"http://a": {"engine_version": None}, "fp.yaml": {}}  # nobody knows: not a change
    assert upgrade_changes(PLANNED, unknown) == []
    upgraded = {"http://a": {"engine_version": "0.12.0", "block_size": 16}, "fp.yaml": {"driver_version": "570.124"}}
    assert upgrade_changes(PLANNED, upgraded) == [
        {"field": "engine_version", "planned": "0.11.0", "observed": "0.12.0", "source": "http://a"},
        {"field": "driver_version", "planned": None, "observed": "570.124", "source": "fp.yaml"},
    ]
    key = changes_key(upgrade_changes(PLANNED, upgraded))
    assert key == changes_key(list(reversed(upgrade_changes(PLANNED, upgraded))))
    assert key != changes_key(upgrade_changes(PLANNED, {"http://a": {"engine_version": "0.12.1"}}))


def test_two_endpoints_on_different_versions_are_an_error() -> None:
    with pytest.raises(
        OpsError, match=r"engine_version differs between http://a \('0.12.0'\) and http://b \('0.11.0'\)"
    ):
        upgrade_changes(PLANNED, {"http://a": {"engine_version": "0.12.0"}, "http://b": {"engine_version": "0.11.0"}})


def test_mark_stale_writes_params_keeping_comments(tmp_path: Path) -> None:
    params = tmp_path / "params.yaml"
    shutil.copy(ROOT / "params.yaml", params)
    before = params.read_text().splitlines()
    changes = [
        {"field": "engine_version", "observed": "0.12.0"},
        {"field": "block_size", "observed": 32},
        {"field": "enable_prefix_caching", "observed": False},
    ]
    mark_stale(params, changes)
    loaded = load_params(params, catalog_dir=ROOT / "llmcap" / "catalog" / "data")
    assert (loaded.profile.engine_version, loaded.profile.block_size, loaded.profile.enable_prefix_caching) == (
        "0.12.0",
        32,
        False,
    )
    after = params.read_text().splitlines()
    changed = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
    assert len(changed) == 3 and all(a.split("#", 1)[1:] == b.split("#", 1)[1:] for a, b in changed)  # comments kept
    assert (
        yaml.safe_load(params.read_text())["enumerate"]
        == yaml.safe_load((ROOT / "params.yaml").read_text())["enumerate"]
    )


def test_fingerprint_file_fields_are_checked(tmp_path: Path) -> None:
    good = tmp_path / "fp.json"
    good.write_text(json.dumps({"driver_version": "570.124", "runtime_version": "torch 2.8.0+cu128"}))
    assert read_fingerprint_file(good) == {"driver_version": "570.124", "runtime_version": "torch 2.8.0+cu128"}
    bad = tmp_path / "fp.yaml"
    bad.write_text("driver: 570\n")
    with pytest.raises(OpsError, match=r"fp.yaml: field 'driver' is not a watched fingerprint field"):
        read_fingerprint_file(bad)
    with pytest.raises(OpsError, match="watch.fingerprint_file not found"):
        read_fingerprint_file(tmp_path / "missing.yaml")


def test_gates_stop_a_plan_whose_scenarios_failed() -> None:
    from flows.promote import gates

    ok = {"gpus": 8, "scenarios_pass": True, "scenarios": ["node loss: x → pass"]}
    assert gates(ok) == []
    failed = gates(
        {**ok, "scenarios_pass": False, "scenarios": ["node loss: x → pass", "upgrade: y: attainment 0.9 → FAIL"]}
    )
    assert failed == ["a headroom scenario failed: upgrade: y: attainment 0.9 → FAIL"]


def test_a_new_trace_is_a_change_and_the_same_bytes_are_not(tmp_path: Path) -> None:
    import hashlib

    from ops.watch import trace_changes

    shutil.copy2(ROOT / "params.yaml", tmp_path / "params.yaml")
    name = load_params(tmp_path / "params.yaml").trace.file
    raw = tmp_path / "data/raw" / name
    raw.parent.mkdir(parents=True)
    raw.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2}\n')
    report = tmp_path / "data/reports/clean/clean_report.json"
    with pytest.raises(OpsError, match="no plan yet"):
        trace_changes(tmp_path)
    report.parent.mkdir(parents=True)
    planned = {"source_file": Path(name).name, "source_sha256": hashlib.sha256(raw.read_bytes()).hexdigest()}
    report.write_text(json.dumps(planned))
    assert trace_changes(tmp_path) == []
    raw.write_text(raw.read_text() + '{"timestamp": 5, "input_length": 20, "output_length": 3}\n')
    (change,) = trace_changes(tmp_path)
    assert change["field"] == "trace" and change["source"] == "data/raw"
    assert change["planned"] == f"{Path(name).name} (sha256 {planned['source_sha256'][:12]})"
    assert change["observed"].startswith(f"{name} (sha256 ") and change["observed"] != change["planned"]
    # a plan cleaned before the hash was recorded: the same name is no change, another name is one
    report.write_text(json.dumps({"source_file": Path(name).name}))
    assert trace_changes(tmp_path) == []
    report.write_text(json.dumps({"source_file": "older.jsonl"}))
    assert [c["planned"] for c in trace_changes(tmp_path)] == ["older.jsonl"]


def test_an_unchanged_decision_nothing_measured_is_recorded_without_approval() -> None:
    from flows.promote import unmeasured_and_unchanged

    roofline = {"step_model_source": "roofline-fallback", "pool_provenance": {"aggregated": {"step_model": "roofline"}}}
    why = unmeasured_and_unchanged(False, roofline, None)
    assert why is not None and why.startswith("could not re-measure (no profile.endpoint to re-profile)")
    assert unmeasured_and_unchanged(True, roofline, None) is None  # the decision changed: a person decides
    measured = {"step_model_source": "profile-measured", "pool_provenance": {"aggregated": {"step_model": "roofline"}}}
    assert unmeasured_and_unchanged(False, measured, "http://e") is None  # re-measured: a person looks at it
    assert (
        unmeasured_and_unchanged(False, {"step_model_source": "roofline-fallback"}, None) is None
    )  # no provenance: ask
