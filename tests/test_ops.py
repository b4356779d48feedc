"""ops: hashing as DVC does, input changes between two dvc.locks, the venv per uv.lock hash, decision fields,
and the CLI's one-line errors (the end-to-end path is tests/pipeline/test_decisions.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ops import reproduce
from ops.common import dir_manifest, dir_md5, input_changes
from ops.diff import Side, decision_fields, diff, explain
from tests.conftest import ROOT


def test_dir_md5_is_dvcs(tmp_path: Path) -> None:
    from dvc_data.hashfile.hash_info import HashInfo
    from dvc_data.hashfile.meta import Meta
    from dvc_data.hashfile.tree import Tree

    (tmp_path / "sub").mkdir()
    (tmp_path / "a.json").write_text('{"x": 1}\n')
    (tmp_path / "sub" / "b.png").write_bytes(bytes(range(256)))
    manifest = dir_manifest(tmp_path)
    assert sorted(manifest) == ["a.json", "sub/b.png"]
    tree = Tree()
    for rel, md5 in manifest.items():
        tree.add(tuple(rel.split("/")), Meta(), HashInfo("md5", md5))
    tree.digest()
    assert dir_md5(manifest) == tree.hash_info.value


def _lock(node_failures: int, config_md5: str, cmd: str = "python -m stages.size") -> dict:
    return {
        "schema": "2.0",
        "stages": {
            "clean": {
                "cmd": "python -m stages.clean",
                "deps": [{"path": "llmcap/config.py", "md5": config_md5}, {"path": "uv.lock", "md5": "u"}],
                "params": {"params.yaml": {"trace": {"file": "t.jsonl"}}},
                "outs": [],
            },
            "size": {
                "cmd": cmd,
                "deps": [{"path": "llmcap/config.py", "md5": config_md5}, {"path": "data/catalog", "md5": "c.dir"}],
                "params": {
                    "params.yaml": {
                        "size": {"headroom": {"node_failures": node_failures, "max_surge": 1}},
                        "trace.file": "t.jsonl",
                    }
                },
                "outs": [],
            },
        },
    }


def test_input_changes_name_params_code_and_commands() -> None:
    assert input_changes(_lock(1, "x"), _lock(1, "x")) == {"params": [], "deps": [], "cmds": []}
    changes = input_changes(_lock(1, "x"), _lock(2, "y", cmd="python -m stages.size --fast"))
    assert changes["params"] == [{"key": "size.headroom.node_failures", "a": 1, "b": 2, "stages": ["size"]}]
    assert changes["deps"] == [
        {"path": "llmcap/config.py", "kind": "code", "a": "x", "b": "y", "stages": ["clean", "size"]}
    ]
    assert changes["cmds"] == [{"stage": "size", "a": "python -m stages.size", "b": "python -m stages.size --fast"}]


def test_decision_fields_and_explanation() -> None:
    summary = {
        "chosen": "H100/tp4",
        "mode": "aggregated",
        "gpus": 8,
        "usd_per_hour": 20.0,
        "pool_plans": {
            "instances": {"instances": 3, "gpus": 8, "headroom": {"failure": {"instances": 1, "reasoning": "..."}}}
        },
        "pools": {
            "cheaper": "shared",
            "shared": [{"name": "shared", "gpus": 8, "usd_per_hour": 20.0, "rate_rps": 3.0}],
            "split": [],
        },
    }
    fields = decision_fields(summary)
    assert fields["pool.instances.headroom.failure.instances"] == 1 and fields["pool.instances.instances"] == 3
    assert fields["pools.shared[shared].gpus"] == 8 and fields["gpus"] == 8
    inputs = {
        "params": [],
        "code": [],
        "data": [],
        "environment": [{"path": "uv.lock", "stages": ["size"]}],
        "cmds": [],
        "trace": {"file": {"a": "t", "b": "t"}, "canonical": {"a": "m", "b": "n"}},
        "step_model": {
            "source": {"a": "profile", "b": "roofline-fallback"},
            "version": {"a": "1", "b": "2"},
            "fingerprint": [{"field": "engine_version", "a": "0.10", "b": "0.11"}],
        },
    }
    assert explain(inputs) == [
        "canonical trace changed: md5 m → n",
        "environment `uv.lock` changed (stages: size)",
        "step model source: profile → roofline-fallback",
        "step model version: 1 → 2",
        "step-model fingerprint `engine_version`: '0.10' → '0.11'",
    ]


def test_venv_per_uv_lock_hash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "project"
    root.mkdir()
    (root / "uv.lock").write_bytes(b"current lock")
    python, how = reproduce.venv_for(root, tmp_path, b"current lock")
    assert python == Path(sys.executable) and "is the project's" in how

    calls = []

    def fake_run(cmd, cwd, env):
        calls.append((cmd, cwd, env["UV_PROJECT_ENVIRONMENT"]))
        (Path(env["UV_PROJECT_ENVIRONMENT"]) / "bin").mkdir(parents=True)
        (Path(env["UV_PROJECT_ENVIRONMENT"]) / "bin" / "python").touch()
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setenv("LLMCAP_VENV_CACHE", str(tmp_path / "venvs"))
    monkeypatch.setenv("UV", sys.executable)  # any existing file: the fake run never executes it
    monkeypatch.setattr(reproduce.subprocess, "run", fake_run)
    import hashlib

    venv = tmp_path / "venvs" / hashlib.sha256(b"old lock").hexdigest()[:16]
    python, how = reproduce.venv_for(root, tmp_path / "worktree", b"old lock")
    assert python == venv / "bin" / "python" and how.startswith("new venv")
    assert calls == [
        (
            [
                sys.executable,
                "sync",
                "--frozen",
                "--no-install-project",
                "--python",
                f"{sys.version_info.major}.{sys.version_info.minor}",
            ],
            tmp_path / "worktree",
            str(venv),
        )
    ]
    python, how = reproduce.venv_for(root, tmp_path / "worktree", b"old lock")  # cached: no second sync
    assert python == venv / "bin" / "python" and how.startswith("cached venv") and len(calls) == 1


def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "llmcap", "reproduce", "no-such-rev"], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: 'no-such-rev': not a commit of {ROOT}"]
    proc = subprocess.run(
        [sys.executable, "-m", "llmcap", "history", "--project", str(tmp_path)], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "not an llmcap project" in proc.stderr


def test_a_dep_another_stage_produces_is_a_consequence_not_an_input() -> None:
    def lock(node_failures: int, summary_md5: str) -> dict:
        return {
            "schema": "2.0",
            "stages": {
                "size": {
                    "cmd": "python -m stages.size",
                    "deps": [{"path": "data/raw/t.jsonl", "md5": "t"}],
                    "params": {"params.yaml": {"size": {"headroom": {"node_failures": node_failures}}}},
                    "outs": [{"path": "data/reports/capacity", "md5": f"{summary_md5}.dir"}],
                },
                "replay": {
                    "cmd": "python -m stages.replay",
                    "deps": [
                        {"path": "data/reports/capacity/summary.json", "md5": summary_md5},
                        {"path": "data/raw/t.jsonl", "md5": "t"},
                    ],
                    "outs": [],
                },
            },
        }

    changes = input_changes(lock(1, "s1"), lock(2, "s2"))
    assert changes["deps"] == [] and [p["key"] for p in changes["params"]] == ["size.headroom.node_failures"]
    raw_changed = lock(1, "s1")
    raw_changed["stages"]["replay"]["deps"][1]["md5"] = "t2"
    assert [d["path"] for d in input_changes(lock(1, "s1"), raw_changed)["deps"]] == ["data/raw/t.jsonl"]


def _provenance(engine_version: str, gpu: str = "H200-SXM-141GB") -> dict:
    return {
        "decode": {"gpu": gpu, "tp": "4", "step_model": "roofline", "engine_version": engine_version},
        "prefill": {"gpu": "H100-SXM-80GB", "tp": "2", "step_model": "roofline", "engine_version": engine_version},
    }


def test_diff_compares_each_pools_provenance() -> None:
    lock = _lock(1, "x")
    a = Side("A", "directory", lock=lock, summary={"gpus": 32, "pool_provenance": _provenance("unknown")})
    b = Side(
        "B",
        "directory",
        lock=lock,
        summary={"gpus": 32, "pool_provenance": _provenance("0.11.0", gpu="B200-SXM-180GB")},
    )
    result = diff(a, b)
    assert result["decision"]["changed"] == []  # the same count: only what it was sized with moved
    assert result["inputs"]["provenance"] == [
        {"field": "decode.gpu", "a": "H200-SXM-141GB", "b": "B200-SXM-180GB"},
        {"field": "decode.engine_version", "a": "unknown", "b": "0.11.0"},
        {"field": "prefill.engine_version", "a": "unknown", "b": "0.11.0"},
    ]
    assert result["explanation"] == [
        "pool provenance `decode.gpu`: 'H200-SXM-141GB' → 'B200-SXM-180GB'",
        "pool provenance `decode.engine_version`: 'unknown' → '0.11.0'",
        "pool provenance `prefill.engine_version`: 'unknown' → '0.11.0'",
    ]
    assert diff(a, a)["explanation"] == ["no recorded input differs"]
