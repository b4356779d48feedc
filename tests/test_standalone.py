"""The project stands alone: no tracked file points to documents outside the repository."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTSIDE = (
    "../" + "shared",
    "DESIGN" + ".md",
    "DEVELOPERS" + ".md",
)  # spelled in parts so this file does not match itself


def test_no_tracked_file_cites_a_document_outside_the_repository():
    tracked = (
        subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout.decode().split("\0")
    )
    cited = []
    for name in filter(None, tracked):
        path = ROOT / name
        if not path.is_file() or path.suffix in {".parquet", ".png", ".gz", ".lock"} or path.stat().st_size > 2_000_000:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        cited += [f"{name}: {needle}" for needle in OUTSIDE if needle in text]
    assert not cited, "cites documents outside the repository (their content belongs in docs/):\n" + "\n".join(cited)


def test_the_docs_the_code_cites_exist():
    for doc in ("domain.md", "architecture.md", "stack-notes.md"):
        assert (ROOT / "docs" / doc).read_text(encoding="utf-8").startswith("# ")
