"""The profile stage's step-time sources for the target environment: its fingerprint, a fresh measurement of its
endpoint, or the roofline the plan falls back to when neither a current profile nor an endpoint is there."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmcap.catalog import ModelSpec, get_gpu
from llmcap.errors import LlmcapError
from llmcap.perf import EnvironmentFingerprint, build_step_model

if TYPE_CHECKING:
    from llmcap.config import ProfileParams
    from llmcap.perf.profile import Profile

#: The profile params that are fingerprint fields under the same name.
FINGERPRINT_FIELDS = (
    "engine",
    "engine_version",
    "engine_commit",
    "driver_version",
    "runtime_version",
    "interconnect",
    "model_revision",
    "kv_dtype",
    "tp",
    "pp",
    "ep",
    "dp",
    "block_size",
    "max_num_seqs",
    "max_num_batched_tokens",
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "scheduler",
)


def target_fingerprint(params: ProfileParams, model_name: str, catalog_dir: Path) -> EnvironmentFingerprint:
    """The environment the plan is for, as params `profile` declares it: a stored profile is current when it matches."""
    gpu = get_gpu(params.gpu, catalog_dir / "gpus.yaml").name
    return EnvironmentFingerprint(
        **{k: getattr(params, k) for k in FINGERPRINT_FIELDS},
        device_sku=gpu,
        device_count=params.tp * params.pp,
        model_id=model_name,
        quantization=params.weight_quant,
    )


def measure_target(params: ProfileParams, model_name: str, current: EnvironmentFingerprint) -> Profile:
    """A fresh profile of `params.endpoint` over the params' grid, fingerprinted as declared plus what it reports."""
    from llmcap.credentials import api_key_from_env, redact_url
    from llmcap.live import ProfileSpec, endpoint_fingerprint, measure_endpoint, to_profile

    assert params.endpoint is not None
    spec = ProfileSpec.grid(
        params.isl,
        params.concurrency,
        osl=params.osl,
        repeats=params.repeats,
        max_num_batched_tokens=params.max_num_batched_tokens,
        cache_hits=tuple(params.cache_hits),
        block_tokens=params.block_size,
    )
    api_key = api_key_from_env(params.api_key_env)
    m = measure_endpoint(params.endpoint, params.served_model or model_name, spec, progress=True, api_key=api_key)
    if len(m.failed_runs) == len(m.runs):
        first = next((r.error for run in m.runs for r in run.results if r.error), "no tokens came back")
        raise LlmcapError(f"profile.endpoint: every request to {redact_url(params.endpoint)} failed: {first}")
    declared = current.model_dump(
        exclude={"engine", "engine_version", "block_size", "enable_prefix_caching", "kv_dtype"}
    )
    try:
        return to_profile(m, endpoint_fingerprint(m, **declared))
    except ValueError as exc:
        raise LlmcapError(f"profile.endpoint: nothing to fit from {redact_url(params.endpoint)}: {exc}") from None


def roofline_fallback(params: ProfileParams, model: ModelSpec, catalog_dir: Path) -> dict[str, Any]:
    """The roofline step model of the target configuration, as step_model.json records it."""
    gpu = get_gpu(params.gpu, catalog_dir / "gpus.yaml")
    tp, pp, ep, weight_quant, kv_dtype = params.tp, params.pp, params.ep, params.weight_quant, params.kv_dtype
    roof = build_step_model(model, gpu, tp=tp, pp=pp, ep=ep, weight_quant=weight_quant, kv_dtype=kv_dtype)
    return {
        "kind": "roofline",
        "gpu": gpu.name,
        "tp": tp,
        "pp": pp,
        "ep": ep,
        "weight_quant": weight_quant,
        "kv_dtype": kv_dtype,
        "params": roof.params.model_dump(mode="json"),
        "calibration": roof.calibration.describe() if roof.calibration else None,
    }
