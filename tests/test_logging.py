"""Library logging: modules log to `logging.getLogger(__name__)` (the `llmcap` hierarchy); the command line
shows it on stderr at `--log-level` (or LLMCAP_LOG_LEVEL), warnings only by default."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmcap.trace import CleanParams, TraceParams, ingest

CSV = "arrival_s,isl,osl\n0.0,100,10\n0.5,-3,10\n1.0,200,x\n1.5,300,20\n"


def _trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.csv"
    path.write_text(CSV)
    return path


def test_cleaning_logs_its_accounting(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="llmcap"):
        result = ingest(_trace(tmp_path), TraceParams(file="t.csv"), CleanParams())
    (record,) = [r for r in caplog.records if r.name == "llmcap.trace.clean"]
    assert record.levelno == logging.INFO and result.report.rows_quarantined == 2
    assert record.getMessage().startswith("t.csv: 4 rows in, 2 kept, 2 quarantined (")


def _clean(tmp_path: Path, *options: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable,
        "-m",
        "llmcap",
        *options,
        "trace",
        "clean",
        str(_trace(tmp_path)),
        "--out",
        str(tmp_path / "c.parquet"),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, env=env)


def test_the_command_line_shows_the_log_at_the_level_asked(tmp_path: Path) -> None:
    quiet = _clean(tmp_path)
    assert quiet.returncode == 0 and "rows in, 2 kept" not in quiet.stderr  # default: warnings only
    loud = _clean(tmp_path, "--log-level", "info")
    assert loud.returncode == 0 and "INFO" in loud.stderr and "t.csv: 4 rows in, 2 kept, 2 quarantined" in loud.stderr
    by_env = _clean(tmp_path, env={**os.environ, "LLMCAP_LOG_LEVEL": "info"})
    assert "t.csv: 4 rows in, 2 kept" in by_env.stderr
    bad = _clean(tmp_path, "--log-level", "loud")
    assert bad.returncode == 2 and "error: --log-level 'loud': choose one of debug, info, warning, error" in bad.stderr
