"""Team stores: two clones of one project share the stores its committed params.yaml `stores:` names, both
outside either clone: a real `mlflow server` (ops.mlflow_server, as `make store` starts it: sqlite backend,
artifacts in the shared directory, one worker; stopped by its PID) and a DVC remote directory beside it.
Clone A plans (the light sandbox search) and records its decision: dvc.lock pushed to the shared git
repository, outputs to the DVC remote, the run to the server. Clone B, fresh, with no local store and no
configuration of its own (no store in its environment), lists A's decision with `llmcap history`, reproduces
it byte-identically from the stores without recomputing (`llmcap reproduce REV --pull`) and pulls A's
capacity table with plain `dvc pull` — in under a minute (the issue's acceptance). Without the setting, B
sees the embedded defaults: its own empty stores."""

from __future__ import annotations

import hashlib
import json
import shutil
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from ops import mlflow_server
from ops.reproduce import SKIPPED
from ops.sandbox import sandbox_env
from stages.env import DVC_REMOTE_ENV
from tests.pipeline._project import make_project, sh

# timing: B's minute is judged on wall-clock time, so it runs in make test's timed pass, alone on the machine
pytestmark = [pytest.mark.slow, pytest.mark.timing, pytest.mark.timeout(1800)]
LLMCAP = [sys.executable, "-m", "llmcap"]
B_LIMIT_S = 60.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(clone: Path) -> dict[str, str]:
    """The clone's own tool state (sandbox_env) and no store named by the environment: its params.yaml decides."""
    env = sandbox_env(clone)
    for var in ("MLFLOW_TRACKING_URI", DVC_REMOTE_ENV):
        env.pop(var, None)
    return env


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[dict]:
    """The team's store directory and its MLflow server (the server's PID file under its own home, outside the clones)."""
    home, store = tmp_path / "server-home", tmp_path / "shared"
    started = mlflow_server.start(home, store, _free_port())
    try:
        yield {"store": store, "url": started["url"], "pid": started["pid"]}
    finally:
        assert mlflow_server.stop(home)


def test_clone_b_lists_pulls_and_reproduces_clone_a_decision(tmp_path: Path, shared: dict) -> None:
    seed, env = make_project(tmp_path / "seed", native=True)
    remote = shared["store"] / "dvc-remote"
    params = yaml.safe_load((seed / "params.yaml").read_text())
    params["stores"] = {"dvc_remote": str(remote), "mlflow_tracking_uri": shared["url"]}
    (seed / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    sh(["git", "commit", "-qam", "the team's stores"], seed, env)
    origin = tmp_path / "origin.git"
    sh(["git", "clone", "-q", "--bare", str(seed), str(origin)], tmp_path, env)

    # A: a clone that plans and records its decision
    a = tmp_path / "a"
    sh(["git", "clone", "-q", str(origin), str(a)], tmp_path, env)
    if (
        seed / "llmcap" / "native.json"
    ).is_file():  # the compiled core is not tracked (else A runs the sources: same bytes)
        shutil.copytree(seed / "llmcap" / "_compiled", a / "llmcap" / "_compiled")
        shutil.copy2(seed / "llmcap" / "native.json", a / "llmcap" / "native.json")
    env_a = _env(a)
    out = sh([sys.executable, "-m", "flows.replan"], a, env_a, timeout=1200).stdout
    assert f"stored: DVC remote 'team' ({remote})" in out and f"({shared['url']})" in out
    sh(["git", "add", "dvc.lock"], a, env_a)
    sh(["git", "commit", "-qm", "plan"], a, env_a)
    sh(["git", "push", "-q", "origin", "HEAD"], a, env_a)
    rev = sh(["git", "rev-parse", "HEAD"], a, env_a).stdout.strip()
    summary = json.loads((a / "data/reports/capacity/summary.json").read_text())
    lock = yaml.safe_load((a / "dvc.lock").read_text())
    assert not (a / ".work" / "mlflow.db").exists() and not (a / ".work" / "dvc-remote").exists()  # nothing kept in A

    # B: a fresh clone; everything it knows of A's decision comes from git and the shared stores
    b = tmp_path / "b"
    env_b = _env(b)
    began = time.monotonic()
    sh(["git", "clone", "-q", str(origin), str(b)], tmp_path, env_b)
    rows = json.loads(sh([*LLMCAP, "history", "--json"], b, env_b).stdout)
    assert len(rows) == 1 and rows[0]["recorded_in"] == rev and rows[0]["remote"] == str(remote)
    assert rows[0]["gpus"] == summary["gpus"] and rows[0]["chosen"] == summary["chosen"]

    pulled = json.loads(sh([*LLMCAP, "reproduce", rev, "--pull", "--json"], b, env_b).stdout)
    assert pulled["identical"] is True and pulled["mode"] == "pull" and pulled["remote"] == str(remote)
    assert pulled["environment"] == {"dvc pull exit": 0} and pulled["inputs_changed"] is None  # nothing re-ran
    n_outs = sum(len(s.get("outs", [])) for s in lock["stages"].values())
    assert len(pulled["outputs"]) == n_outs and all(r["status"] in SKIPPED for r in pulled["outputs"])
    assert sum(r["status"] == "identical" for r in pulled["outputs"]) >= 1
    # A's run on the server, found by its dvc.lock's sha256: its outputs.json matched file by file
    assert pulled["mlflow"]["run_id"] == rows[0]["run_id"] and pulled["mlflow"]["differences"] == []
    assert pulled["mlflow"]["compared"] >= 1

    sh([sys.executable, "-m", "ops.store", "--configure-dvc"], b, env_b)  # plain `dvc` commands use the setting too
    sh([sys.executable, "-m", "dvc", "pull", "-q", "data/processed/capacity.parquet"], b, env_b)
    b_seconds = time.monotonic() - began
    md5 = next(o["md5"] for o in lock["stages"]["size"]["outs"] if o["path"] == "data/processed/capacity.parquet")
    assert hashlib.md5((b / "data/processed/capacity.parquet").read_bytes()).hexdigest() == md5
    assert not (b / ".work" / "mlflow.db").exists()  # B has no local history: it read the server's
    print(f"\nclone B: history, reproduce --pull and dvc pull of A's decision in {b_seconds:.1f} s")
    assert b_seconds < B_LIMIT_S

    # the environment overrides the committed setting (MLflow's own variable): an empty local store has nothing
    empty = {
        **env_b,
        "MLFLOW_TRACKING_URI": f"sqlite:///{b / '.work' / 'mlflow.db'}",
        DVC_REMOTE_ENV: str(tmp_path / "none"),
    }
    assert json.loads(sh([*LLMCAP, "history", "--json"], b, empty).stdout) == []
    missing = sh([*LLMCAP, "reproduce", rev, "--pull", "--json"], b, empty, ok=False)
    assert missing.returncode == 1 and json.loads(missing.stdout)["remote"] == str(tmp_path / "none")
