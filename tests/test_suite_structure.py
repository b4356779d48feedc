"""The test suite's own structure, as `make test` runs it: its two passes (the Makefile's `-m` expressions)
take every test exactly once, and every test on the real engine runs in the first (alone on the machine).
The table of which markers run in which pass is printed."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter

from _pytest.mark.expression import Expression

from tests._collected import PREFIX
from tests.conftest import ROOT


def _passes() -> dict[str, Expression]:
    recipe = (ROOT / "Makefile").read_text().split("\ntest: ", 1)[1].split("\nelse", 1)[0]
    exprs = re.findall(r'pytest -m "([^"]+)"', recipe)
    assert len(exprs) == 2, recipe
    return {"timed (alone)": Expression.compile(exprs[0]), "the rest (-n 2)": Expression.compile(exprs[1])}


def test_the_two_passes_take_every_test_once_and_each_where_it_belongs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "tests._collected", "-p", "no:randomly"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [line.removeprefix(PREFIX).split("\t") for line in out.stdout.splitlines() if line.startswith(PREFIX)]
    passes = _passes()
    table: Counter[tuple[str, str]] = Counter()
    wrong = []
    for nodeid, marks, engine in rows:
        names = set(filter(None, marks.split(",")))
        taken = [p for p, e in passes.items() if e.evaluate(lambda name, names=names, **_: name in names)]
        if len(taken) != 1:
            wrong.append(f"{nodeid}: in {len(taken)} passes")
            continue
        table[(taken[0], ",".join(sorted(names & {"live", "timing", "slow"})) or "(none)")] += 1
        if engine == "1" and taken[0] != "timed (alone)":
            wrong.append(f"{nodeid}: runs on the real engine but not in the timed pass (mark it live)")
    listing = "\n".join(f"{p:<16} {m:<14} {n:>5}" for (p, m), n in sorted(table.items()))
    print(f"\npass             markers        tests\n{listing}")
    assert len(rows) > 1000 and not wrong, "\n".join(wrong) + "\n" + listing
    assert {p for p, _ in table} == set(passes)  # both passes run something
