"""Re-plan on an upgrade, promoted only by approval, against a real Prefect server this test starts
(`python -m flows.server start`: loopback, free port, stopped by its PID) and the runner `flows.serve`.

In a throw-away copy of the repository with a committed plan A, a twin of the planned configuration stands
for the serving engine; it is `profile.endpoint` (the watched endpoint by default), so the profile stage
measures it whenever the profile is stale:
- the deployments exist with the schedules of params.yaml `watch`;
- a `watch` run while the twin reports the planned engine version re-plans nothing;
- the twin "upgraded" (--engine-version): `watch` marks the profile stale, re-profiles the twin, re-plans on
  the new profile, writes the diff and pauses; a raw API resume (unsigned) and a signed one by an approver not
  in params `approvals.approvers` are refused and the run pauses again; `llmcap approve RUN` run as alice (her
  git identity) commits the plan, authored by her, with its line in the committed decisions log, and
  `llmcap history` says approved by alice;
- another upgrade, rejected by bob: params.yaml, dvc.lock and the capacity outputs stay as committed, the
  rejection is a commit of the decisions log authored by bob, history says rejected by bob, the run cannot be
  resumed again, and the same upgrade is not asked about twice;
- an upgrade nobody approves in time: the same, a commit of the log says timed out, and the next watch raises
  it again with a reminder;
- a new trace under the planned name: re-planned from it, approved by carol, committed; then nothing new.
The runner runs with PREFECT_LOGGING_LEVEL=WARNING, as `make serve` exports it: the flows' INFO lines (the
approval hint among them) must still reach the server's API, and the paused run carries the hint and the
decision diff as its markdown artifact; a timed-out promotion ends COMPLETED, not FAILED. The approved plan's
MLflow run says per pool what it is and what sized it (`plan.<pool>.*`), never "None".
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
import yaml

from flows import server
from tests.pipeline._project import make_project, sh

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]
LLMCAP = [sys.executable, "-m", "llmcap"]
APPROVERS = ("alice", "bob", "carol")


def _as(env: dict, who: str) -> dict:
    """The environment of `who` running a command: their git identity (the approver is who runs `llmcap approve`)."""
    return {**env, "GIT_AUTHOR_NAME": who, "GIT_AUTHOR_EMAIL": f"{who}@example.com"}


def _log(p: dict, rev: str = "HEAD") -> list[dict]:
    """The committed decisions log at `rev`."""
    from ops.decisions_log import read

    return read(p["root"], rev)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def twin(port: int, version: str) -> Iterator[str]:
    """A twin of the configuration params `profile` describes (the default model on H100 TP4), reporting
    `version` at GET /version; stopped by its PID."""
    from tests.twin._twin import twin_server

    with twin_server(
        "-m", "Llama-3.1-70B", "-g", "h100", "--tp", "4", "--port", str(port), "--engine-version", version
    ) as (_, url):
        yield url


class _Retrying(httpx.Client):
    """Retries a busy server's 429/502/503 with backoff, as Prefect's own client does (a loaded machine's
    Prefect server answers 503 while its database is busy)."""

    def send(self, request: httpx.Request, **kwargs) -> httpx.Response:  # type: ignore[override]
        for attempt in range(6):
            response = super().send(request, **kwargs)
            if response.status_code not in (429, 502, 503) or attempt == 5:
                return response
            response.close()
            time.sleep(0.5 * 2**attempt)
        raise AssertionError("unreachable")


class Api:
    """The few Prefect REST calls the test makes (plain HTTP: the test process keeps its own Prefect settings)."""

    def __init__(self, url: str) -> None:
        self.http = _Retrying(base_url=url, timeout=30.0)

    def deployment(self, name: str) -> dict:
        return self.http.get(f"/deployments/name/{name}").raise_for_status().json()

    def run(self, name: str, **parameters: object) -> str:
        dep = self.deployment(name)
        body = {"parameters": {**dep["parameters"], **parameters}}
        return self.http.post(f"/deployments/{dep['id']}/create_flow_run", json=body).raise_for_status().json()["id"]

    def state(self, run_id: str) -> str:
        return self.http.get(f"/flow_runs/{run_id}").raise_for_status().json()["state"]["type"]

    def wait(self, run_id: str, until: set[str], timeout_s: float = 900.0) -> str:
        deadline = time.monotonic() + timeout_s
        while (state := self.state(run_id)) not in until:
            assert state not in {"FAILED", "CRASHED", "CANCELLED"} - until, f"flow run {run_id} ended {state}"
            assert time.monotonic() < deadline, f"flow run {run_id} still {state} after {timeout_s} s"
            time.sleep(0.5)
        return state

    def paused_promotion(self, parent: str, timeout_s: float = 900.0) -> str:
        """The `promote` subflow run of the watch run `parent`, once it is paused for approval."""
        deadline = time.monotonic() + timeout_s
        while True:
            runs = self.http.post(
                "/flow_runs/filter", json={"flow_runs": {"state": {"type": {"any_": ["PAUSED"]}}}}
            ).json()
            if runs:
                assert len(runs) == 1, runs
                return runs[0]["id"]
            state = self.state(parent)
            assert state in ("SCHEDULED", "PENDING", "RUNNING"), f"watch run {parent} ended {state} before pausing"
            assert time.monotonic() < deadline, f"no paused promotion after {timeout_s} s"
            time.sleep(0.5)

    def printed(self, run_id: str, text: str, timeout_s: float = 60.0) -> bool:
        """Whether a flow run printed `text` (its logs on the server: flow results are not persisted). The run's
        logs are sent in batches and may reach the server after its final state: wait for them a while."""
        deadline = time.monotonic() + timeout_s
        while True:
            logs = (
                self.http.post("/logs/filter", json={"logs": {"flow_run_id": {"any_": [run_id]}}})
                .raise_for_status()
                .json()
            )
            if any(text in entry["message"] for entry in logs):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.5)

    def artifacts(self, run_id: str, key: str) -> list[str]:
        """The markdown of every version of a flow run's artifact `key`, oldest first."""
        body = {"artifacts": {"flow_run_id": {"any_": [run_id]}, "key": {"any_": [key]}}, "sort": "CREATED_DESC"}
        newest_first = self.http.post("/artifacts/filter", json=body).raise_for_status().json()
        return [a["data"] for a in reversed(newest_first) if a["type"] == "markdown"]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    root, env = make_project(tmp_path_factory.mktemp("watch") / "llmcap", native=True)
    port = _free_port()
    params = yaml.safe_load((root / "params.yaml").read_text())
    # Smaller still than make_project's (same code path): ten minutes of the trace, one GPU type and format.
    params["clean"]["window_end_s"] = 600
    params["enumerate"].update(gpus=["H100-SXM-80GB"], weight_quants=["bf16"], kv_dtypes=["bf16"], modes=["aggregated"])
    params["enumerate"]["parallel"]["tp"] = [4, 8]
    params["enumerate"]["aggregated"]["max_num_batched_tokens"] = [8192]
    params["size"].update(confirm_whole_trace="off", max_simulated=1)
    # the twin is the endpoint to profile (a small grid: four cells of 16 tokens) and, by default, to watch
    params["profile"].update(
        engine_version="0.11.0",
        endpoint=f"http://127.0.0.1:{port}",
        isl=[256, 1024],
        concurrency=[1, 4],
        osl=16,
        repeats=1,
    )
    params["watch"].update(endpoints=[], interval_s=3600, replan_cron="0 6 * * 1")
    # the flows run as "t <t@localhost>" (sandbox_env): the trigger, who may not approve its own re-plans
    params["approvals"] = {"approvers": [f"{who}@example.com" for who in APPROVERS], "distinct_from_trigger": True}
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    sh(["git", "commit", "-qam", "watch the twin"], root, env)

    began = time.monotonic()
    started = server.start(root, _free_port())
    print(f"\nprefect server started in {time.monotonic() - began:.1f} s (pid {started['pid']})")
    # WARNING as the Makefile exports it for `make serve`: flows.serve itself makes its runs log INFO to the API
    env = {
        **env,
        "PREFECT_API_URL": started["url"],
        "PREFECT_RUNNER_POLL_FREQUENCY": "1",
        "PREFECT_LOGGING_LEVEL": "WARNING",
    }
    api = Api(started["url"])
    log = (root / ".work" / "serve.log").open("w")
    # The runner starts while plan A is made (its start-up overlaps the re-plan): it only reads params.yaml's
    # schedules, and no run is due before the test asks for one (interval 1 h from now, cron on Mondays 06:00).
    runner = subprocess.Popen(
        [sys.executable, "-m", "flows.serve"], cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        with twin(port, "0.11.0"):  # plan A's profile is measured on the planned engine
            sh([sys.executable, "-m", "flows.replan"], root, env, timeout=1800)
        assert json.loads((root / "data/processed/step_model.json").read_text())["source"] == "profile-measured"
        sh(["git", "add", "dvc.lock"], root, env)
        sh(["git", "commit", "-qm", "plan A"], root, env)
        deadline = time.monotonic() + 300
        while api.http.get("/deployments/name/promote/replan").status_code != 200:
            assert runner.poll() is None and time.monotonic() < deadline, (root / ".work" / "serve.log").read_text()[
                -3000:
            ]
            time.sleep(1.0)
        yield {"root": root, "env": env, "api": api, "twin_port": port}
    finally:
        runner.terminate()
        runner.wait(30)
        log.close()
        api.http.close()
        assert server.stop(root)


def _head(p: dict) -> str:
    return sh(["git", "rev-parse", "HEAD"], p["root"], p["env"]).stdout.strip()


def _history(p: dict) -> list[dict]:
    """The rows `llmcap history --json` prints, read in this process (the CLI takes ~30 s to start on a loaded
    machine; test_upgrade_approved_is_committed_and_in_history runs the CLI itself once)."""
    from ops.history import decisions

    return decisions(p["root"], tracking_uri=p["env"]["MLFLOW_TRACKING_URI"])


def test_deployments_carry_the_params_schedules(project: dict) -> None:
    api = project["api"]
    (watch_schedule,) = api.deployment("watch/watch")["schedules"]
    (replan_schedule,) = api.deployment("promote/replan")["schedules"]
    assert watch_schedule["active"] and watch_schedule["schedule"]["interval"] == 3600.0
    assert replan_schedule["active"] and replan_schedule["schedule"]["cron"] == "0 6 * * 1"


def test_no_upgrade_no_replan(project: dict) -> None:
    root, api = project["root"], project["api"]
    head, plans = _head(project), len(_history(project))
    with twin(project["twin_port"], "0.11.0"):
        run = api.run("watch/watch")
        assert api.wait(run, {"COMPLETED"}) == "COMPLETED"
    assert api.printed(run, "no upgrade")
    assert _head(project) == head and len(_history(project)) == plans
    assert sh(["git", "status", "--porcelain", "--untracked-files=no"], root, project["env"]).stdout == ""


def test_upgrade_approved_is_committed_and_in_history(project: dict, capsys: pytest.CaptureFixture[str]) -> None:
    from ops.history import render

    root, api, env = project["root"], project["api"], project["env"]
    head = _head(project)
    with twin(project["twin_port"], "0.12.0"):
        run = api.run("watch/watch")
        promotion = api.paused_promotion(run)
    diff = (root / ".work" / "decisions").glob("*/diff.md")
    assert any("engine_version" in d.read_text() for d in diff)  # the decision diff names the upgraded field
    # what an operator sees in the Prefect UI: the hint in the run's logs (INFO, under make serve's WARNING) and
    # the hint with the decision diff as the run's markdown artifact
    assert api.printed(promotion, f"plan awaits approval: llmcap approve {promotion} [--reject]")
    (shown,) = api.artifacts(promotion, "promotion")
    assert f"llmcap approve {promotion}" in shown and "engine_version" in shown, shown
    _refused(project, promotion)
    out = sh([*LLMCAP, "approve", promotion, "--comment", "0.12 soaked in staging"], root, _as(env, "alice")).stdout
    assert f"approved {promotion}" in out and "alice <alice@example.com>" in out
    assert api.wait(run, {"COMPLETED"}) == "COMPLETED"
    cli = subprocess.Popen(
        [*LLMCAP, "history", "--json"], cwd=root, env=env, stdout=subprocess.PIPE, text=True
    )  # checked below

    new = _head(project)
    assert new != head and "approved by alice" in sh(["git", "log", "-1", "--format=%s"], root, env).stdout
    assert sh(["git", "log", "-1", "--format=%an <%ae>"], root, env).stdout.strip() == "alice <alice@example.com>"
    (line,) = _log(project)  # the first decision of this repository, committed with the plan it approves
    assert (line["what"], line["by"], line["email"], line["flow_run_id"]) == (
        "approved",
        "alice",
        "alice@example.com",
        promotion,
    )
    assert line["base_commit"] == head and line["triggered_by"] == "t <t@localhost>" and line["plan"]["gpus"] >= 1
    committed = yaml.safe_load(sh(["git", "show", "HEAD:params.yaml"], root, env).stdout)
    assert committed["profile"]["engine_version"] == "0.12.0"
    approval = json.loads(sh(["git", "show", "HEAD:decisions/approval.json"], root, env).stdout)
    assert approval["by"] == "alice" and approval["decision"] == "approved" and approval["base_commit"] == head
    assert approval["comment"] == "0.12 soaked in staging" and approval["flow_run_id"] == promotion
    assert sh(["git", "status", "--porcelain", "--untracked-files=no"], root, env).stdout == ""
    newest = _history(project)[0]
    assert newest["approved_by"] == "alice" and newest["recorded_in"] == new
    assert approval["dvc_lock_sha256"] == newest["dvc_lock_sha256"]
    import mlflow

    tags = mlflow.MlflowClient(env["MLFLOW_TRACKING_URI"]).get_run(newest["run_id"]).data.tags
    assert "None" not in tags.values(), {k: v for k, v in tags.items() if v == "None"}
    pools = {k.split(".")[1] for k in tags if k.startswith("plan.") and k.endswith(".step_model")}
    summary = json.loads((root / "data/reports/capacity/summary.json").read_text())
    assert pools == set(summary["pool_plans"]) and pools  # every pool of the chosen plan, what sized it
    for pool in pools:
        assert tags[f"plan.{pool}.gpu"] == "H100-SXM-80GB" and tags[f"plan.{pool}.engine_version"] == "0.12.0"
        measured = tags[f"plan.{pool}.step_model"] == "profile-measured"
        assert measured == summary["pool_plans"][pool]["configuration"].startswith(
            "H100-SXM-80GB/bf16/kv-bf16/tp4pp1ep1/"
        )
        assert (tags.get(f"plan.{pool}.profile_fingerprint_hash") is not None) == measured
    assert "- **Pool " in (root / "data/reports/capacity/capacity.md").read_text()
    step_model = json.loads((root / "data/processed/step_model.json").read_text())
    assert step_model["fingerprint"]["engine_version"] == "0.12.0"  # the plan is for the upgraded engine
    # ... on a profile measured again, from the upgraded engine, and the sizing used it
    measured = json.loads((root / "data/reports/profile/measured/fingerprint.json").read_text())
    assert step_model["source"] == "profile-measured" and measured["engine_version"] == "0.12.0"
    assert (
        json.loads((root / "data/reports/capacity/summary.json").read_text())["step_model_source"] == "profile-measured"
    )
    rows = _history(project)
    printed, _ = cli.communicate(timeout=600)
    assert cli.returncode == 0 and json.loads(printed) == rows  # what the CLI prints
    render(rows)
    assert "alice" in capsys.readouterr().out


def _refused(p: dict, promotion: str) -> None:
    """What Prefect OSS lets anyone do, refused by the flow: a raw API resume (unsigned) and one signed with the
    project's key by someone not in approvals.approvers; `llmcap approve` as that person refuses before sending."""
    from ops import approvals

    api, root = p["api"], p["root"]
    raw = api.http.post(
        f"/flow_runs/{promotion}/resume", json={"run_input": {"approver": "alice", "decision": "approve"}}
    )
    assert raw.raise_for_status().json()["status"] == "ACCEPT"  # the server takes it: the flow must refuse it
    assert api.printed(promotion, "refused approve from 'alice': unsigned")
    assert api.wait(promotion, {"PAUSED"}) == "PAUSED"  # waiting again
    mallory = approvals.Identity("mallory", "mallory@example.com", "mallory")
    signed = approvals.signed_input(approvals.approval_key(root), promotion, mallory, "approve", "")
    api.http.post(f"/flow_runs/{promotion}/resume", json={"run_input": signed}).raise_for_status()
    assert api.printed(promotion, "mallory <mallory@example.com> is not an approver")
    assert api.wait(promotion, {"PAUSED"}) == "PAUSED"
    cli = sh([*LLMCAP, "approve", promotion], root, _as(p["env"], "mallory"), ok=False)
    assert cli.returncode == 2 and "is not an approver" in cli.stderr, cli.stderr
    assert "Refused" in api.artifacts(promotion, "promotion")[-1]
    assert _log(p) == []  # nothing decided yet


def test_upgrade_rejected_leaves_the_plan_in_force(project: dict) -> None:
    root, api, env = project["root"], project["api"], project["env"]
    head = _head(project)
    capacity = (root / "data/processed/capacity.parquet").read_bytes()
    with twin(project["twin_port"], "0.13.0"):
        run = api.run("watch/watch")
        promotion = api.paused_promotion(run)
        assert (
            yaml.safe_load((root / "params.yaml").read_text())["profile"]["engine_version"] == "0.13.0"
        )  # marked stale meanwhile
        sh(
            [*LLMCAP, "approve", promotion, "--by", "bob", "--reject", "--comment", "regresses ITL"],
            root,
            _as(env, "bob"),
        )
        assert api.wait(run, {"COMPLETED"}) == "COMPLETED"

        # one new commit, of the decisions log alone, authored by bob: the plan in force is HEAD~1's
        assert sh(["git", "rev-parse", "HEAD~1"], root, env).stdout.strip() == head
        assert sh(["git", "show", "--format=%an", "--name-only", "HEAD"], root, env).stdout.split() == [
            "bob",
            "decisions/log.jsonl",
        ]
        line = _log(project)[-1]
        assert (line["what"], line["by"], line["comment"], line["flow_run_id"]) == (
            "rejected",
            "bob",
            "regresses ITL",
            promotion,
        )
        assert (
            sh(["git", "status", "--porcelain", "--untracked-files=no"], root, env).stdout == ""
        )  # params.yaml, dvc.lock as committed
        assert (root / "data/processed/capacity.parquet").read_bytes() == capacity
        rows = _history(project)
        assert rows[0]["approved_by"] == "rejected by bob" and rows[0]["recorded_in"] is None
        assert rows[1]["approved_by"] == "alice"

        repeat = api.run("watch/watch")  # the same upgrade: decided already, no new plan
        again = sh(
            [*LLMCAP, "approve", promotion, "--by", "bob"], root, _as(env, "bob"), ok=False
        )  # while the runner runs `repeat`
        assert again.returncode == 2 and "not paused" in again.stderr
        assert api.wait(repeat, {"COMPLETED"}) == "COMPLETED"
    assert api.printed(repeat, f"already decided (rejected by bob at {line['at']})")
    assert len(_history(project)) == len(rows) and len(_log(project)) == 2
    audit = [json.loads(line) for line in (root / ".work/decisions/approvals.jsonl").read_text().splitlines()]
    assert [(a["decision"], a["by"]) for a in audit] == [("approved", "alice"), ("rejected", "bob")]


def test_approval_timeout_leaves_the_plan_in_force(project: dict) -> None:
    root, api, env = project["root"], project["api"], project["env"]
    head = _head(project)
    with twin(project["twin_port"], "0.14.0"):
        run = api.run("watch/watch", approval_timeout_s=10)
        promotion = api.paused_promotion(run)
        assert api.wait(run, {"COMPLETED"}) == "COMPLETED"  # nobody approved: the pause timed out
    assert api.state(promotion) == "COMPLETED"  # a decision carried out (the old plan kept), not a failure
    # the server fails an expired pause ("paused and never resumed"): the flow puts the run back to Running at once
    history = api.http.get("/flow_run_states/", params={"flow_run_id": promotion}).raise_for_status().json()
    assert any(s["type"] == "RUNNING" and "approval timed out" in (s["message"] or "") for s in history), history
    assert "Timed out" in api.artifacts(promotion, "promotion")[-1]
    assert sh(["git", "rev-parse", "HEAD~1"], root, env).stdout.strip() == head  # a commit of the log alone
    assert sh(["git", "show", "--format=", "--name-only", "HEAD"], root, env).stdout.split() == ["decisions/log.jsonl"]
    assert sh(["git", "status", "--porcelain", "--untracked-files=no"], root, env).stdout == ""
    assert _history(project)[0]["approved_by"] == "timed out"
    timed_out = _log(project)[-1]
    assert (timed_out["what"], timed_out["by"], timed_out["flow_run_id"]) == ("timed_out", None, promotion)
    # not a rejection: the next watch raises the same upgrade again, reminding when it timed out
    with twin(project["twin_port"], "0.14.0"):
        again = api.run("watch/watch", approval_timeout_s=10)
        second = api.paused_promotion(again)
        assert api.wait(again, {"COMPLETED"}) == "COMPLETED"
    assert second != promotion
    assert api.printed(
        again, f"reminder: this was raised before and timed out undecided at {timed_out['at']} (flow run {promotion})"
    )
    assert [line["what"] for line in _log(project)][-2:] == ["timed_out", "timed_out"]
    assert _log(project)[-1]["fingerprint"] == timed_out["fingerprint"]


def test_a_new_trace_is_replanned_through_an_approval(project: dict) -> None:
    root, api, env = project["root"], project["api"], project["env"]
    head = _head(project)
    trace = root / "data/raw" / yaml.safe_load((root / "params.yaml").read_text())["trace"]["file"]
    # the operator puts the next period's trace under the same name: here every tenth request of the old one is gone
    lines = trace.read_text().splitlines(keepends=True)
    trace.write_text("".join(line for i, line in enumerate(lines) if i % 10 != 9))
    sh(["git", "commit", "-qam", "next period's trace"], root, env)
    traced = _head(project)
    with twin(project["twin_port"], "0.12.0"):  # the engine the plan is for: only the trace is new
        run = api.run("watch/watch")
        promotion = api.paused_promotion(run)
        sh([*LLMCAP, "approve", promotion, "--by", "carol"], root, _as(env, "carol"))
        assert api.wait(run, {"COMPLETED"}) == "COMPLETED"
    assert api.printed(run, "new trace: trace ")
    message = sh(["git", "log", "-1", "--format=%s"], root, env).stdout
    assert _head(project) not in (head, traced) and "new trace" in message and "approved by carol" in message
    report = json.loads((root / "data/reports/clean/clean_report.json").read_text())
    assert report["rows_in"] == len(lines) - len(lines) // 10  # the plan was made from the new file
    assert _history(project)[0]["approved_by"] == "carol"
    with twin(project["twin_port"], "0.12.0"):  # planned now: nothing new
        again = api.run("watch/watch")
        assert api.wait(again, {"COMPLETED"}) == "COMPLETED"
    assert api.printed(again, "no upgrade and no new trace")
