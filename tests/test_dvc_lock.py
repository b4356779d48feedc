"""CI's check that the committed dvc.lock is the decision of the code, params and data at HEAD (issue 34, item 2):
`python -m ops.lockcheck` exports HEAD's files as a clean clone has them (no outputs), asks DVC (`dvc status`)
whether any stage's deps, params or command differ from the lock, checks the lock's own consistency, and that
the size stage (whose report names its code's commit) was recorded after its code's last commit. A few
seconds; the failing cases are shown on copies under tmp_path, never on the checkout."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ops.lockcheck import export, recorded_after_code
from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(
    not (ROOT / ".git").exists(), reason="not a git checkout: no committed dvc.lock to check"
)


def _check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ops.lockcheck", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_the_committed_lock_matches_head() -> None:
    out = _check()
    assert out.returncode == 0, (
        f"dvc.lock at HEAD is stale (re-plan: make plan, then commit dvc.lock):\n{out.stdout}{out.stderr}"
    )


def _git(cwd: Path, *args: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@localhost",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@localhost",
        "PATH": "/usr/bin:/bin",
    }
    return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True).stdout.strip()


def _stale(tree: Path) -> set[str]:
    out = _check("--worktree", "--root", str(tree))
    assert out.returncode in (0, 1), out.stdout + out.stderr
    return set(out.stdout.splitlines()) if out.returncode == 1 else set()


def test_a_changed_dep_or_param_makes_the_lock_stale(tmp_path: Path) -> None:
    # HEAD's files as a clean clone has them (no outputs): what HEAD's own staleness is, the test above says;
    # here each change must add its own finding to that
    tree = export(ROOT, "HEAD", tmp_path)
    before = _stale(tree)
    assert not any(
        "outs" in line or "not in cache" in line or "deleted" in line for line in before
    )  # absent outputs are no finding

    size = tree / "stages" / "size.py"
    code = size.read_text()
    size.write_text(code.replace("\n", "\n# one more line\n", 1))
    added = _stale(tree) - before
    assert added == {"size: dep stages/size.py modified"}, added  # only the stage that depends on it
    size.write_text(code)
    assert _stale(tree) == before

    params = yaml.safe_load((tree / "params.yaml").read_text())
    params["clean"]["max_context_tokens"] += 1
    (tree / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    assert _stale(tree) - before == {
        "clean: param clean modified (params.yaml differs from the lock)"
    }  # (DVC names the section)


def test_a_size_entry_recorded_before_its_code_is_stale(tmp_path: Path) -> None:
    # The capacity report names the last commit that changed the sizing code: a lock recorded before that
    # commit (here: committed with it) names an older one than a re-run at HEAD does.
    repo = export(ROOT, "HEAD", tmp_path)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "code and lock together")
    stale = recorded_after_code(repo, "HEAD", repo)
    assert len(stale) == 1 and stale[0].startswith("size: dvc.lock's entry was recorded at"), stale

    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    out = next(o for o in lock["stages"]["size"]["outs"] if o["path"] == "data/metrics/capacity.json")
    out["md5"] = "0" * 32  # size re-run after the code's commit (its outputs name that commit)
    (repo / "dvc.lock").write_text(yaml.safe_dump(lock, sort_keys=False))
    _git(repo, "commit", "-qam", "dvc.lock at the code's commit")
    assert recorded_after_code(repo, "HEAD", repo) == []

    (repo / "llmcap" / "planning.py").write_text((repo / "llmcap" / "planning.py").read_text() + "# changed\n")
    _git(repo, "commit", "-qam", "sizing code changed after the plan")
    assert len(recorded_after_code(repo, "HEAD", repo)) == 1
    _git(repo, "commit", "-qm", "an unrelated commit", "--allow-empty")
    assert len(recorded_after_code(repo, "HEAD", repo)) == 1
