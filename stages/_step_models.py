"""The profile stage's step_model.json as the size and autoscale stages read it: its source, and the measured
step models of the candidates it matches (none: every candidate on the roofline), with the corrections
reconciliation wrote back applied to their configurations."""

from __future__ import annotations

import json
from pathlib import Path


def load_step_info(path: Path) -> tuple[str, dict, dict]:
    """(source, the file's content, measured step models by candidate configuration)."""
    from llmcap.errors import InputFileError

    try:
        info = json.loads(path.read_text(encoding="utf-8"))
        source = info["source"]
    except (OSError, KeyError, json.JSONDecodeError) as exc:
        raise InputFileError(path, f"not a readable step_model.json ({exc})") from None
    measured: dict = {}
    if source.startswith("profile") and info.get("step_model"):  # a measured, matching profile
        from llmcap.perf import CalibratedFit
        from llmcap.sizing.measured import measured_models

        measured = measured_models(CalibratedFit.from_dict(info["step_model"]), info["fingerprint"])
    if info.get("corrections"):  # written back by reconciliation, resolved by the profile stage
        from llmcap.sizing.measured import with_corrections

        measured = with_corrections(measured, info["corrections"], info["model"])
    return source, info, measured


def step_times_note(source: str, info: dict, measured: dict) -> str:
    """What times the candidates: the roofline, the calibrated profile where it matches, and the
    written-back corrections with their versions."""
    from llmcap.perf.corrections import describe
    from llmcap.sizing.measured import config_key, describe_key, fingerprint_key

    corrected = {config_key(e["configuration"]) for e in info.get("corrections") or []}
    profiled = fingerprint_key(info["fingerprint"]) if source.startswith("profile") else None
    uses = "roofline per candidate" + "".join(
        f", {'the calibrated profile' if k == profiled else 'the roofline'}{' corrected' if k in corrected else ''} for {describe_key(k)}"
        for k in measured)
    return f"step times: {uses} (profile stage source: {source}; written-back corrections: {describe(info.get('corrections') or [])})"
