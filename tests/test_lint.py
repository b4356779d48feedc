"""Lint: ruff with the rules pyproject.toml selects (unused or undefined names, redefinitions, syntax errors)
over every Python file of the repository."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def test_ruff_finds_nothing() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--output-format", "concise", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_ruff_would_catch_an_unused_import(tmp_path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n")
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--config", str(ROOT / "pyproject.toml"), str(bad)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 1 and "F401" in out.stdout
