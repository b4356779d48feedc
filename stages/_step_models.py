"""The profile stage's step_model.json as the size and autoscale stages read it: its source, and the measured
step models of the candidates it matches (none: every candidate on the roofline)."""

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
    return source, info, measured
