"""The stores setting (stages.env.stores): params.yaml `stores:` picked up, the environment overriding it, the
embedded defaults when both are empty; `apply_defaults` opens the setting's MLflow store; ops.store pushes to
the setting's DVC remote (a real `dvc push` in a scratch repository). Two clones sharing a real server:
tests/pipeline/test_team_stores.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ops import store
from ops.sandbox import own_stores, sandbox_env
from stages import env as stage_env
from tests.conftest import ROOT


def _project(root: Path, stores: dict | None) -> Path:
    """A scratch DVC project: git, the repository's .dvc/config (remote `local` = ../.work/dvc-remote) and a params.yaml."""
    root.mkdir(parents=True)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    (root / ".dvc").mkdir()
    shutil.copy2(ROOT / ".dvc" / "config", root / ".dvc" / "config")
    (root / "params.yaml").write_text(yaml.safe_dump({"seed": 0, **({"stores": stores} if stores is not None else {})}))
    return root


def test_params_then_environment_then_the_embedded_defaults(tmp_path: Path) -> None:
    plain = _project(tmp_path / "plain", {"dvc_remote": "", "mlflow_tracking_uri": ""})
    assert stage_env.stores(plain, environ={}) == {
        "dvc_remote": "",
        "dvc_remote_from": "default",
        "mlflow_tracking_uri": f"sqlite:///{plain / '.work' / 'mlflow.db'}",
        "mlflow_tracking_uri_from": "default",
    }
    assert (
        stage_env.stores(_project(tmp_path / "none", None), environ={})["dvc_remote_from"] == "default"
    )  # no section at all

    team = _project(
        tmp_path / "team", {"dvc_remote": "../team-store/dvc-remote", "mlflow_tracking_uri": "http://127.0.0.1:5000"}
    )
    got = stage_env.stores(team, environ={})
    # relative to the project: tmp/team/../team-store/dvc-remote = tmp/team-store/dvc-remote
    assert got["dvc_remote"] == str(tmp_path / "team-store" / "dvc-remote") and got["dvc_remote_from"] == "params.yaml"
    assert got["mlflow_tracking_uri"] == "http://127.0.0.1:5000" and got["mlflow_tracking_uri_from"] == "params.yaml"

    override = {"LLMCAP_DVC_REMOTE": "s3://bucket/llmcap", "MLFLOW_TRACKING_URI": "http://mlflow.internal:5000"}
    got = stage_env.stores(team, environ=override)
    assert (got["dvc_remote"], got["dvc_remote_from"]) == ("s3://bucket/llmcap", "environment")
    assert (got["mlflow_tracking_uri"], got["mlflow_tracking_uri_from"]) == (
        "http://mlflow.internal:5000",
        "environment",
    )


def test_apply_defaults_opens_the_params_store_unless_the_environment_names_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    team = _project(tmp_path / "team", {"dvc_remote": "", "mlflow_tracking_uri": "http://127.0.0.1:5000"})
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    stage_env.apply_defaults(team)
    # not the embedded sqlite default, which apply_defaults also fills in for every other setting
    assert stage_env.os.environ["MLFLOW_TRACKING_URI"] == "http://127.0.0.1:5000"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:////elsewhere/mlflow.db")
    stage_env.apply_defaults(team)
    assert stage_env.os.environ["MLFLOW_TRACKING_URI"] == "sqlite:////elsewhere/mlflow.db"


def test_the_makefile_leaves_the_mlflow_store_to_params() -> None:
    words = subprocess.run(
        ["python3", str(ROOT / "stages" / "env.py"), "/w"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert "DVC_SITE_CACHE_DIR=/w/dvc-site-cache" in words
    assert not any(w.startswith("MLFLOW_TRACKING_URI=") for w in words)


def test_push_goes_to_the_setting_remote_and_plain_dvc_follows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLMCAP_DVC_REMOTE", raising=False)
    shared = tmp_path / "shared" / "dvc-remote"
    root = _project(tmp_path / "clone", {"dvc_remote": str(shared), "mlflow_tracking_uri": ""})
    (root / "table.csv").write_text("gpus\n32\n")
    dvc = [sys.executable, "-m", "dvc"]
    subprocess.run([*dvc, "add", "-q", "table.csv"], cwd=root, check=True)
    md5 = yaml.safe_load((root / "table.csv.dvc").read_text())["outs"][0]["md5"]

    assert store.push(root) == {"name": "team", "url": str(shared), "pushed": 1}
    assert (shared / "files" / "md5" / md5[:2] / md5[2:]).read_text() == "gpus\n32\n"
    assert not (root / ".work" / "dvc-remote").exists()  # .dvc/config's default stayed unused

    (root / "table.csv").unlink()
    shutil.rmtree(root / ".dvc" / "cache")
    assert (
        subprocess.run([*dvc, "pull", "-q"], cwd=root, capture_output=True).returncode != 0
    )  # .dvc/config's remote is empty
    out = subprocess.run(
        [sys.executable, "-m", "ops.store", "--project", str(root), "--configure-dvc"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert yaml.safe_load(out)["dvc_remote"] == {"name": "team", "url": str(shared), "from": "params.yaml"}
    subprocess.run([*dvc, "pull", "-q"], cwd=root, check=True)
    assert (root / "table.csv").read_text() == "gpus\n32\n"


def test_without_a_setting_the_checkout_remote_stays(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLMCAP_DVC_REMOTE", raising=False)
    root = _project(tmp_path / "clone", {"dvc_remote": "", "mlflow_tracking_uri": ""})
    assert store.default_remote(root) == {
        "name": "local",
        "url": str(root / ".work" / "dvc-remote"),
        "from": ".dvc/config",
    }
    (root / "table.csv").write_text("gpus\n8\n")
    subprocess.run([sys.executable, "-m", "dvc", "add", "-q", "table.csv"], cwd=root, check=True)
    md5 = yaml.safe_load((root / "table.csv.dvc").read_text())["outs"][0]["md5"]
    assert store.push(root) == {"name": "local", "url": str(root / ".work" / "dvc-remote"), "pushed": 1}
    assert (root / ".work" / "dvc-remote" / "files" / "md5" / md5[:2] / md5[2:]).read_text() == "gpus\n8\n"
    monkeypatch.setenv("LLMCAP_DVC_REMOTE", "shared")  # relative: to the project
    assert store.default_remote(root) == {"name": "team", "url": str(root / "shared"), "from": "environment"}


def test_a_sandbox_keeps_its_decisions_to_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _project(
        tmp_path / "copy", {"dvc_remote": "/srv/team/dvc-remote", "mlflow_tracking_uri": "http://mlflow.internal:5000"}
    )
    own_stores(root / "params.yaml")
    assert yaml.safe_load((root / "params.yaml").read_text()) == {
        "seed": 0,
        "stores": {"dvc_remote": "", "mlflow_tracking_uri": ""},
    }
    monkeypatch.setenv("LLMCAP_DVC_REMOTE", "/srv/team/dvc-remote")
    env = sandbox_env(root)
    assert "LLMCAP_DVC_REMOTE" not in env and env["MLFLOW_TRACKING_URI"] == f"sqlite:///{root / '.work' / 'mlflow.db'}"
