"""Types: mypy with the configuration pyproject.toml holds ([tool.mypy]: the pydantic plugin, unused ignores
reported) over the `llmcap` package."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

CACHE = ROOT / ".work" / "mypy-cache"


def test_mypy_finds_nothing() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(CACHE)], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_would_catch_a_wrong_type(tmp_path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text('x: int = "a"\n')
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(tmp_path / "cache"),
            str(bad),
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 1 and "[assignment]" in out.stdout, out.stdout + out.stderr
