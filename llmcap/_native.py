"""The compiled core (mypyc): used only when it was built from exactly the sources on disk.

`make setup` compiles `NATIVE_MODULES` — the simulator's event loop, the roofline's scalar path and the LRU pass —
with mypyc (scripts/build_native.py) into extension modules beside their sources, and records each
source's sha256 in `native.json`. Python imports such an extension in preference to its .py, even
after the .py changed. So `select()` (run by `llmcap/__init__.py`, before any of them can be imported)
checks the record: when every compiled module matches its source, the extensions load; otherwise (a
source edited since the build, a partial build, or LLMCAP_SIM_PURE=1) a meta-path finder makes every
one of them load from its .py, with a warning unless the pure mode was asked for.

Both give the same results bit for bit (tests/sim/test_native.py); the compiled core is faster
(`make bench` prints both). This module imports nothing from llmcap: the build script loads it by path.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import warnings
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent  # llmcap/
NATIVE_MODULES = (
    "sim.recorder", "sim.segments", "sim.kvcache", "sim.pd", "perf.roofline_scalar", "sim.steptime", "sim.engine", "sim.routers",
    "sim.cluster", "trace.lru",
)  # fmt: skip
MANIFEST = PACKAGE / "native.json"
PURE_ENV = "LLMCAP_SIM_PURE"


def source_file(name: str) -> Path:
    return PACKAGE.joinpath(*name.split(".")).with_suffix(".py")


def source_digest(name: str) -> str:
    return hashlib.sha256(source_file(name).read_bytes()).hexdigest()


def extension_files(name: str) -> list[Path]:
    """Compiled files of module `name` (the module and its mypyc runtime library)."""
    src = source_file(name)
    out = []
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        out += [p for p in (src.with_name(src.stem + suffix), src.with_name(src.stem + "__mypyc" + suffix)) if p.exists()]
    return out


def stale_modules() -> list[str]:
    """Compiled modules whose recorded source differs from the one on disk (or has no record)."""
    try:
        recorded = json.loads(MANIFEST.read_text())["modules"]
    except (OSError, ValueError, KeyError):
        recorded = {}
    return [m for m in NATIVE_MODULES if extension_files(m) and recorded.get(m) != source_digest(m)]


class _FromSource(importlib.abc.MetaPathFinder):
    """Finds the core modules as their .py files, ahead of the extensions beside them."""

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001 (importlib's signature)
        name = fullname.removeprefix("llmcap.")
        if fullname.startswith("llmcap.") and name in NATIVE_MODULES:
            return importlib.util.spec_from_file_location(fullname, source_file(name))
        return None


def select() -> str:
    """Decide how the core loads: "native" (the extensions) or "source"."""
    compiled = [m for m in NATIVE_MODULES if extension_files(m)]
    if not compiled:
        return "source"
    pure = os.environ.get(PURE_ENV) == "1"
    stale = [] if pure else stale_modules()
    if not pure and not stale and len(compiled) == len(NATIVE_MODULES):
        return "native"
    if not pure:
        warnings.warn(
            f"llmcap: the compiled core is stale or partial ({', '.join(stale) or 'incomplete build'}); "
            "running the Python sources instead (slower). Rebuild it with `make setup`.",
            RuntimeWarning,
            stacklevel=2,
        )
    if not any(isinstance(f, _FromSource) for f in sys.meta_path):
        sys.meta_path.insert(0, _FromSource())
    return "source"
