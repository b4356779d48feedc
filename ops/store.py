"""Decisions stored: the pipeline's cached outputs go to the project's DVC remote.

    python -m ops.store [--project DIR] [--configure-dvc]

Which remote: params.yaml `stores.dvc_remote` (committed: every clone uses it), overridden by the
environment variable LLMCAP_DVC_REMOTE (stages.env.stores), as the remote `team`; when both are empty,
`.dvc/config`'s default remote (committed: `local` = `../.work/dvc-remote`, relative to `.dvc/`, the
checkout's git-ignored `.work/dvc-remote`). `llmcap plan` pushes there and `llmcap reproduce --pull`
pulls from there; `--configure-dvc` writes the remote into the untracked `.dvc/config.local`, so that
plain `dvc pull` / `dvc push` in this clone use it too. Credentials stay in DVC's own `config.local`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from ops.common import OpsError, run_main


def default_remote(root: Path) -> dict[str, str] | None:
    """The remote the project stores decisions in: name, URL (local paths made absolute) and where it came from;
    None when neither the stores setting nor `.dvc/config` names one."""
    from dvc.repo import Repo

    from stages.env import STORES_REMOTE, stores

    setting = stores(root)
    if setting["dvc_remote"]:
        return {"name": STORES_REMOTE, "url": setting["dvc_remote"], "from": setting["dvc_remote_from"]}
    with Repo(str(root)) as repo:
        config = repo.config
        name = config["core"].get("remote")
        if not name:
            return None
        url = str(config["remote"][name]["url"])
    if "://" not in url and not Path(url).is_absolute():
        url = str((root / ".dvc" / url).resolve())
    return {"name": name, "url": url, "from": ".dvc/config"}


def dvc_config(remote: dict[str, str]) -> dict:
    """DVC config that makes `remote` the default (merged over the repository's own: options such as credentials
    that `.dvc/config.local` gives a remote of the same name are kept)."""
    return {"core": {"remote": remote["name"]}, "remote": {remote["name"]: {"url": remote["url"]}}}


def push(root: Path) -> dict:
    """Push every cached output of the workspace's dvc.lock to the project's remote."""
    from dvc.repo import Repo

    remote = default_remote(root)
    if remote is None:
        raise OpsError(
            "no DVC remote: set params.yaml stores.dvc_remote or `dvc remote add -d NAME URL` (README, 'Decisions')"
        )
    with Repo(str(root), config=dvc_config(remote)) as repo:
        pushed = repo.push(remote=remote["name"])
    return {"name": remote["name"], "url": remote["url"], "pushed": int(pushed or 0)}


def configure_dvc(root: Path, remote: dict[str, str]) -> None:
    """Make `remote` the default of plain `dvc` commands in the checkout at `root` (its untracked `.dvc/config.local`)."""
    cmd = [
        sys.executable,
        "-m",
        "dvc",
        "remote",
        "add",
        "--local",
        "--force",
        "--default",
        remote["name"],
        remote["url"],
    ]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    if proc.returncode != 0:
        raise OpsError(f"dvc remote add --local failed: {proc.stderr.strip()[-300:]}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ops.store", description=__doc__.splitlines()[0])
    ap.add_argument("--project", type=Path, default=Path("."))
    ap.add_argument(
        "--configure-dvc", action="store_true", help="write the remote into .dvc/config.local for plain `dvc` commands"
    )
    args = ap.parse_args(argv)
    from llmcap.credentials import redact_text
    from stages.env import apply_defaults, stores

    root = args.project.resolve()
    setting = stores(root)  # before apply_defaults fills MLFLOW_TRACKING_URI in: where each value came from
    apply_defaults(root)
    remote = default_remote(root)
    if remote is not None and args.configure_dvc:
        configure_dvc(root, remote)
    print(
        json.dumps(
            {
                "dvc_remote": remote,
                "mlflow_tracking_uri": redact_text(setting["mlflow_tracking_uri"]),
                "mlflow_tracking_uri_from": setting["mlflow_tracking_uri_from"],
            },
            indent=1,
        )
    )
    return 0 if remote is not None else 1


if __name__ == "__main__":
    run_main(main)
