"""`llmcap replay` against a real `llmcap twin serve` process (127.0.0.1, stopped by PID): every request
has a row, the summary's statuses add up, outputs are written, injected errors are counted as misses,
and a run that cannot keep its schedule is reported INVALID with exit 3."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from llmcap import exit_codes
from llmcap.cli import app
from tests.twin._twin import twin_server

pytestmark = [pytest.mark.timeout(120), pytest.mark.timing]
runner = CliRunner()


@contextmanager
def twin(*extra: str) -> Iterator[str]:
    with twin_server("-m", "Llama-3.1-8B", "-g", "h100", *extra) as (_, url):
        yield url


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,isl,osl\n" + "".join(f"{k * 0.05:.2f},{100 + 7 * k},{8 + k % 5}\n" for k in range(40)))
    return path


def test_every_request_is_accounted_for_and_written(trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    with twin() as url:
        args = [
            "replay",
            "--endpoint",
            url,
            "-t",
            str(trace),
            "--slo-ttft-ms",
            "2000",
            "--slo-itl-ms",
            "200",
            "--out",
            str(out),
            "--json",
        ]
        result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    s = json.loads(result.stdout)
    assert s["requests"] == 40 and s["status"] == {"ok": 40, "unfinished": 0, "rejected": 0}
    assert s["valid"] and s["send_lateness_ms"]["max"] <= s["max_lateness_ms"]
    assert s["client"]["processes"] == 1 and s["client"]["cpu_s"] > 0  # 40 requests: one sender is plenty
    assert s["slo"]["attainment"] == 1.0 and s["model"] and s["input_accounting"]["rows_kept"] == 40
    records = pq.read_table(out / "records.parquet")
    assert records.num_rows == 40 and sorted(records.column("request_id").to_pylist()) == list(range(40))
    assert records.column("osl").to_pylist() == [8 + k % 5 for k in range(40)]  # exact OSL came back
    assert json.loads((out / "summary.json").read_text())["requests"] == 40


def test_errors_are_rows_and_misses_and_fail_the_run(trace: Path) -> None:
    with twin("--error-rate", "0.5", "--seed", "1") as url:
        result = runner.invoke(app, ["replay", "--endpoint", url, "-t", str(trace), "--slo-ttft-ms", "2000", "--json"])
    assert result.exit_code == exit_codes.FAILED, result.output
    s = json.loads(result.stdout)
    assert s["requests"] == 40 and sum(s["status"].values()) == 40
    assert 0 < s["status"]["rejected"] < 40
    assert s["slo"]["misses"]["status"] > 0 and s["slo"]["attainment"] < 1.0
    assert s["valid"] is False and s["outcome"] == "FAILED" and "--max-failed 1.0%" in s["outcome_reason"]


def test_a_closed_port_is_unreachable(trace: Path) -> None:
    import socket

    with socket.socket() as sock:  # a port nothing listens on (bound, never listening: connections are refused)
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        result = runner.invoke(
            app, ["replay", "--endpoint", url, "--model", "m", "-t", str(trace), "--timeout", "2", "--json"]
        )
    assert result.exit_code == exit_codes.UNREACHABLE, result.output
    s = json.loads(result.stdout)
    assert (
        s["status"]["ok"] == 0
        and sum(s["status"].values()) == 40
        and s["valid"] is False
        and s["outcome"] == "UNREACHABLE"
    )


def test_a_twin_that_dies_mid_run_fails_it(trace: Path) -> None:
    with twin("--crash-after", "10") as url:
        result = runner.invoke(app, ["replay", "--endpoint", url, "-t", str(trace), "--timeout", "5", "--json"])
    assert result.exit_code == exit_codes.FAILED, result.output
    s = json.loads(result.stdout)
    assert (
        sum(s["status"].values()) == 40 and 0 < s["status"]["ok"] <= 10 and s["valid"] is False
    )  # streams open at the crash are cut


def test_a_slow_server_misses_the_slo(trace: Path) -> None:
    with twin("--slowdown", "5") as url:
        result = runner.invoke(app, ["replay", "--endpoint", url, "-t", str(trace), "--slo-ttft-ms", "1", "--json"])
    assert result.exit_code == exit_codes.SLO_MISSED, result.output
    s = json.loads(result.stdout)
    assert (
        s["status"]["ok"] == 40
        and s["valid"] is True
        and s["slo"]["attainment"] < 0.99
        and s["outcome"] == "SLO MISSED"
    )


def test_a_run_that_misses_its_schedule_is_invalid(trace: Path) -> None:
    with twin() as url:
        result = runner.invoke(
            app, ["replay", "--endpoint", url, "-t", str(trace), "--max-lateness-ms", "1e-6", "--json"]
        )
    assert result.exit_code == exit_codes.INVALID, result.output
    assert json.loads(result.stdout)["valid"] is False


def test_a_closed_port_without_a_model_name_is_unreachable_too(trace: Path) -> None:
    import socket

    with socket.socket() as sock:  # the first request (GET /v1/models, to learn the model) is refused
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        result = runner.invoke(app, ["replay", "--endpoint", url, "-t", str(trace), "--json"])
    assert result.exit_code == exit_codes.UNREACHABLE, result.output
    assert (
        result.stderr.startswith(f"error: {url}: no answer (ConnectError") and "is the server up?" in result.stderr
    ), result.stderr


def _most_in_flight(records) -> int:
    """The most requests between their send and their last token at any instant (sends are the intervals' starts)."""
    sent, done = records.column("arrival_s").to_numpy(), records.column("finish_s").to_numpy()
    return max(int(((sent <= t) & (done > t)).sum()) for t in sent)


def test_closed_loop_keeps_n_clients_busy_and_says_it_is_not_capacity(trace: Path, tmp_path: Path) -> None:
    """--max-concurrency 3: never more than 3 in flight, and 3 most of the time — each client sends its next request
    as its last one ends, whatever the trace's arrival times (40 requests 50 ms apart would otherwise overlap)."""
    out = tmp_path / "closed"
    with twin() as url:
        result = runner.invoke(
            app,
            [
                "replay",
                "--endpoint",
                url,
                "-t",
                str(trace),
                "--max-concurrency",
                "3",
                "--slo-ttft-ms",
                "2000",
                "--out",
                str(out),
                "--json",
            ],
        )
        refused = runner.invoke(
            app, ["replay", "--endpoint", url, "-t", str(trace), "--max-concurrency", "3", "--request-rate", "5"]
        )
    assert result.exit_code == 0, result.output
    s = json.loads(result.stdout)
    assert s["mode"] == "closed loop" and s["max_concurrency"] == 3 and "not capacity" in s["caveat"]
    assert s["requests"] == 40 and s["status"]["ok"] == 40 and s["send_lateness_ms"] is None and s["valid"]
    records = pq.read_table(out / "records.parquet")
    assert _most_in_flight(records) == 3
    # the achieved rate is the clients' pace: 40 requests over the run's wall time
    assert s["mean_rate_rps"] == pytest.approx(40 / s["wall_s"])
    # each send after the first three follows a finish (a client freed) within a few ms
    sent, done = sorted(records.column("arrival_s").to_pylist()), sorted(records.column("finish_s").to_pylist())
    assert all(0 <= sent[k + 3] - done[k] < 0.05 for k in range(37))
    assert refused.exit_code == 2 and "drop --request-rate" in refused.stderr
