"""What `llmcap size` was told of the engine: what timed its steps (summary.json `step_model`, the printed line) and
the KV capacity the engine stated (`--profile`'s record, `--kv-from-log`: `llmcap.sizing.kvbudget`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from llmcap.errors import InputFileError, LlmcapError
from llmcap.sizing.kvbudget import EngineKV, from_fingerprint
from llmcap.sizing.measured import OPTIONS, ROW_COLUMNS, MeasuredModels, MeasuredProfile, describe_key, stated


def step_model_summary(prof: MeasuredProfile | None, measured: MeasuredModels, step_model: Path | None) -> dict:
    """Which step-time source timed which candidates."""
    if step_model is not None:
        keys = [describe_key(k) for k in measured]
        return {
            "source": "step_model",
            "file": str(step_model),
            "configurations": keys,
            "line": f"{step_model} for {'; '.join(keys) or 'no candidate'}; the roofline for every other candidate",
        }
    if prof is None:
        return {"source": "roofline", "line": "the roofline for every candidate"}
    keys = [describe_key(k) for k in measured]
    return {
        "source": "profile",
        "profile": str(prof.directory),
        "fingerprint_hash": prof.fingerprint_hash,
        "configurations": keys,
        "line": f"{prof.describe()} for {'; '.join(keys)}; the roofline for every other candidate",
    }


def from_log(path: Path, candidates: pd.DataFrame, match: Mapping[str, Any] | None = None) -> EngineKV:
    """The capacity an engine's startup log states, for `match` (a profile's configuration) or, without one,
    the one configuration the feasible `candidates` share: a log does not say what it ran."""
    from llmcap.live.engine_kv import parse_kv_cache_log

    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise InputFileError(path, f"cannot read the engine log ({exc.strerror})") from None
    info = parse_kv_cache_log(text)
    if info is None:
        raise InputFileError(path, 'no "KV cache size: N tokens" line (vLLM logs it once the engine has started)')
    if match is None:
        feasible = candidates[candidates["feasible"]]
        many = {c: sorted(map(str, feasible[c].unique())) for c in ROW_COLUMNS if feasible[c].nunique() > 1}
        if many:
            which = "; ".join(f"{OPTIONS.get(c, c)} {', '.join(v)}" for c, v in many.items())
            raise LlmcapError(
                f"--kv-from-log {path}: a log does not say which configuration it ran and this search considers several "
                f"({which}): narrow them to the engine's, or give --profile"
            )
        match = {c: feasible[c].iloc[0] for c in ROW_COLUMNS} if not feasible.empty else {}
    return EngineKV(
        info.capacity_tokens, f"engine log {path} ({info.device} KV cache size: {info.capacity_tokens:,} tokens)", match
    )


def stated_kv(
    profile: MeasuredProfile | None, log: Path | None, candidates: pd.DataFrame, given: tuple[EngineKV, ...] = ()
) -> tuple[EngineKV, ...]:
    """What `llmcap size` was told the engine holds: an engine log's line (`--kv-from-log`, for the profile's configuration
    when `--profile` names one), else the profile's recorded capacity, else `given` (a step_model.json's)."""
    if log is not None:
        return (from_log(log, candidates, stated(profile.fingerprint) if profile is not None else None),)
    if profile is not None and profile.kv_capacity_tokens:
        where = f"profile {profile.directory} (fingerprint {profile.fingerprint_hash[:12]})"
        return (from_fingerprint(profile.kv_capacity_tokens, profile.fingerprint, where),)
    return given


def budget_lines(summary: Mapping[str, Any]) -> list[str]:
    """The console's lines on the KV budget the engine stated (planned, engine, used per configuration) and the P→D link."""
    out = [
        f"KV budget of {b['configuration']}: memory plan {', '.join(f'{p:,}' for p in b['planned'])}, engine {b['measured']:,}, "
        f"sized with {b['used']:,} tokens per instance"
        for b in summary.get("kv_budget") or []
    ]
    network = summary.get("network")
    return out + ([network["provisioning"]["line"]] if network else [])
