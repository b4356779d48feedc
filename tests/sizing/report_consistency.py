"""One story: every figure and verdict a capacity report states, checked against the summary.json of the same run.

`contradictions(md, summary)` reads the Markdown report (capacity.md) section by section and returns each
statement that disagrees with the summary — a GPU count, a $/h, the chosen configuration, the verdict — or
with another section (a pass beside a NO PLAN PASSES), and each GPU count or $/h that differs from the
answer without saying what it counts (base, floor, analytic, another shape...). `html_contradictions`
checks that the HTML page tells the Markdown's story (the same answer, table and warnings). Empty: one story.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Mapping
from typing import Any

Summary = Mapping[str, Any]
Row = dict[str, str]

# Words that say what a GPU count or $/h other than the answer's counts: a line with one of them is labelled.
QUALIFIERS = (
    "base",
    "floor",
    "ledger",
    "analytic",
    "not chosen",
    "fewer",
    "faster",
    "slower",
    "seed",
    "routing",
    "limit",
    "busy",
)
_GPUS = re.compile(r"(?<![\d.,])(\d[\d,]*) GPUs\b")
_USD = re.compile(r"\$(\d[\d,]*(?:\.\d+)?)/h")
_UNCHECKED = (
    "Capacity table",
    "Pruned and not simulated",
    "Headroom per pool",
)  # per-candidate / per-pool tables: checked by row


def sections(md: str) -> dict[str, str]:
    """Section title -> its Markdown body (the title line's `# ` section is "")."""
    out: dict[str, str] = {}
    title = ""
    for line in md.splitlines():
        if line.startswith("## "):
            title = line[3:].strip()
            out[title] = ""
        elif title:
            out[title] += line + "\n"
    return out


def tables(body: str) -> list[list[Row]]:
    """The Markdown tables of a section body, each as rows keyed by the header's cells."""
    found: list[list[Row]] = []
    block: list[list[str]] = []
    for line in [*body.splitlines(), ""]:
        if line.startswith("| "):
            block.append([c.replace("\\|", "|") for c in re.split(r"(?<!\\) \| ", line[2:-2])])
        elif block:
            head, rows = block[0], block[2:]  # block[1] is the --- separator
            found.append([dict(zip(head, r, strict=True)) for r in rows])
            block = []
    return found


def _num(text: str) -> float:
    return float(text.replace(",", "").lstrip("+$"))


def _same_usd(stated: str, actual: float) -> bool:
    """Equal at the precision the report states (88.00 vs 88.0; $88 vs 87.6)."""
    decimals = len(stated.split(".")[1]) if "." in stated else 0
    return abs(_num(stated) - actual) <= 0.5 * 10**-decimals + 1e-9


def _same_sig(stated: str, actual: float) -> bool:
    """Equal at the ~4 significant digits the report's tables use."""
    return abs(_num(stated) - actual) <= 5e-4 * max(abs(actual), 1e-9) + 0.5 * (abs(actual) >= 1e4)


def _answer(sec: Mapping[str, str], s: Summary) -> list[str]:
    body = sec.get("The answer", "")
    m = re.search(r"^\*\*(.+)\*\*$", body, re.M)
    if m is None:
        return ["the answer states no headline"]
    head, out = m.group(1), []
    if s["verdict"] == "fails":
        h = re.search(r"NO PLAN PASSES: .* The closest, (\d[\d,]*) GPUs \(\$([\d,.]+)/h\)", head)
        if h is None:
            return [f"verdict fails but the headline says: {head}"]
        gpus, usd = h.groups()
    else:
        h = re.match(
            r"(\d[\d,]*) GPUs, \$([\d,.]+)/h .* within the SLOs: (\d[\d,]*) GPUs base \+ (\d[\d,]*) GPUs headroom\.$",
            head,
        )
        if h is None:
            return [f"verdict {s['verdict']} but the headline says: {head}"]
        gpus, usd, base, extra = h.groups()
        out += (
            [f"headline base {base} GPUs, summary base_gpus {s['base_gpus']}"] if _num(base) != s["base_gpus"] else []
        )
        out += (
            [f"headline headroom {extra} GPUs, summary {s['gpus'] - s['base_gpus']}"]
            if _num(extra) != s["gpus"] - s["base_gpus"]
            else []
        )
    out += [f"headline {gpus} GPUs, summary gpus {s['gpus']}"] if _num(gpus) != s["gpus"] else []
    out += (
        [f"headline ${usd}/h, summary usd_per_hour {s['usd_per_hour']}"]
        if not _same_usd(usd, s["usd_per_hour"])
        else []
    )
    return out + _answer_table(body, s)


def _answer_table(body: str, s: Summary) -> list[str]:
    found = tables(body)
    if not found:
        return ["the answer has no table"]
    out = []
    rows = {r["pool"]: r for r in found[0]}
    if set(rows) != {*s["pool_plans"], "total"}:
        out.append(f"answer table pools {sorted(rows)}, summary pools {sorted(s['pool_plans'])}")
    expected = {"total": ("", s["instances"], s["base_instances"], s["gpus"], s["usd_per_hour"])}
    expected |= {
        n: (q["configuration"], q["instances"], q["base_instances"], q["gpus"], q["usd_per_hour"])
        for n, q in s["pool_plans"].items()
    }
    for name, (config, inst, base, gpus, usd) in expected.items():
        r = rows.get(name)
        if r is None:
            continue
        if name != "total" and r["configuration"] != config:
            out.append(f"answer table {name} configuration {r['configuration']}, summary {config}")
        stated = (
            _num(r["instances (total)"]),
            _num(r["base instances"]),
            _num(r["headroom instances"]),
            _num(r["GPUs (total)"]),
        )
        if stated != (inst, base, inst - base, gpus) or not _same_usd(r["$/h (total)"], usd):
            out.append(f"answer table {name}: {r}, summary instances {inst}, base {base}, GPUs {gpus}, $/h {usd}")
    return out


def _passed(s: Summary) -> list[str]:
    """Each simulated scenario's verdict as the summary states it ("... → pass" or "... → FAIL ...")."""
    return ["pass" if "→ pass" in line else "FAIL" for line in s["scenarios"] or []]


def _scenario_state(s: Summary) -> int:
    """0: not simulated; 1: a scenario fails; 2: every one passes; 3: every one passes, only over the cost limit."""
    if s["scenarios"] is None:
        return 0
    if "FAIL" in _passed(s):
        return 1
    return 2 if s["scenarios_pass"] else 3


def _how_sure(sec: Mapping[str, str], s: Summary) -> list[str]:
    body, out = sec.get("The answer", ""), []
    said = (
        "Scenarios were not simulated",
        "NOT every scenario passes",
        "every scenario passes (",
        "every scenario passes, but only over the cost limit",
    )
    stated = [k for k in said if re.search(rf"(?<!NOT ){re.escape(k)}", body)]
    if stated != [said[_scenario_state(s)]]:
        out.append(
            f"the answer says {stated}, summary scenarios_pass {s['scenarios_pass']} with scenarios {s['scenarios']}"
        )
    floor = re.search(r"Analytic floor \([^)]*\) (\d+) GPUs", body)
    if floor is None or _num(floor.group(1)) != s["ledger"]["gpus"]:
        out.append(f"the answer's analytic floor {floor and floor.group(1)}, summary ledger gpus {s['ledger']['gpus']}")
    cr = s["count_range"]
    rng = re.search(r"Count range: (\d+) GPUs \((\d+)–(\d+|no passing count) over", body)
    if cr is not None:
        expected = (str(s["gpus"]), str(cr["low"]), "no passing count" if cr["high"] is None else str(cr["high"]))
        if rng is None or rng.groups() != expected or cr["point_gpus"] != s["gpus"]:
            out.append(
                f"count range {rng and rng.groups()}, summary point {cr['point_gpus']} of {s['gpus']} GPUs, range {cr['low']}–{cr['high']}"
            )
    return out


def _ledger(sec: Mapping[str, str], s: Summary) -> list[str]:
    found = tables(sec.get("Ledger beside the simulation", ""))
    if not found:
        return ["no ledger table"]
    out = []
    for r in found[0]:
        planned = s["gpus"] if r["pool"] == "total" else s["pool_plans"][r["pool"]]["gpus"]
        if _num(r["simulated plan"]) != planned:
            out.append(f"ledger {r['pool']} simulated plan {r['simulated plan']}, summary {planned}")
        if r["pool"] == "total" and _num(r["floor (whole instances)"]) != s["ledger"]["gpus"]:
            out.append(f"ledger floor {r['floor (whole instances)']}, summary ledger gpus {s['ledger']['gpus']}")
    return out


def _scenarios(sec: Mapping[str, str], s: Summary) -> list[str]:
    body = sec.get("Scenarios and minimality", "")
    if s["scenarios"] is None:
        return [] if "Scenarios were not simulated." in body else ["scenarios shown that the summary does not hold"]
    out = []
    verdicts = [r["verdict"] for r in (tables(body) or [[]])[0]]
    if verdicts != _passed(s):
        out.append(f"scenario verdicts {verdicts}, summary {_passed(s)}")
    count = re.search(r"analytic count (\d+) GPUs → simulated (\d+) GPUs", body)
    if count is None or (int(count.group(1)), int(count.group(2))) != (s["analytic_gpus"], s["gpus"]):
        out.append(
            f"scenarios say analytic → simulated {count and count.groups()}, summary {s['analytic_gpus']} → {s['gpus']}"
        )
    for f in s["finalists"] or []:
        role = re.search(rf"settled on the whole trace, ([^:]+): {re.escape(f['line'])}", body)
        chosen = f["candidate"] == s["chosen"]
        if role is None or (role.group(1) == "not chosen") == chosen:
            out.append(f"finalist {f['candidate']} shown as {role and role.group(1)!r}, chosen = {chosen}")
    return out


def _headroom(sec: Mapping[str, str], s: Summary) -> list[str]:
    found, out = tables(sec.get("Headroom per pool", "")), []
    rows = found[0] if found else []
    for name, q in s["pool_plans"].items():
        base = [r for r in rows if r["pool"] == name and r["risk"] == "base"]
        total = [r for r in rows if r["pool"] == name and r["risk"] == "total"]
        if [_num(r["instances"]) for r in base] != [q["base_instances"]] or [_num(r["instances"]) for r in total] != [
            q["instances"]
        ]:
            out.append(
                f"headroom {name}: base {[r['instances'] for r in base]} total {[r['instances'] for r in total]}, summary {q['base_instances']} / {q['instances']}"
            )
        elif f"{q['gpus']} GPUs, ${q['usd_per_hour']:,.2f}/h" not in total[0]["reasoning"]:
            out.append(
                f"headroom {name} total says {total[0]['reasoning']!r}, summary {q['gpus']} GPUs ${q['usd_per_hour']:,.2f}/h"
            )
    return out


def _capacity_table(sec: Mapping[str, str], s: Summary) -> list[str]:
    found = tables(sec.get("Capacity table", ""))
    if not found or not found[0]:
        return ["no capacity table"]
    first = found[0][0]
    if first["candidate (mode)"] != f"{s['chosen']} ({s['mode']})":
        return [f"capacity table leads with {first['candidate (mode)']}, summary chose {s['chosen']} ({s['mode']})"]
    if _num(first["GPUs"]) != s["gpus"] or not _same_sig(first["$/h"], s["usd_per_hour"]):
        return [
            f"capacity table's chosen row {first['GPUs']} GPUs ${first['$/h']}/h, summary {s['gpus']} GPUs ${s['usd_per_hour']}/h"
        ]
    return []


def _pools(sec: Mapping[str, str], s: Summary) -> list[str]:
    pools = s.get("pools")
    line = next((ln for ln in sec.get("Notes", "").splitlines() if ln.startswith("- request-class pools")), None)
    if pools is None or "saving_usd_per_hour" not in pools:
        return [] if pools is None or line is not None else ["the request-class comparison is not in the notes"]
    m = line and re.fullmatch(
        r"- request-class pools: compared on base counts \(before headroom\), (shared|split) pools are cheaper: \$([\d,.]+)/h base less than "
        r"\w+ \(shared: (\d+) base GPUs, \$([\d,.]+)/h base; split: (\d+) base GPUs, \$([\d,.]+)/h base\)",
        line,
    )
    if not m:
        return [f"request-class pools not stated as base counts: {line}"]
    cheaper, saving, n_shared, usd_shared, n_split, usd_split = m.groups()
    stated = (cheaper, int(n_shared), int(n_split))
    expected = (pools["cheaper"], sum(p["gpus"] for p in pools["shared"]), sum(p["gpus"] for p in pools["split"]))
    usd_ok = all(
        _same_usd(a, b)
        for a, b in (
            (saving, pools["saving_usd_per_hour"]),
            (usd_shared, sum(p["usd_per_hour"] for p in pools["shared"])),
            (usd_split, sum(p["usd_per_hour"] for p in pools["split"])),
        )
    )
    out = [] if stated == expected and usd_ok else [f"request-class pools {m.groups()}, summary {pools}"]
    return out + (
        [f"shared pool's base {n_shared} GPUs, the answer's base {s['base_gpus']} GPUs"]
        if int(n_shared) != s["base_gpus"]
        else []
    )


def _header(sec: Mapping[str, str], s: Summary) -> list[str]:
    body, out = sec.get("What was planned", ""), []
    step = next((ln for ln in body.splitlines() if ln.startswith("- **Step times:**")), None)
    prices = next((ln for ln in body.splitlines() if ln.startswith("- **Prices:**")), None)
    if step is None or prices is None:
        return [
            f"the header lacks the step-time or price line (step: {step is not None}, prices: {prices is not None})"
        ]
    gpus = {q["configuration"].split("/")[0] for q in s["pool_plans"].values()}
    measured = s["step_model_source"].startswith("profile") and "ROOFLINE" not in step
    if not measured and not step.startswith("- **Step times:** ⚠ ROOFLINE, NOT MEASURED"):
        out.append(f"roofline step times without the loud warning: {step}")
    calibrated = {g: c for g, c in s["roofline_calibrations"].items() if g in gpus}
    out += [
        f"calibration of {g} ({c['file']}) not named: {step}"
        for g, c in calibrated.items()
        if f"{g} ({c['file']}" not in step
    ]
    if "uncalibrated" in step and calibrated.keys() == gpus:
        out.append(f"step times called uncalibrated though every plan GPU's calibration was applied: {step}")
    if "(assumption)" in prices and "⚠ ASSUMED list prices" not in prices:
        out.append(f"assumed prices without the loud warning: {prices}")
    target = re.search(r"- \*\*Target:\*\* ([\d.,]+) req/s", body)
    if target is None or not _same_sig(target.group(1), s["target_rps"]):
        out.append(f"target {target and target.group(1)}, summary target_rps {s['target_rps']}")
    return out + [f"SLO definition {k!r} not stated" for k, v in s["slo_definitions"].items() if v not in body]


def _verdicts(md: str, s: Summary) -> list[str]:
    """No section states a verdict another contradicts."""
    passing = {
        "within the SLOs",
        "(the answer)",
        "the answer:",
    }  # a failing plan's scenarios may all pass: over the cost limit
    failing = {"NO PLAN PASSES", "NOT every scenario passes", "closest miss"}
    said_pass = [p for p in passing if p in md]
    said_fail = [p for p in failing if p in md] + (["a FAIL scenario row"] if re.search(r"\| FAIL \|", md) else [])
    if s["verdict"] == "fails":
        return [f"verdict fails, yet the report says {p!r}" for p in said_pass] + (
            [] if "NO PLAN PASSES" in md else ["verdict fails, no NO PLAN PASSES"]
        )
    return [f"verdict {s['verdict']}, yet the report says {p!r}" for p in said_fail]


def _unlabelled(sec: Mapping[str, str], s: Summary) -> list[str]:
    """Every GPU count or $/h in prose that is not the answer's must say what it counts."""
    out = []
    for title, body in sec.items():
        if title in _UNCHECKED:
            continue
        for line in body.splitlines():
            if line.startswith("| ") or any(q in line for q in QUALIFIERS):
                continue
            out += [
                f"unlabelled {m.group(0)} (the answer is {s['gpus']} GPUs) in {title}: {line[:160]}"
                for m in _GPUS.finditer(line)
                if _num(m.group(1)) != s["gpus"]
            ]
            out += [
                f"unlabelled {m.group(0)} (the answer is ${s['usd_per_hour']:,.2f}/h) in {title}: {line[:160]}"
                for m in _USD.finditer(line)
                if not _same_usd(m.group(1), s["usd_per_hour"])
            ]
    return out


CHECKS: tuple[Callable[[Mapping[str, str], Summary], list[str]], ...] = (
    _header,
    _answer,
    _how_sure,
    _ledger,
    _scenarios,
    _headroom,
    _capacity_table,
    _pools,
    _unlabelled,
)


def _run(
    check: Callable[[Mapping[str, str], Summary], list[str]], sec: Mapping[str, str], summary: Summary
) -> list[str]:
    try:
        return check(sec, summary)
    except (KeyError, ValueError, IndexError, StopIteration) as exc:  # a statement not where or as the report states it
        return [f"{check.__name__.strip('_')}: the report does not state it readably ({type(exc).__name__}: {exc})"]


def contradictions(md: str, summary: Summary) -> list[str]:
    """Each statement of the Markdown report that disagrees with `summary` or with another section."""
    sec = sections(md)
    return [found for check in CHECKS for found in _run(check, sec, summary)] + _verdicts(md, summary)


def _cells(fragment: str) -> list[list[str]]:
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", fragment, re.S)
    return [[html.unescape(c.replace("<wbr>", "")) for c in re.findall(r"<t[dh]>(.*?)</t[dh]>", r, re.S)] for r in rows]


def html_contradictions(page: str, md: str) -> list[str]:
    """Where the HTML page tells another story than the Markdown: the answer's headline and table, the warnings."""
    out = []
    head = re.search(r'<p class="answer( loud)?">(.*?)</p>', page, re.S)
    md_head = re.search(r"^\*\*(.+)\*\*$", sections(md).get("The answer", ""), re.M)
    if head is None or md_head is None or html.unescape(head.group(2)) != md_head.group(1):
        out.append(
            f"HTML headline {head and html.unescape(head.group(2))!r}, Markdown {md_head and md_head.group(1)!r}"
        )
    elif bool(head.group(1)) != md_head.group(1).startswith("NO PLAN PASSES"):
        out.append("the HTML headline's loudness disagrees with its verdict")
    answer = page[page.index('<section id="answer">') :]
    md_rows = [[*r.values()] for r in tables(sections(md).get("The answer", ""))[0]]
    if _cells(answer[: answer.index("</table>")])[1:] != md_rows:
        out.append("the HTML answer table differs from the Markdown's")
    if page.count("<dd class=loud>") != sections(md).get("What was planned", "").count("⚠"):
        out.append("the HTML header's loud warnings differ from the Markdown's")
    return out
