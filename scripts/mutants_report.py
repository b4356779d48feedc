"""`make mutants`, after `mutmut run`: the mutation score of the decision code ([tool.mutmut] in pyproject.toml)
and every mutant that was not killed, grouped by function, each with why it survives:

- "text only": the mutant changes nothing but the words of a message or a reason (a string literal's
  content, not a dict key or subscript: those are names other code reads); the decision it explains is the same;
- "no fast test": no test of the selection reaches the function (a test still to write, or code that only
  the slow or live tests drive);
- "survived": a fast test reaches the function and passes with the mutant in it (a test still to write,
  or an equivalent mutant: read its diff with `mutmut show NAME`).

Killed = failed a test or ran past its time limit (a loop that no longer ends). The score is killed over
all mutants, and also over the mutants that are not text only (the decision score). Writes the list to
`mutants/report.md` and prints the summary; exits 0 (a report, not a gate).
"""

from __future__ import annotations

import io
import json
import re
import sys
import tokenize
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KILLED = {"killed", "timeout"}


def _without_strings(line: str) -> str:
    """The line with the content of every string literal blanked (f-strings included, as one token or several)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return re.sub(r"(['\"]).*?\1", '""', line)
    tokens = [t for t in tokens if t.type not in (tokenize.NL, tokenize.NEWLINE)]
    return " ".join(
        _blank(t, tokens[i - 1].string if i else "", tokens[i + 1].string if i + 1 < len(tokens) else "")
        for i, t in enumerate(tokens)
    )


def _blank(token: tokenize.TokenInfo, before: str, after: str) -> str:
    """A string token as its f-string expressions only (they are code, not words); a dict key or a subscript
    (`"rows": ...`, `x["rows"]`: a name other code reads) and any other token as written."""
    if token.type == getattr(tokenize, "FSTRING_MIDDLE", None):
        return '""'
    if token.type != tokenize.STRING or after == ":" or before == "[":
        return token.string
    prefix = re.match(r"[A-Za-z]*", token.string).group(0).lower()
    return '""' + ("".join(re.findall(r"\{[^{}]*\}", token.string)) if "f" in prefix else "")


def text_only(diff: str) -> bool:
    """Whether a unified diff changes only string literals' content."""
    removed = [line[1:] for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]
    added = [line[1:] for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    return (
        bool(removed)
        and len(removed) == len(added)
        and all(_without_strings(a) == _without_strings(b) for a, b in zip(removed, added, strict=True))
    )


def main() -> int:
    from mutmut.mutation.diff_apply import get_diff_for_mutant
    from mutmut.stats import status_by_exit_code

    metas = sorted((ROOT / "mutants").rglob("*.py.meta"))
    if not metas:
        print("no mutmut results: run `make mutants`", file=sys.stderr)
        return 2
    counts: Counter[str] = Counter()
    by_function: dict[str, list[tuple[str, str]]] = defaultdict(list)  # function -> [(mutant, why)]
    per_file: dict[str, Counter[str]] = defaultdict(Counter)
    for meta in metas:
        source = meta.relative_to(ROOT / "mutants").with_suffix("")
        for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            status = status_by_exit_code[code]
            if status in KILLED:
                why = "killed"
            elif status == "no tests":
                why = "no fast test"
            elif status == "survived":
                why = "text only" if text_only(get_diff_for_mutant(name, path=source)) else "survived"
            else:
                why = status
            counts[why] += 1
            per_file[str(source)][why] += 1
            if why != "killed":
                by_function[name.rsplit("__mutmut_", 1)[0]].append((name, why))
    total = sum(counts.values())
    decided = total - counts["text only"]
    lines = [
        f"# Mutation score of the decision code: {counts['killed']}/{total} killed ({counts['killed'] / total:.1%}); "
        f"not counting text-only mutants {counts['killed']}/{decided} ({counts['killed'] / decided:.1%})",
        "",
        "| module | killed | survived | text only | no fast test | other |",
        "|---|---|---|---|---|---|",
    ]
    for path, c in sorted(per_file.items()):
        other = sum(v for k, v in c.items() if k not in ("killed", "survived", "text only", "no fast test"))
        lines.append(f"| {path} | {c['killed']} | {c['survived']} | {c['text only']} | {c['no fast test']} | {other} |")
    lines += ["", "## Not killed, by function (`mutmut show NAME` prints a mutant's diff)", ""]
    for function, mutants in sorted(by_function.items()):
        tally = Counter(why for _, why in mutants)
        lines.append(f"- `{function}`: " + ", ".join(f"{n} {why}" for why, n in tally.most_common()))
        lines += [f"  - `{name}`: {why}" for name, why in mutants if why == "survived"]
    report = ROOT / "mutants" / "report.md"
    report.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines[: 4 + len(per_file)]))
    print(f"\nthe list, by function: {report.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
