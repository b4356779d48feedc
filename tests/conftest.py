"""Shared test setup: every piece of state the stack writes goes to a per-session temp dir."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
RAW = ROOT / "data" / "raw"

_STATE = Path(tempfile.mkdtemp(prefix="llmcap-test-state-"))
for key, value in {
    "MLFLOW_TRACKING_URI": f"sqlite:///{_STATE / 'mlflow.db'}",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "PREFECT_HOME": str(_STATE / "prefect"),
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DVC_NO_ANALYTICS": "1",
    "DVC_SITE_CACHE_DIR": str(_STATE / "dvc-site-cache"),
    "MPLCONFIGDIR": str(_STATE / "matplotlib"),
    "MPLBACKEND": "Agg",
}.items():
    os.environ[key] = value  # tests never touch the developer's own stores


@pytest.fixture(scope="session")
def state_dir() -> Path:
    return _STATE


TRACES = {
    "mooncake_conversation": RAW / "mooncake" / "conversation_trace.jsonl",
    "azure_conv": RAW / "azure2023" / "AzureLLMInferenceTrace_conv.csv",
    "mooncake_synthetic": FIXTURES / "traces" / "mooncake" / "synthetic_trace.jsonl",
    "vidur_arxiv": FIXTURES / "traces" / "vidur" / "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
}
