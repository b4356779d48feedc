"""Lint and format: ruff with the rules pyproject.toml selects (names, syntax, imports, bugbear, pyupgrade, simplify)
and `ruff format` at its 120 columns, over every Python file of the repository."""

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


def test_the_tree_is_formatted() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "."], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_ruff_would_catch_an_unformatted_file_and_a_bugbear(tmp_path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f(x=[]):\n    return zip(x,x)\n")
    config = ["--config", str(ROOT / "pyproject.toml")]
    fmt = subprocess.run([sys.executable, "-m", "ruff", "format", "--check", *config, str(bad)], capture_output=True)
    lint = subprocess.run([sys.executable, "-m", "ruff", "check", *config, str(bad)], capture_output=True, text=True)
    assert fmt.returncode == 1
    assert lint.returncode == 1 and "B006" in lint.stdout and "B905" in lint.stdout
