"""The compiled core (mypyc): loaded explicitly by the packages that own it, and only when it was built
from exactly the sources on disk.

`make setup` compiles `NATIVE_MODULES` — the simulator's event loop, the roofline's scalar path and the
LRU pass — with mypyc (scripts/build_native.py) into extension modules under `llmcap/_compiled/`, away
from their sources, and records each source's sha256 in `native.json`. A plain import therefore always
finds the .py. Each owning package (`llmcap.perf`, `llmcap.trace`, `llmcap.sim`) calls `load(package)`
first thing in its `__init__`: when every compiled module matches its source, the extensions of that
package are put in `sys.modules` under their modules' names before anything can import them; otherwise
(a source edited since the build, a partial build, or LLMCAP_SIM_PURE=1) nothing is loaded and the
sources run, with a warning unless the pure mode was asked for. No import hook is installed.

Both give the same results bit for bit (tests/sim/test_native.py); the compiled core is faster
(`make bench` prints both). This module imports nothing from llmcap: the build script loads it by path.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.machinery
import importlib.util
import json
import os
import sys
import warnings
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent  # llmcap/
COMPILED = PACKAGE / "_compiled"  # the extensions, laid out like the package (scripts/build_native.py)
# in dependency order: a module comes after the compiled modules it imports
NATIVE_MODULES = (
    "sim.recorder",
    "sim.segments",
    "sim.kvcache",
    "sim.request",
    "sim.queues",
    "sim.admission",
    "sim.pd",
    "perf.roofline_scalar",
    "sim.steptime",
    "sim.state",
    "sim.steplog",
    "sim.decoding",
    "sim.engine",
    "sim.routers",
    "sim.loop",
    "sim.cluster",
    "trace.lru",
)
# compiled code calls into these packages' compiled modules: they are loaded first
NEEDS = {"sim": ("perf",)}
MANIFEST = PACKAGE / "native.json"
PURE_ENV = "LLMCAP_SIM_PURE"


def source_file(name: str) -> Path:
    return PACKAGE.joinpath(*name.split(".")).with_suffix(".py")


def source_digest(name: str) -> str:
    return hashlib.sha256(source_file(name).read_bytes()).hexdigest()


def _compiled_stem(name: str) -> Path:
    return COMPILED.joinpath(*name.split("."))


def extension_file(name: str, part: str = "") -> Path | None:
    """The compiled file of module `name` (part "__mypyc": its mypyc runtime library), if built."""
    stem = _compiled_stem(name)
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = stem.with_name(stem.name + part + suffix)
        if path.exists():
            return path
    return None


def extension_files(name: str) -> list[Path]:
    """Compiled files of module `name` (the module and its mypyc runtime library)."""
    return [p for p in (extension_file(name), extension_file(name, "__mypyc")) if p is not None]


def stale_modules() -> list[str]:
    """Compiled modules whose recorded source differs from the one on disk (or has no record)."""
    try:
        recorded = json.loads(MANIFEST.read_text())["modules"]
    except (OSError, ValueError, KeyError):
        recorded = {}
    return [m for m in NATIVE_MODULES if extension_files(m) and recorded.get(m) != source_digest(m)]


@functools.cache
def mode() -> str:
    """How the core loads in this process: "native" (every extension, built from these sources) or "source".
    Decided once: compiled modules call each other's compiled code, so it is all of them or none."""
    compiled = [m for m in NATIVE_MODULES if len(extension_files(m)) == 2]
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
            stacklevel=3,
        )
    return "source"


def _load_extension(fullname: str, path: Path) -> None:
    loader = importlib.machinery.ExtensionFileLoader(fullname, str(path))
    spec = importlib.util.spec_from_file_location(fullname, path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)  # runs the extension's init
    sys.modules[fullname] = module
    loader.exec_module(module)
    parent, _, child = fullname.rpartition(".")
    setattr(sys.modules[parent], child, module)  # as an import would: `llmcap.sim.engine` is an attribute of llmcap.sim


def load(package: str) -> str:
    """Put the compiled modules of `llmcap.<package>` in sys.modules when the core is native; the mode.

    Called by the package's `__init__` before it imports any of them, so every later import of one
    (from Python or from compiled code) gets the compiled module."""
    if mode() != "native":
        return "source"
    for needed in NEEDS.get(package, ()):
        importlib.import_module(f"llmcap.{needed}")
    for name in NATIVE_MODULES:
        fullname = f"llmcap.{name}"
        if not name.startswith(package + ".") or fullname in sys.modules:
            continue
        runtime, shim = extension_file(name, "__mypyc"), extension_file(name)
        assert runtime is not None and shim is not None  # mode() saw both
        _load_extension(fullname + "__mypyc", runtime)  # the shim imports its runtime library by this name
        _load_extension(fullname, shim)
    return "native"
