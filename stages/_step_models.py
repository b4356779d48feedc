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


def roofline_calibrations(gpus: set[str]) -> dict[str, dict[str, str]]:
    """The shipped roofline calibrations (llmcap.perf.calibration) of these GPUs: file and sha256 by GPU."""
    from llmcap.perf.calibration import shipped_calibrations

    return {c.gpu: c.describe() for c in shipped_calibrations() if c.gpu in gpus}


def step_times_note(source: str, info: dict, measured: dict, calibrations: dict[str, dict[str, str]]) -> str:
    """What times the candidates: the roofline (with the GPUs' fitted efficiencies where shipped), the
    calibrated profile where it matches, and the written-back corrections with their versions."""
    from llmcap.perf.corrections import describe
    from llmcap.sizing.measured import config_key, describe_key, fingerprint_key

    corrected = {config_key(e["configuration"]) for e in info.get("corrections") or []}
    profiled = fingerprint_key(info["fingerprint"]) if source.startswith("profile") else None
    fitted = ", ".join(f"{g} ({c['file']}, sha256 {c['sha256'][:12]})" for g, c in calibrations.items()) or "none"
    uses = f"roofline per candidate (efficiencies fitted to timed operations for: {fitted}; other GPUs: documented defaults)" + "".join(
        f", {'the calibrated profile' if k == profiled else 'the roofline'}{' corrected' if k in corrected else ''} for {describe_key(k)}"
        for k in measured)
    return f"step times: {uses} (profile stage source: {source}; written-back corrections: {describe(info.get('corrections') or [])})"
