"""Hatch build hook: the wheel carries the compiled simulator core when asked (LLMCAP_WHEEL_COMPILED=1,
`make dist`) and it was built from exactly the sources being packaged; the wheel is then a CPython- and
platform-specific one. Without the variable the wheel is pure Python: the fallback for any platform, which
runs the same sources (same results, slower)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

ROOT = Path(__file__).resolve().parent


def _native():  # noqa: ANN202 (llmcap/_native.py loaded by path: the build must not import the package)
    spec = importlib.util.spec_from_file_location("llmcap_native_build", ROOT / "llmcap" / "_native.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class CompiledCore(BuildHookInterface):
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel" or os.environ.get("LLMCAP_WHEEL_COMPILED") != "1":
            return
        native = _native()
        missing = [m for m in native.NATIVE_MODULES if not native.extension_files(m)]
        stale = native.stale_modules()
        if missing or stale or not native.MANIFEST.is_file():
            raise RuntimeError(
                f"LLMCAP_WHEEL_COMPILED=1 but the compiled core is not built from these sources "
                f"(missing {missing}, stale {stale}): run `make setup` first"
            )
        files = [p for m in native.NATIVE_MODULES for p in native.extension_files(m)] + [native.MANIFEST]
        build_data["artifacts"].extend(str(p.relative_to(ROOT)) for p in files)
        build_data["pure_python"] = False
        build_data["infer_tag"] = True  # cp311-cp311-<platform>: the extensions are for this interpreter only
