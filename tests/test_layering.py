"""Layering: the domain library never imports the orchestration/tracking stack (docs/architecture.md)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

FORBIDDEN = {"prefect", "dvc", "mlflow", "great_expectations"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_llmcap_sources_do_not_import_the_stack() -> None:
    offenders = {str(p.relative_to(ROOT)): sorted(_imports(p) & FORBIDDEN) for p in (ROOT / "llmcap").rglob("*.py")}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_importing_every_command_loads_none_of_the_stack() -> None:
    code = (
        "import sys, llmcap.cli, llmcap.trace.plots; [llmcap.cli.load_command(n) for n in llmcap.cli.COMMANDS]; "
        f"print(sorted(m for m in {{{','.join(repr(m) for m in FORBIDDEN)}}} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_stages_are_thin() -> None:
    # a stage is glue: params + paths in, one llmcap call, outputs + validation + logging out
    for stage in (ROOT / "stages").glob("*.py"):
        assert len(stage.read_text().splitlines()) < 200, stage


BOTTOM = ("catalog", "trace", "perf")  # the domain's bottom layers
ABOVE = (
    "sim",
    "sizing",
    "report",
    "live",
    "twin",
    "gateway",
    "rollout",
    "reconcile",
    "replaycheck",
    "commands",
    "config.py",
    "candidates.py",
    "cli.py",
    "planning.py",
)


def test_the_bottom_layers_import_nothing_above_them() -> None:
    from tests.test_stage_deps import closure

    package = ROOT / "llmcap"
    for layer in BOTTOM:
        for path in sorted((package / layer).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            above = sorted(
                str(f.relative_to(package)) for f in closure(module) if f.relative_to(package).parts[0] in ABOVE
            )
            assert not above, f"{module} imports, directly or not, {above}"


def test_sizing_decides_and_the_report_shows() -> None:
    # the report reads sizing's outcome; sizing never reaches for the report (llmcap.planning joins them)
    from tests.test_stage_deps import closure

    package = ROOT / "llmcap"
    for path in sorted((package / "sizing").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        shown = sorted(
            str(f.relative_to(package))
            for f in closure(module)
            if f.relative_to(package).parts[0] in ("report", "planning.py")
        )
        assert not shown, f"{module} imports, directly or not, {shown}"


MODULE_LINES = 500  # one concept a module (docs/architecture.md)
FUNCTION_LINES = 80  # a body longer than this needs a `# long: <why>` line right above the def (or its decorators)


def test_library_modules_stay_small() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in (ROOT / "llmcap").rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MODULE_LINES
    }
    assert long == {}, f"split these by concern: {long}"


def _long_without_reason(path: Path) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    found = []
    for node in ast.walk(ast.parse("\n".join(lines))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = node.end_lineno - node.body[0].lineno + 1  # the body: a CLI command's signature is its options
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            if length > FUNCTION_LINES and not lines[first - 2].strip().startswith("# long: "):
                found.append(f"{node.name} ({length} lines)")
    return found


def test_library_functions_stay_short_or_say_why() -> None:
    long = {
        str(p.relative_to(ROOT)): f for p in sorted((ROOT / "llmcap").rglob("*.py")) if (f := _long_without_reason(p))
    }
    assert long == {}, f"split these, or say why not on a `# long:` line above the def: {long}"


def test_nothing_below_the_command_line_imports_it() -> None:
    """llmcap.commands is the CLI layer (option declarations and printing): the library, the stages, the flows and ops
    build on the library (`llmcap.deployment`, `llmcap.trace.ingest`, `llmcap.live.served`), never on a command."""
    offenders = {}
    for folder in ("llmcap", "stages", "flows", "ops"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if rel.parts[:2] == ("llmcap", "commands") or rel == Path("llmcap/cli.py"):
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            found = sorted(
                {
                    n.module
                    for n in ast.walk(tree)
                    if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("llmcap.commands")
                }
                | {
                    a.name
                    for n in ast.walk(tree)
                    if isinstance(n, ast.Import)
                    for a in n.names
                    if a.name.startswith("llmcap.commands")
                }
            )
            if found:
                offenders[str(rel)] = found
    assert offenders == {}


def _runtime_imports(path: Path, modules: set[str]) -> set[str]:
    """The llmcap modules `path` imports when it runs (at the top or inside a function; not under TYPE_CHECKING).
    `from package import submodule` depends on the submodule: the package's own code is not what it reads."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for stmt in node.body
        for n in ast.walk(stmt)
    }
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("llmcap"):
            subs = {f"{node.module}.{a.name}" for a in node.names} & modules
            found |= subs if len(subs) == len(node.names) else {node.module}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("llmcap")}
    return found & modules


def test_no_import_circles() -> None:
    package = ROOT / "llmcap"
    paths = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p for p in package.rglob("*.py")
    }
    graph = {name: _runtime_imports(p, set(paths)) - {name} for name, p in paths.items()}
    circles = []
    for start in sorted(graph):  # a circle is a path back to where it started
        stack, seen = [(start, (start,))], set()
        while stack:
            node, trail = stack.pop()
            for nxt in sorted(graph[node]):
                if nxt == start:
                    circles.append(" -> ".join((*trail, start)))
                elif nxt not in seen and nxt > start:  # each circle once, from its smallest module
                    seen.add(nxt)
                    stack.append((nxt, (*trail, nxt)))
    assert circles == [], circles
