"""The reconciliation and diagnosis as one JSON-able dict and as Markdown (the stage's report, the CLI's screen)."""

from __future__ import annotations

from llmcap.jsonsafe import nan_to_null
from llmcap.reconcile.decide import Reconciliation
from llmcap.reconcile.diagnose import Diagnosis


def summary(rec: Reconciliation, diagnosis: Diagnosis | None) -> dict:
    return nan_to_null(
        {"reconciliation": rec.to_dict(), "diagnosis": None if diagnosis is None else diagnosis.to_dict()}
    )


def _e(d, metric: str, q: float) -> str:
    est = d.bias.errors.get(metric, {}).get(q)
    return "–" if est is None else f"{est.e:+.1%} [{est.low:+.1%}, {est.high:+.1%}]"


def bucket_rows(rec: Reconciliation, percentiles: tuple[float, ...]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the per-bucket table: e_TTFT and e_ITL per percentile with intervals, decision."""
    head = ["bucket", "n"] + [f"e_{m} p{q:g}" for m in ("TTFT", "ITL") for q in percentiles] + ["decision"]
    rows = [
        [d.bias.label, str(d.bias.requests)]
        + [_e(d, m, q) for m in ("ttft", "itl") for q in percentiles]
        + [d.decision]
        for d in rec.decisions
    ]
    return head, rows


def accounting_line(rec: Reconciliation) -> str:
    a = rec.accounting
    not_ok = ", ".join(f"{k} {v}" for k, v in sorted(a.not_ok.items())) or "none"
    return (
        f"{a.measured} measured, {a.predicted} predicted: {a.paired_ok} paired and served on both sides; "
        f"only measured {a.only_measured}, only predicted {a.only_predicted}; not served: {not_ok}"
    )


def markdown(rec: Reconciliation, diagnosis: Diagnosis | None, percentiles: tuple[float, ...]) -> str:
    head, rows = bucket_rows(rec, percentiles)
    intro = f"e = predicted / measured - 1 ({rec.percentile:g}th percentile decides; tolerance {rec.tolerance:.0%}; intervals: bootstrap)."
    out = [
        "# Reconciliation",
        "",
        intro,
        "",
        accounting_line(rec),
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    out += ["", "## Decisions", ""] + [f"- **{d.bias.label}**: {d.decision} — {d.reasoning}" for d in rec.decisions]
    out += ["", "## Corrections", ""] + (
        [
            f"- step time × {c.factor:.4g}"
            + (f" for prefills past {c.min_context} tokens" if c.min_context else "")
            + f": {c.reasoning}"
            for c in rec.corrections
        ]
        or ["- none"]
    )
    if diagnosis is not None:
        out += ["", f"## Diagnosis (metric schema {diagnosis.schema})", ""]
        if diagnosis.missing:
            out.append(f"Not in the series (their readings were not checked): {', '.join(diagnosis.missing)}.\n")
        out += [f"- {f}" for f in diagnosis.findings] or ["- no finding"]
    return "\n".join(out) + "\n"
