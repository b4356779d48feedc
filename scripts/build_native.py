"""Compile the core (`llmcap._native.NATIVE_MODULES`) with mypyc; `make setup` runs it.

The extensions land in `llmcap/_compiled/` (laid out like the package, away from the sources, so a
plain import never picks them up) and `llmcap/native.json` records the sha256 of every source they
were built from; `llmcap._native.load()` loads them only while that record matches.
Floating point: compiled without fused multiply-add (-ffp-contract=off), so every operation rounds as
the interpreter's does and compiled and source runs give identical bytes.

A failed build leaves no record (the sources run, slower) and exits non-zero with the compiler's words.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / ".work" / "native-build"


def _native_module():
    spec = importlib.util.spec_from_file_location("llmcap_sim_native_spec", ROOT / "llmcap" / "_native.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _in_place(native, name: str) -> list[Path]:  # noqa: ANN001 (the module loaded by path)
    """Extensions of module `name` beside its source, where `build_ext --inplace` writes them."""
    src = native.source_file(name)
    return [*src.parent.glob(src.stem + ".*.so"), *src.parent.glob(src.stem + "__mypyc.*.so")]


def main() -> int:
    native = _native_module()
    t0 = time.perf_counter()
    native.MANIFEST.unlink(missing_ok=True)
    shutil.rmtree(native.COMPILED, ignore_errors=True)
    for name in native.NATIVE_MODULES:  # and any left beside the sources by builds before llmcap/_compiled/
        for path in _in_place(native, name):
            path.unlink()
    digests = {name: native.source_digest(name) for name in native.NATIVE_MODULES}
    os.chdir(ROOT)  # mypyc names modules by their path from here
    os.environ["CFLAGS"] = (os.environ.get("CFLAGS", "") + " -ffp-contract=off").strip()
    sources = [str(native.source_file(name).relative_to(ROOT)) for name in native.NATIVE_MODULES]
    try:
        _build(sources)
    except (SystemExit, Exception) as exc:  # setuptools reports compiler failures as SystemExit
        # mypy's incremental cache has failed a rebuild here ("value is not in list") that a clean
        # cache then passed: once more from a clean cache before giving up
        print(f"[build_native] failed ({exc}); retrying from a clean cache", file=sys.stderr)
        shutil.rmtree(BUILD, ignore_errors=True)
        try:
            _build(sources)
        except (SystemExit, Exception) as exc2:
            print(f"[build_native] FAILED ({exc2}); llmcap.sim runs its Python sources", file=sys.stderr)
            return 1
    for (
        name
    ) in native.NATIVE_MODULES:  # built in place (mypyc names modules by path): move them out of the sources' way
        target = native.COMPILED.joinpath(*name.split(".")).parent
        target.mkdir(parents=True, exist_ok=True)
        for path in _in_place(native, name):
            path.replace(target / path.name)
    missing = [name for name in native.NATIVE_MODULES if len(native.extension_files(name)) != 2]
    if missing:
        print(f"[build_native] FAILED: no extension for {missing}", file=sys.stderr)
        return 1
    native.MANIFEST.write_text(json.dumps({"modules": digests}, indent=1, sort_keys=True) + "\n")
    print(f"[build_native] compiled {len(sources)} modules in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return 0


def _build(sources: list[str]) -> None:
    from mypyc.build import mypycify
    from setuptools import setup

    setup(
        name="llmcap-sim-native",
        packages=[],
        py_modules=[],
        script_args=[
            "--quiet",
            "build_ext",
            "--inplace",
            "--build-temp",
            str(BUILD / "temp"),
            "--build-lib",
            str(BUILD / "lib"),
        ],
        ext_modules=mypycify(
            ["--ignore-missing-imports", "--follow-imports=silent", "--cache-dir", str(BUILD / "mypy-cache"), *sources],
            opt_level="3",
            separate=True,
            target_dir=str(BUILD / "c"),
        ),
    )


if __name__ == "__main__":
    sys.exit(main())
