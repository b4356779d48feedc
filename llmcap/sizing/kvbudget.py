"""KV budget from the engine: the KV capacity an engine stated replaces the memory plan's where it applies.

The memory plan (`llmcap.memory`) predicts each candidate's KV tokens per instance from HBM, weights,
runtime and a margin. An engine states its own at startup ("GPU KV cache size: N tokens",
`llmcap.live.engine_kv`; a profile made by `llmcap profile` records it as `kv_capacity_tokens`). Where a
stated number is of a candidate's configuration (GPU, TP, PP, EP, weight format, KV dtype: what a profile
is matched by, `llmcap.sizing.measured`), sizing uses it (`size.kv_budget: engine`) and says so; the
memory plan's number stays beside it (`kv_tokens_planned`) for the report. An engine log is read by the
command line (`llmcap size --kv-from-log`, `llmcap.commands._size_sources`).

The engine states tokens per engine core — one data-parallel rank, whose TP ranks hold the same tokens —
so an instance of DP d holds d times that, in whole blocks of the candidate's block size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from llmcap.sizing.measured import ROW_COLUMNS, describe_key, stated


@dataclass(frozen=True)
class EngineKV:
    """A KV capacity an engine stated, and the configuration it applies to."""

    tokens: int  # per engine core (one DP rank), as "KV cache size: N tokens" says
    source: str  # where it was read, for the notes
    match: Mapping[str, Any]  # candidate-row column → value (ROW_COLUMNS) the engine ran


def from_fingerprint(tokens: int, fingerprint: Mapping[str, Any], source: str) -> EngineKV:
    """A profile's stated capacity, for the configuration its fingerprint states."""
    return EngineKV(int(tokens), source, stated(fingerprint))


def _matches(row: Mapping[str, Any], match: Mapping[str, Any]) -> bool:
    return bool(match) and all(str(row[c]) == str(v) for c, v in match.items())


def apply_engine_kv(
    candidates: pd.DataFrame, engine: Sequence[EngineKV], budget: str
) -> tuple[pd.DataFrame, list[str]]:
    """`candidates` with `kv_tokens_planned` (the memory plan's KV tokens per instance) and `kv_tokens_measured` (the
    engine's, where one applies) on every row, and — `budget` "engine" — the engine's number in `kv_tokens_per_instance`
    and `kv_tokens_per_rank` of the rows it applies to (a row it leaves without room for one max-context request is
    no longer feasible); with the notes saying what was used where."""
    out = candidates.copy()
    out["kv_tokens_planned"] = out["kv_tokens_per_instance"]
    measured = pd.array([pd.NA] * len(out), dtype="Int64")
    notes: list[str] = []
    for kv in engine:
        hit = [i for i, (_, row) in enumerate(out.iterrows()) if _matches(row, kv.match)]
        if not hit:
            notes.append(
                f"KV budget: {kv.source} matches no candidate of this search (its configuration: "
                f"{', '.join(f'{c} {v}' for c, v in kv.match.items()) or 'unstated'}); the memory plan's numbers are used"
            )
            continue
        for i in hit:
            row = out.iloc[i]
            block = int(row["block_size"])
            measured[i] = (kv.tokens // block) * block * int(row["dp"])
        first = out.iloc[hit[0]]
        key = describe_key(
            (
                str(first["gpu"]),
                int(first["tp"]),
                int(first["pp"]),
                int(first["ep"]),
                str(first["weight_quant"]),
                str(first["kv_dtype"]),
            )
        )
        planned = sorted(
            {int(out.iloc[i]["kv_tokens_planned"]) for i in hit if not pd.isna(out.iloc[i]["kv_tokens_planned"])}
        )
        engine_tokens = int(measured[hit[0]])
        said = f"{planned[0]:,}" if len(planned) == 1 else f"{planned[0]:,}–{planned[-1]:,}" if planned else "none"
        change = f" ({engine_tokens / planned[0] - 1:+.0%})" if len(planned) == 1 and planned[0] else ""
        used = (
            "sizing uses the engine's" if budget == "engine" else "sizing uses the memory plan's (size.kv_budget: plan)"
        )
        notes.append(
            f"KV budget of {key}: memory plan {said} KV tokens per instance, engine {engine_tokens:,}{change} from {kv.source}; {used}"
        )
    out["kv_tokens_measured"] = measured
    if budget == "engine":
        stated_rows = out["kv_tokens_measured"].notna()
        out.loc[stated_rows, "kv_tokens_per_instance"] = out.loc[stated_rows, "kv_tokens_measured"]
        out.loc[stated_rows, "kv_tokens_per_rank"] = (
            out.loc[stated_rows, "kv_tokens_measured"] // out.loc[stated_rows, "dp"]
        )
        short = stated_rows & out["feasible"] & (out["kv_tokens_per_rank"] < out["max_context_len"])
        if short.any():
            out.loc[short, "feasible"] = False
            out.loc[short, "reason_codes"] = "kv_below_one_max_context_request"
            out.loc[short, "reasons"] = [
                f"the engine's KV holds {int(t):,} tokens/rank < one max-context request ({int(c):,} tokens)"
                for t, c in zip(out.loc[short, "kv_tokens_per_rank"], out.loc[short, "max_context_len"], strict=True)
            ]
            notes.append(
                f"KV budget: {int(short.sum())} candidate(s) no longer hold one max-context request with the engine's KV"
            )
    return out, notes


def kv_budget_summary(candidates: pd.DataFrame) -> list[dict[str, Any]]:
    """Per configuration the engine stated a capacity for: planned, measured and used KV tokens per instance."""
    if "kv_tokens_measured" not in candidates.columns:
        return []
    rows = candidates[candidates["kv_tokens_measured"].notna()]
    out: dict[tuple, dict[str, Any]] = {}
    for _, r in rows.iterrows():
        key = (
            str(r["gpu"]),
            int(r["tp"]),
            int(r["pp"]),
            int(r["ep"]),
            str(r["weight_quant"]),
            str(r["kv_dtype"]),
            int(r["dp"]),
            int(r["block_size"]),
        )
        out.setdefault(
            key,
            {
                "configuration": describe_key(key[:6]) + (f", DP{key[6]}" if key[6] > 1 else ""),
                "planned": sorted({int(x) for x in rows.loc[_same(rows, key), "kv_tokens_planned"].dropna()}),
                "measured": int(r["kv_tokens_measured"]),
                "used": int(r["kv_tokens_per_instance"]),
            },
        )
    return list(out.values())


def _same(rows: pd.DataFrame, key: tuple) -> pd.Series:
    cols = (*ROW_COLUMNS, "dp", "block_size")
    mask = pd.Series(True, index=rows.index)
    for c, v in zip(cols, key, strict=True):
        mask &= rows[c].astype(str) == str(v)
    return mask
