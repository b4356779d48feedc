"""JSON has no NaN or Infinity: a statistic that could not be computed is written as null, so every
consumer (jq, browsers, pandas) can parse what llmcap writes."""

from __future__ import annotations

import math
from typing import Any


def nan_to_null(obj: Any) -> Any:
    """`obj` with every non-finite float, however deeply nested in dicts, lists and tuples, replaced by None."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: nan_to_null(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [nan_to_null(v) for v in obj]
    return obj
