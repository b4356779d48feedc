"""The environment fingerprint: a stable hash, and staleness that names the fields that changed."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest
from pydantic import ValidationError

from llmcap.perf import EnvironmentFingerprint, fingerprint_hash, is_stale
from tests.conftest import ROOT

BASE = dict(
    engine="vllm",
    engine_version="0.32.0",
    device_sku="H100-SXM-80GB",
    device_count=4,
    model_id="Llama-3.1-70B",
    quantization="bf16",
    tp=4,
    block_size=16,
    max_num_batched_tokens=8192,
    scheduler={"async_scheduling": True},
)


def test_hash_is_sha256_of_the_canonical_json() -> None:
    fp = EnvironmentFingerprint(**BASE)
    canonical = json.dumps(fp.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    assert fingerprint_hash(fp) == hashlib.sha256(canonical.encode()).hexdigest()
    # field order of construction does not matter
    assert fingerprint_hash(EnvironmentFingerprint(**dict(reversed(list(BASE.items()))))) == fingerprint_hash(fp)


def test_hash_is_the_same_in_another_process() -> None:
    code = (
        "from llmcap.perf import EnvironmentFingerprint, fingerprint_hash; import json, sys; "
        "print(fingerprint_hash(EnvironmentFingerprint(**json.loads(sys.argv[1]))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(BASE)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={"PYTHONHASHSEED": "123", "PATH": ""},
    )
    assert out.stdout.strip() == fingerprint_hash(EnvironmentFingerprint(**BASE))


def test_changing_the_engine_version_marks_the_profile_stale() -> None:
    stored = EnvironmentFingerprint(**BASE)
    current = stored.model_copy(update={"engine_version": "0.33.0"})
    changes = is_stale(stored, current)
    assert [(c.field, c.stored, c.current) for c in changes] == [("engine_version", "0.32.0", "0.33.0")]
    assert str(changes[0]) == "engine_version: '0.32.0' -> '0.33.0'"
    assert fingerprint_hash(stored) != fingerprint_hash(current)
    assert is_stale(stored, EnvironmentFingerprint(**BASE)) == []


def test_every_differing_field_is_listed_including_scheduler_knobs() -> None:
    stored = EnvironmentFingerprint(**BASE)
    current = EnvironmentFingerprint(
        **{
            **BASE,
            "driver_version": "570.124",
            "tp": 8,
            "device_count": 8,
            "scheduler": {"async_scheduling": False, "stream_interval": 1},
        }
    )
    assert [c.field for c in is_stale(stored, current)] == [
        "driver_version",
        "device_count",
        "tp",
        "scheduler.async_scheduling",
        "scheduler.stream_interval",
    ]
    # an unknown value that becomes known is a change too
    assert is_stale(stored, current)[0].stored is None


def test_tags_are_flat_strings_with_the_hash() -> None:
    tags = EnvironmentFingerprint(**BASE).tags()
    assert tags["fingerprint.hash"] == fingerprint_hash(EnvironmentFingerprint(**BASE))
    assert tags["fingerprint.engine_version"] == "0.32.0" and tags["fingerprint.driver_version"] == ""
    assert tags["fingerprint.scheduler.async_scheduling"] == "True"
    assert all(isinstance(v, str) for v in tags.values())


def test_unknown_fields_and_bad_values_are_rejected() -> None:
    with pytest.raises(ValidationError):
        EnvironmentFingerprint(**BASE, gpu="h100")
    with pytest.raises(ValidationError):
        EnvironmentFingerprint(**{**BASE, "tp": 0})
