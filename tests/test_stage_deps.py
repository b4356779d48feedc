"""Every DVC stage's deps cover the code it runs: the import closure of its stage module inside this
repository (imports inside functions included, and the packages each import executes), plus the
environment that changes results (uv.lock; the native build of the simulator core). Otherwise an edit
leaves a stale result marked up to date, and a past decision cannot be reproduced from its commit."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("llmcap", "stages")
NATIVE_BUILD = "scripts/build_native.py"  # compiles llmcap/sim + perf/roofline_scalar: its flags change the binary


def module_file(name: str) -> Path | None:
    if name.split(".")[0] not in PACKAGES:
        return None
    base = ROOT.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imported_modules(path: Path, module: str) -> set[str]:
    """Module names `path` imports anywhere in its body (`from a import b` also names a.b: b may be a module)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def closure(module: str) -> set[Path]:
    """Repository files executed by importing `module` (its own, its imports', and every parent package)."""
    seen: set[str] = set()
    todo = [module]
    files: set[Path] = set()
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for i in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__, a/b/__init__ first
            prefix = ".".join(parts[:i])
            if prefix in seen:
                continue
            seen.add(prefix)
            path = module_file(prefix)
            if path is not None:
                files.add(path)
                todo.extend(imported_modules(path, prefix))
    return files


def stage_module(cmd: str) -> str:
    words = cmd.split()
    return words[words.index("-m") + 1]


STAGES = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]


def covered(path: Path, deps: list[str]) -> bool:
    rel = path.relative_to(ROOT).as_posix()
    return any(rel == dep or rel.startswith(dep.rstrip("/") + "/") for dep in deps)


@pytest.mark.parametrize("name", sorted(STAGES))
def test_deps_cover_the_code_the_stage_imports(name: str) -> None:
    stage = STAGES[name]
    deps = [d if isinstance(d, str) else next(iter(d)) for d in stage["deps"]]
    code = closure(stage_module(stage["cmd"]))
    missing = sorted(p.relative_to(ROOT).as_posix() for p in code if not covered(p, deps))
    assert not missing, f"dvc.yaml stage '{name}' runs code its deps do not list: {missing}"
    assert "uv.lock" in deps, f"stage '{name}': the locked environment (uv.lock) changes results; list it"
    if any(covered(p, ["llmcap/sim"]) for p in code):
        assert NATIVE_BUILD in deps, f"stage '{name}' runs the compiled simulator core; list {NATIVE_BUILD}"


def test_the_closure_follows_function_level_and_package_imports() -> None:
    # stages/size.py imports llmcap.sizing.plan inside run(): its closure must reach the simulator core
    # and the package __init__ files those imports execute
    files = {p.relative_to(ROOT).as_posix() for p in closure("stages.size")}
    assert {
        "stages/size.py",
        "llmcap/__init__.py",
        "llmcap/_native.py",
        "llmcap/sizing/plan.py",
        "llmcap/sim/engine.py",
    } <= files
