"""The flow `rollout` against a real Prefect server this module starts (`python -m flows.server start`,
loopback, stopped by its PID), with twins as baseline and candidate behind a `llmcap gateway` process and
the open-loop replay sending traffic the whole time:
- two approvals given through `llmcap approve`: the rollout reaches 100%; the audit log and the MLflow
  run hold both approvals; every request of the replay has exactly one gateway row;
- a rejected approval and an approval that times out: rolled back (weight 0), and the run cannot be
  resumed any more (`llmcap approve` exits 2);
- the candidate's process killed mid-rollout: the error gate rolls back, and every request is accounted
  for (retried on the baseline, or cut mid-stream and counted).
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pytest

from flows import server
from llmcap import exit_codes
from llmcap.live.trace_replay import replay_async
from llmcap.rollout.predict import predict_share, predictions_doc
from tests.conftest import ROOT
from tests.twin._twin import FAST, SERVED, deployment, twin_server

pytestmark = [pytest.mark.slow, pytest.mark.timing, pytest.mark.timeout(900)]
LLMCAP = [sys.executable, "-m", "llmcap"]
RATE, ISL, OSL = 10.0, 200, 24
STEPS = (0.25, 0.5, 1.0)
TWIN = ("--model", FAST[0], "--gpu", FAST[1], "--served-model-name", SERVED)


@pytest.fixture(scope="module")
def prefect(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    root = tmp_path_factory.mktemp("rollout-project")
    for code in ("flows", "stages", "ops", "dvc.yaml"):  # the project's code; its .work/ (audit log, MLflow) stays here
        (root / code).symlink_to(ROOT / code)
    started = server.start(root, _free_port())
    env = {
        **os.environ,
        "PREFECT_API_URL": started["url"],
        "PREFECT_HOME": str(root / ".work" / "prefect"),
        "MLFLOW_TRACKING_URI": f"sqlite:///{root / '.work' / 'mlflow.db'}",
        "PREFECT_LOGGING_LEVEL": "INFO",
    }
    # the predictions every test judges against: the candidate twin's deployment at each step's share
    trace = _trace(60.0)
    cfg, step = deployment(*FAST)
    preds = {w: predict_share(trace, cfg, step, w, seed=3) for w in STEPS}
    path = root / "predictions.json"
    path.write_text(json.dumps(predictions_doc(preds, {"model": FAST[0], "gpu": FAST[1], "tp": FAST[2]})))
    try:
        yield {"root": root, "env": env, "url": started["url"], "predictions": path}
    finally:
        assert server.stop(root)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _trace(seconds: float) -> pa.Table:
    n = int(RATE * seconds)
    return pa.table(
        {"request_id": np.arange(n), "arrival_s": np.arange(n) / RATE, "isl": np.full(n, ISL), "osl": np.full(n, OSL)}
    )


@contextmanager
def gateway(baseline: str, candidate: str, record: Path) -> Iterator[str]:
    cmd = [*LLMCAP, "gateway", "--baseline", baseline, "--candidate", candidate, "--port", "0", "--record", str(record)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        line = proc.stdout.readline() if ready else ""
        assert "llmcap gateway:" in line, line
        yield line.strip().rsplit(" ", 1)[-1]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
        proc.stdout.close()
        proc.stderr.close()


class Traffic:
    """The open-loop replay in a thread of its own for `seconds`, against the gateway."""

    def __init__(self, url: str, seconds: float) -> None:
        t = _trace(seconds)
        self.args = (
            url,
            SERVED,
            t.column("arrival_s").to_numpy(),
            t.column("isl").to_numpy(),
            t.column("osl").to_numpy(),
        )
        self.result = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.result = asyncio.run(replay_async(*self.args, timeout_s=20.0))

    def wait(self) -> dict:
        self.thread.join(180)
        assert self.result is not None, "the replay did not finish"
        return self.result.requests.to_pydict()


def start_flow(
    p: dict, gw: str, candidate: str, out: Path, approve_before: str, timeout_s: int = 120
) -> subprocess.Popen:
    cmd = [
        *LLMCAP,
        "rollout",
        "start",
        "--gateway",
        gw,
        "--candidate-metrics",
        candidate,
        "--predictions",
        str(p["predictions"]),
        "--steps",
        ",".join(f"{w:g}" for w in STEPS),
        "--hold-s",
        "3",
        "--interval-s",
        "0.5",
        "--approve-before",
        approve_before,
        "--approval-timeout-s",
        str(timeout_s),
        "--ttft-target-ms",
        "500",
        "--out",
        str(out),
        "--project",
        str(p["root"]),
        "--tolerances",
        json.dumps({"min_requests": 8, "min_requests_errors": 3}),
    ]
    with (out.parent / f"{out.name}.log").open("w") as log:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(cmd, cwd=ROOT, env=p["env"], stdout=log, stderr=subprocess.STDOUT)


def paused_run(p: dict, flow: subprocess.Popen, timeout_s: float = 120.0) -> str:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(base_url=p["url"], timeout=30) as api:
        while True:
            runs = api.post("/flow_runs/filter", json={"flow_runs": {"state": {"type": {"any_": ["PAUSED"]}}}}).json()
            if runs:
                assert len(runs) == 1, runs
                return runs[0]["id"]
            assert flow.poll() is None, f"the rollout flow ended ({flow.returncode}) before pausing"
            assert time.monotonic() < deadline, "no paused rollout"
            time.sleep(0.3)


def approve(p: dict, run: str, *args: str) -> subprocess.CompletedProcess:
    """`llmcap approve` as the person `--by` names: their git identity is the approver (ops.approvals)."""
    by = args[args.index("--by") + 1]
    env = {**p["env"], "GIT_AUTHOR_NAME": by, "GIT_AUTHOR_EMAIL": f"{by}@example.com"}
    return subprocess.run(
        [*LLMCAP, "approve", run, *args, "--project", str(p["root"])],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def finish(flow: subprocess.Popen, out: Path) -> dict:
    flow.wait(300)
    log = (out.parent / f"{out.name}.log").read_text()
    assert (out / "outcome.json").is_file(), log[-3000:]
    return json.loads((out / "outcome.json").read_text())


def rows(record: Path) -> list[dict]:
    return [json.loads(line) for line in record.read_text().splitlines()]


def audit(p: dict) -> list[dict]:
    path = p["root"] / ".work" / "decisions" / "approvals.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def test_two_approvals_through_the_cli_take_the_rollout_to_all_traffic(prefect: dict, tmp_path: Path) -> None:
    import mlflow

    record, out = tmp_path / "rows.jsonl", tmp_path / "happy"
    with twin_server(*TWIN) as (_, base), twin_server(*TWIN) as (_, cand), gateway(base, cand, record) as gw:
        traffic = Traffic(gw, 45.0)
        flow = start_flow(prefect, gw, cand, out, "0.5,1")
        first = paused_run(prefect, flow)
        # a raw Prefect API resume (what the UI's form sends, unsigned) is refused: the step waits again
        raw = httpx.post(
            f"{prefect['url']}/flow_runs/{first}/resume",
            json={"run_input": {"approver": "alice", "decision": "approve"}},
        )
        assert raw.json()["status"] == "ACCEPT" and paused_run(prefect, flow) == first
        given = approve(prefect, first, "--by", "alice", "--reason", "25% held as predicted")
        assert given.returncode == 0 and f"approved {first}" in given.stdout, given.stderr
        second = paused_run(prefect, flow)
        assert second == first  # the same run, paused again before 100%
        assert approve(prefect, second, "--by", "bob", "--reason", "50% held").returncode == 0
        outcome = finish(flow, out)
        replayed = traffic.wait()
    assert flow.returncode == 0 and outcome["status"] == "completed", outcome["reason"]
    assert [s["weight"] for s in outcome["steps"]] == list(STEPS)
    assert [s["approval"]["by"] if s["approval"] else None for s in outcome["steps"]] == [None, "alice", "bob"]
    mine = [a for a in audit(prefect) if a["flow_run_id"] == first]
    assert [(a["weight"], a["decision"], a["by"], a["comment"]) for a in mine] == [
        (0.5, "approved", "alice", "25% held as predicted"),
        (0.5 * 2, "approved", "bob", "50% held"),
    ]
    assert all(a["evidence"]["gates"] for a in mine)  # what they were shown is on record
    mlflow.set_tracking_uri(prefect["env"]["MLFLOW_TRACKING_URI"])
    (run,) = mlflow.search_runs(
        experiment_names=["rollout"], filter_string=f"tags.`rollout.flow_run_id` = '{first}'", output_format="list"
    )
    assert run.data.tags["approval.50pct.by"] == "alice" and run.data.tags["approval.100pct.by"] == "bob"
    assert run.data.tags["rollout.status"] == "completed"
    got = rows(record)
    assert sorted(r["request_id"] for r in got) == sorted(replayed["request_id"])  # exactly one row each
    assert all(r["status"] == "ok" for r in got) and {r["side"] for r in got} == {"baseline", "candidate"}


@pytest.mark.parametrize("how", ["reject", "timeout"])
def test_a_rejected_or_timed_out_approval_rolls_back_for_good(prefect: dict, tmp_path: Path, how: str) -> None:
    record, out = tmp_path / "rows.jsonl", tmp_path / how
    with twin_server(*TWIN) as (_, base), twin_server(*TWIN) as (_, cand), gateway(base, cand, record) as gw:
        traffic = Traffic(gw, 25.0)
        flow = start_flow(prefect, gw, cand, out, "0.5", timeout_s=3 if how == "timeout" else 120)
        run = paused_run(prefect, flow)
        if how == "reject":
            assert approve(prefect, run, "--by", "carol", "--reject", "--reason", "not on a Friday").returncode == 0
        outcome = finish(flow, out)
        again = approve(prefect, run, "--by", "dave")
        weight = httpx.get(f"{gw}/admin/weights").json()["candidate"]
        replayed = traffic.wait()
    assert outcome["status"] == ("rejected" if how == "reject" else "timed_out"), outcome["reason"]
    assert flow.returncode == (exit_codes.REJECTED if how == "reject" else exit_codes.TIMED_OUT) and weight == 0.0
    assert again.returncode == 2 and "cannot be resumed" in again.stderr
    (entry,) = [a for a in audit(prefect) if a["flow_run_id"] == run]
    assert entry["decision"] == ("rejected" if how == "reject" else "timed out")
    assert sorted(r["request_id"] for r in rows(record)) == sorted(replayed["request_id"])


def test_a_killed_candidate_rolls_back_and_loses_no_request(prefect: dict, tmp_path: Path) -> None:
    record, out = tmp_path / "rows.jsonl", tmp_path / "killed"
    with twin_server(*TWIN) as (_, base), twin_server(*TWIN) as (cand_proc, cand), gateway(base, cand, record) as gw:
        traffic = Traffic(gw, 30.0)
        flow = start_flow(prefect, gw, cand, out, "")
        deadline = time.monotonic() + 120
        while httpx.get(f"{gw}/admin/weights").json()["candidate"] < 0.5:  # the second step has begun
            assert flow.poll() is None and time.monotonic() < deadline, (out.parent / f"{out.name}.log").read_text()[
                -3000:
            ]
            time.sleep(0.2)
        os.kill(cand_proc.pid, signal.SIGKILL)
        outcome = finish(flow, out)
        replayed = traffic.wait()
    assert outcome["status"] == "rolled_back" and "error_rate" in outcome["reason"], outcome["reason"]
    assert flow.returncode == exit_codes.ROLLED_BACK and outcome["outcome"] == "ROLLED BACK"
    got = rows(record)
    assert sorted(r["request_id"] for r in got) == sorted(replayed["request_id"])
    by_id = dict(zip(replayed["request_id"], replayed["status"], strict=True))
    assert all(by_id[r["request_id"]] == r["status"] for r in got)  # the client saw what the gateway recorded
    assert any(r["retried"] or r["outcome"] == "failed_midstream" for r in got)  # the kill was felt, and counted
    assert all(r["status"] == "ok" or r["outcome"] == "failed_midstream" for r in got)


def test_the_shadow_flow_reports_and_tracks_its_verdicts(prefect: dict, tmp_path: Path) -> None:
    import mlflow
    import pyarrow.parquet as pq

    trace, out = tmp_path / "trace.parquet", tmp_path / "shadow"
    pq.write_table(_trace(8.0), trace)
    with twin_server(*TWIN) as (_, base), twin_server(*TWIN) as (_, cand):
        r = subprocess.run(
            [
                *LLMCAP,
                "rollout",
                "shadow",
                "--baseline",
                base,
                "--candidate",
                cand,
                "--trace",
                str(trace),
                "--predictions",
                str(prefect["predictions"]),
                "--share",
                "0.5",
                "--ttft-target-ms",
                "500",
                "--tolerances",
                json.dumps({"min_requests": 8}),
                "--out",
                str(out),
                "--project",
                str(prefect["root"]),
            ],
            cwd=ROOT,
            env=prefect["env"],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert (
        summary["production_unharmed"] and summary["shadow_as_predicted"] and summary["production"]["with"]["ok"] == 80
    )
    assert "Production unharmed: yes" in (out / "shadow.md").read_text()
    assert pq.read_table(out / "shadow.parquet").num_rows == summary["mirror"]["mirrored"] > 0
    mlflow.set_tracking_uri(prefect["env"]["MLFLOW_TRACKING_URI"])
    (run,) = mlflow.search_runs(experiment_names=["shadow"], output_format="list")
    assert run.data.tags["shadow.production_unharmed"] == "True" and run.data.metrics["production_with_ok"] == 80


def test_a_rollout_whose_gateway_does_not_answer_is_unreachable(prefect: dict, tmp_path: Path) -> None:
    import socket

    out = tmp_path / "dead"
    with socket.socket() as closed:  # bound, never listening: the gateway's metrics and admin API refuse
        closed.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{closed.getsockname()[1]}"
        flow = start_flow(prefect, dead, dead, out, "")
        flow.wait(300)
    log = (out.parent / f"{out.name}.log").read_text()
    assert flow.returncode == exit_codes.UNREACHABLE, log[-3000:]
    assert f"error: {dead}" in log and "no answer (ConnectError" in log and not (out / "outcome.json").exists()
