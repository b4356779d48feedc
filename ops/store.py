"""Decisions stored: the pipeline's cached outputs go to the project's default DVC remote.

The remote is DVC's own configuration. `.dvc/config` (committed) sets the default remote `local` to
`../.work/dvc-remote` (relative to `.dvc/`: the checkout's git-ignored `.work/dvc-remote`); point it
anywhere DVC can reach with `dvc remote modify local url s3://bucket/llmcap` (or `dvc remote add -d`),
or only for this machine with `--local` (written to the untracked `.dvc/config.local`).
"""

from __future__ import annotations

from pathlib import Path

from ops.common import OpsError


def default_remote(root: Path) -> dict[str, str] | None:
    """The default remote's name and URL (local paths made absolute), or None when none is configured."""
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        config = repo.config
        name = config["core"].get("remote")
        if not name:
            return None
        url = str(config["remote"][name]["url"])
    if "://" not in url and not Path(url).is_absolute():
        url = str((root / ".dvc" / url).resolve())
    return {"name": name, "url": url}


def push(root: Path) -> dict:
    """Push every cached output of the workspace's dvc.lock to the default remote."""
    from dvc.repo import Repo

    remote = default_remote(root)
    if remote is None:
        raise OpsError("no default DVC remote: `dvc remote add -d NAME URL` (see README, 'Decisions')")
    with Repo(str(root)) as repo:
        pushed = repo.push()
    return {**remote, "pushed": int(pushed or 0)}
