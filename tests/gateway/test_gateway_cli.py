"""`llmcap gateway` as its own process in front of a `llmcap twin serve` process: serves, moves weight
through the admin API, stops on SIGTERM and leaves the rows as JSON lines and Parquet."""

from __future__ import annotations

import select
import signal
import subprocess
import sys

import httpx
import pyarrow.parquet as pq
import pytest

from llmcap import exit_codes
from llmcap.commands.gateway import parse_shadow
from llmcap.errors import LlmcapError
from llmcap.live.client import stream_completion, token_prompt
from tests.conftest import ROOT
from tests.twin._twin import twin_server

pytestmark = pytest.mark.timeout(120)


def test_the_gateway_process_serves_and_records(tmp_path):
    import asyncio

    record = tmp_path / "gw" / "rows.jsonl"
    with twin_server("--model", "Llama-3.1-8B", "--gpu", "H100-SXM-80GB", "--served-model-name", "m") as (_, twin_url):
        cmd = [
            sys.executable,
            "-m",
            "llmcap",
            "gateway",
            "--baseline",
            twin_url,
            "--candidate",
            twin_url,
            "--port",
            "0",
            "--record",
            str(record),
        ]
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            ready, _, _ = select.select([proc.stdout], [], [], 60)
            line = proc.stdout.readline() if ready else ""
            assert "llmcap gateway:" in line, proc.stderr.read() if proc.poll() is not None else line
            url = line.strip().rsplit(" ", 1)[-1]

            async def traffic():
                async with httpx.AsyncClient() as c:
                    a = await stream_completion(c, url, "m", token_prompt(40, 1000, 1), 5, timeout_s=20)
                    w = (await c.post(f"{url}/admin/weights", json={"candidate": 1.0})).json()
                    b = await stream_completion(c, url, "m", token_prompt(40, 1000, 2), 5, timeout_s=20)
                    models = (await c.get(f"{url}/v1/models")).json()
                    return a, w, b, models

            a, w, b, models = asyncio.run(traffic())
            assert a.status == b.status == "ok" and a.tokens == b.tokens == 5
            assert w["candidate"] == 1.0 and models["data"][0]["id"] == "m"
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(20)
            proc.stdout.close()
            proc.stderr.close()
    assert proc.returncode == 0
    table = pq.read_table(record.with_suffix(".parquet")).to_pydict()
    assert table["side"] == ["baseline", "candidate"] and table["status"] == ["ok", "ok"]
    assert len(record.read_text().splitlines()) == 2


def test_a_gateway_whose_deployment_serves_nothing_exits_unreachable(tmp_path):
    import asyncio
    import socket

    record = tmp_path / "rows.jsonl"
    with socket.socket() as closed:  # bound, never listening: every forward is refused
        closed.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{closed.getsockname()[1]}"
        proc = subprocess.Popen(
            [sys.executable, "-m", "llmcap", "gateway", "--baseline", dead, "--port", "0", "--record", str(record)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            ready, _, _ = select.select([proc.stdout], [], [], 60)
            url = proc.stdout.readline().strip().rsplit(" ", 1)[-1] if ready else ""

            async def traffic():
                async with httpx.AsyncClient() as c:
                    return [
                        await stream_completion(c, url, "m", token_prompt(40, 1000, k), 5, timeout_s=20)
                        for k in range(3)
                    ]

            sent = asyncio.run(traffic())
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=20)
    assert [r.status for r in sent] == ["rejected"] * 3
    assert proc.returncode == exit_codes.UNREACHABLE, err
    assert "UNREACHABLE: not one of 3 requests was served" in err
    assert pq.read_table(record.with_suffix(".parquet")).column("outcome").to_pylist() == ["rejected"] * 3


def test_shadow_options_parse_or_say_what_is_wrong():
    s = parse_shadow("new=http://127.0.0.1:8001,0.25", 4)
    assert (s.name, s.url, s.share, s.max_in_flight) == ("new", "http://127.0.0.1:8001", 0.25, 4)
    assert parse_shadow("b=http://h:1", 4).share == 1.0
    for bad in ("http://h:1", "a=h:1", "a=http://h:1,2", "a=http://h:1,x"):
        with pytest.raises(LlmcapError, match="--shadow"):
            parse_shadow(bad, 4)
