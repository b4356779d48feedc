"""Shared test setup: every piece of state the stack writes goes to a per-session temp dir."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from stages.env import defaults

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
RAW = ROOT / "data" / "raw"

_STATE = Path(tempfile.mkdtemp(prefix="llmcap-test-state-"))
for key, value in defaults(_STATE).items():
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
