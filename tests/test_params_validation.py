"""params.yaml is validated completely at load: each bad value fails at once, naming its field.

Every case is the shipped params.yaml with one value changed, read by `load_params` as the stages do.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmcap.config import load_params
from llmcap.errors import InputFileError
from tests.conftest import ROOT

SHIPPED = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))


def _write(tmp_path: Path, changes: dict[str, Any]) -> Path:
    """The shipped params with `changes` (dotted path -> value) applied, written to tmp_path/params.yaml."""
    data = copy.deepcopy(SHIPPED)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        node = data
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def test_the_shipped_params_load() -> None:
    params = load_params(ROOT / "params.yaml")
    assert params.characterise.percentiles == [50, 90, 99]
    assert params.enumerate.parallel.tp == [1, 2, 4, 8] and params.profile.api_key_env is None


BAD: list[tuple[dict[str, Any], str, str]] = [
    # (change, field the error names, words of its message)
    ({"characterise.percentiles": [50, 150]}, "characterise.percentiles.1", "less than 100"),
    ({"characterise.percentiles": [0, 50]}, "characterise.percentiles.0", "greater than 0"),
    ({"characterise.percentiles": [50, 100]}, "characterise.percentiles.1", "less than 100"),
    ({"characterise.percentiles": []}, "characterise.percentiles", "at least 1 item"),
    ({"characterise.rps_windows_s": [0, -1]}, "characterise.rps_windows_s.0", "greater than 0"),
    ({"characterise.rps_windows_s": [60, -1]}, "characterise.rps_windows_s.1", "greater than 0"),
    ({"characterise.lru_cache_blocks": [4096, 0]}, "characterise.lru_cache_blocks.1", "greater than or equal to 1"),
    ({"enumerate.parallel.tp": [0, 3]}, "enumerate.parallel.tp.0", "greater than or equal to 1"),
    ({"enumerate.parallel.dp": [1, -2]}, "enumerate.parallel.dp.1", "greater than or equal to 1"),
    ({"enumerate.aggregated.max_num_seqs": [0]}, "enumerate.aggregated.max_num_seqs.0", "greater than or equal to 1"),
    ({"enumerate.gpus": ["H100-SXM-80GB", "V100-PCIE-16GB"]}, "enumerate.gpus.1", "unknown GPU 'V100-PCIE-16GB'"),
    ({"enumerate.weight_quants": ["bf16", "fp6"]}, "enumerate.weight_quants.1", "unknown weight format 'fp6'"),
    ({"enumerate.kv_dtypes": ["fp4"]}, "enumerate.kv_dtypes.0", "unknown KV cache dtype 'fp4'"),
    ({"enumerate.model": "Llama-9-1T"}, "enumerate.model", "unknown model 'Llama-9-1T'"),
    ({"enumerate.usd_per_gpu_hour": {"TPU-v5": 1.2}}, "enumerate.usd_per_gpu_hour.TPU-v5", "unknown GPU 'TPU-v5'"),
    ({"enumerate.usd_per_gpu_hour": {"h100": -1}}, "enumerate.usd_per_gpu_hour.h100", "greater than or equal to 0"),
    ({"enumerate.max_context_len": 0}, "enumerate.max_context_len", "positive number of tokens, 'model' or 'workload'"),
    ({"enumerate.max_context_len": True}, "enumerate.max_context_len", "(got True)"),
    ({"enumerate.max_context_len": "longest"}, "enumerate.max_context_len", "(got 'longest')"),
    ({"enumerate.allow_multi_node": 1}, "enumerate.allow_multi_node", "valid boolean"),
    ({"enumerate.memory.gpu_memory_utilization": math.nan}, "enumerate.memory.gpu_memory_utilization", "finite number"),
    ({"enumerate.memory.non_torch_bytes": True}, "enumerate.memory.non_torch_bytes", "valid integer"),
    ({"profile.gpu": "RTX-4090"}, "profile.gpu", "unknown GPU 'RTX-4090'"),
    ({"profile.weight_quant": "int3"}, "profile.weight_quant", "unknown weight format 'int3'"),
    ({"profile.kv_dtype": "fp16x"}, "profile.kv_dtype", "unknown KV cache dtype 'fp16x'"),
    ({"profile.tp": 0}, "profile.tp", "greater than or equal to 1"),
    ({"profile.tp": "4"}, "profile.tp", "valid integer"),
    ({"profile.tp": True}, "profile.tp", "valid integer"),
    ({"profile.enable_prefix_caching": "true"}, "profile.enable_prefix_caching", "valid boolean"),
    ({"profile.isl": [128, 0]}, "profile.isl.1", "greater than or equal to 1"),
    ({"profile.scheduler": {"async_scheduling": [True]}}, "profile.scheduler", "knob 'async_scheduling' must be"),
    ({"watch.replan_cron": "weekly"}, "watch.replan_cron", "a cron expression has 5 fields"),
    ({"watch.interval_s": 0}, "watch.interval_s", "greater than or equal to 10"),
    ({"watch.endpoints": "http://127.0.0.1:8000"}, "watch.endpoints", "valid list"),
    (
        {"stores.mlflow_tracking_uri": "http://ops:s3cret@mlflow.internal:5000"},
        "stores.mlflow_tracking_uri",
        "carries a credential",
    ),
    ({"stores.dvc_remote": 5}, "stores.dvc_remote", "valid string"),
    ({"profile.scheduler": {"x": math.inf}}, "profile.scheduler", "finite number"),
    ({"profile.endpoint": "127.0.0.1:8000"}, "profile.endpoint", "http:// or https:// URL"),
    ({"profile.api_key_env": "two words"}, "profile.api_key_env", "not an environment variable name"),
    ({"replay.endpoint": "127.0.0.1:8000"}, "replay.endpoint", "http:// or https:// URL"),
    ({"replay.rate_scales": [1.2, 0.8]}, "replay.rate_scales", "strictly increasing"),
    ({"replay.rate_scales": [0.8, 0]}, "replay.rate_scales.1", "greater than 0"),
    ({"replay.isl_buckets": [4096, 4096]}, "replay.isl_buckets", "strictly increasing"),
    ({"replay.twin_dilation": 0}, "replay.twin_dilation", "greater than 0"),
    ({"replay.excerpt_requests": 1}, "replay.excerpt_requests", "greater than or equal to 2"),
    ({"seed": True}, "seed", "valid integer"),
    ({"seed": -1}, "seed", "greater than or equal to 0"),
    ({"seed": 1.5}, "seed", "valid integer"),
    ({"trace.arrivals.seed": True}, "trace.arrivals.seed", "valid integer"),
    ({"trace.arrivals.rate_rps": math.nan}, "trace.arrivals.rate_rps", "finite number"),
    ({"trace.arrivals.rate_rps": True}, "trace.arrivals.rate_rps", "valid number"),
    ({"trace.file": ""}, "trace.file", "at least 1 character"),
    ({"clean.window_start_s": -5}, "clean.window_start_s", "greater than or equal to 0"),
    (
        {"clean.window_start_s": 100, "clean.window_end_s": 50},
        "clean",
        "window_end_s (50) must be after window_start_s (100)",
    ),
    ({"clean.duplicates": True}, "clean.duplicates", "by_id', 'identical' or 'keep'"),
    ({"trace.generate_arrivals": 1}, "trace.generate_arrivals", "valid boolean"),
    ({"size.target_rps": math.inf}, "size.target_rps", "finite number"),
    ({"size.target_rps": math.nan}, "size.target_rps", "finite number"),
    ({"size.target_rps": 0}, "size.target_rps", "greater than 0"),
    ({"size.slo.attainment_target": 1.5}, "size.slo.attainment_target", "less than or equal to 1"),
    ({"size.slo.ttft_ms": math.inf}, "size.slo.ttft_ms", "finite number"),
    ({"size.search.seeds": [0, True]}, "size.search.seeds.1", "valid integer"),
    ({"size.search.seeds": [-1]}, "size.search.seeds.0", "greater than or equal to 0"),
    (
        {"size.search.min_rate": 10, "size.search.max_rate": 5},
        "size.search.min_rate",
        "must be below size.search.max_rate",
    ),
    ({"size.excerpt_requests": 1e9}, "size.excerpt_requests", "valid integer"),
    ({"size.compute.workers": False}, "size.compute.workers", "valid integer"),
    ({"size.headroom.node_failures": -1}, "size.headroom.node_failures", "greater than or equal to 0"),
]


@pytest.mark.parametrize(
    ("change", "field", "words"), BAD, ids=[b[1] + "=" + repr(list(b[0].values())[-1]) for b in BAD]
)
def test_a_bad_value_fails_at_load_naming_its_field(
    tmp_path: Path, change: dict[str, Any], field: str, words: str
) -> None:
    path = _write(tmp_path, change)
    with pytest.raises(InputFileError) as err:
        load_params(path)
    assert err.value.field == field, str(err.value)
    assert words in err.value.reason, str(err.value)
    assert str(err.value).startswith(f"{path}: field '{field}': ")
    assert "\n" not in str(err.value)


def test_the_message_says_what_came_in_and_counts_the_other_errors(tmp_path: Path) -> None:
    with pytest.raises(InputFileError) as err:
        load_params(_write(tmp_path, {"characterise.rps_windows_s": [0, -1], "enumerate.parallel.tp": [0]}))
    assert err.value.field == "characterise.rps_windows_s.0"
    assert err.value.reason == (
        "Input should be greater than 0 (got 0); 2 more errors: 'characterise.rps_windows_s.1', 'enumerate.parallel.tp.0'"
    )


@pytest.mark.parametrize(
    ("change", "check"),
    [
        (
            {"trace.arrivals.rate_rps": 2, "size.target_rps": 5},
            lambda p: p.size.target_rps == 5.0 and p.trace.arrivals.rate_rps == 2.0,
        ),
        ({"enumerate.max_context_len": "model"}, lambda p: p.enumerate.max_context_len == "model"),
        ({"enumerate.max_context_len": 8192}, lambda p: p.enumerate.max_context_len == 8192),
        (
            {"enumerate.gpus": ["h100", "H200"], "profile.gpu": "h100_sxm5"},
            lambda p: p.enumerate.gpus == ["h100", "H200"],
        ),
        (
            {"enumerate.model": str(ROOT / "llmcap" / "catalog" / "data" / "models" / "Llama-3.1-8B")},
            lambda p: p.enumerate.model.endswith("Llama-3.1-8B"),
        ),
        (
            {"enumerate.weight_quants": ["int4-awq-g64", "FP8"], "enumerate.kv_dtypes": ["fp8_e4m3"]},
            lambda p: p.enumerate.kv_dtypes == ["fp8_e4m3"],
        ),
        ({"characterise.percentiles": [0.1, 99.9]}, lambda p: p.characterise.percentiles == [0.1, 99.9]),
        (
            {"profile.endpoint": "https://llm.internal:8443/", "profile.api_key_env": "OPENAI_API_KEY"},
            lambda p: p.profile.api_key_env == "OPENAI_API_KEY",
        ),
        (
            {"profile.scheduler": {"async_scheduling": True, "max_loras": 4}},
            lambda p: p.profile.scheduler["max_loras"] == 4,
        ),
    ],
)
def test_good_values_still_load(tmp_path: Path, change: dict[str, Any], check: Any) -> None:
    assert check(load_params(_write(tmp_path, change)))


@pytest.mark.parametrize(
    "endpoint",
    ["http://user:s3cretpw@127.0.0.1:8000", "http://127.0.0.1:8000/?api_key=s3cretpw", "https://s3cretpw@llm.internal"],
)
def test_a_credential_in_the_endpoint_is_refused_without_being_echoed(tmp_path: Path, endpoint: str) -> None:
    with pytest.raises(InputFileError) as err:
        load_params(_write(tmp_path, {"profile.endpoint": endpoint}))
    assert err.value.field == "profile.endpoint" and "carries a credential" in err.value.reason
    assert "s3cretpw" not in str(err.value)
    with pytest.raises(InputFileError) as err:
        load_params(_write(tmp_path, {"replay.endpoint": endpoint}))
    assert err.value.field == "replay.endpoint" and "replay.api_key_env" in err.value.reason
    assert "s3cretpw" not in str(err.value)


def test_a_yaml_error_does_not_quote_a_password(tmp_path: Path) -> None:
    path = tmp_path / "params.yaml"
    path.write_text("trace: {file: x}\nprofile:\n  endpoint: http://user:s3cretpw@h:1 : [\n", encoding="utf-8")
    with pytest.raises(InputFileError) as err:
        load_params(path)
    assert str(err.value) == f"{path}:3: not valid YAML: mapping values are not allowed here"  # one line, no snippet
    assert "s3cretpw" not in str(err.value)


def test_names_are_checked_against_the_given_catalog(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog"
    (catalog / "models").mkdir(parents=True)
    (catalog / "gpus.yaml").write_text((ROOT / "llmcap" / "catalog" / "data" / "gpus.yaml").read_text(encoding="utf-8"))
    with pytest.raises(InputFileError) as err:  # the shipped model is not in this catalog
        load_params(ROOT / "params.yaml", catalog_dir=catalog)
    assert err.value.field == "enumerate.model" and "catalog (empty)" in err.value.reason
