"""What each serving engine does by default: its admission policy and the scheduler knobs it sets when the
user sets none (chunked-prefill token budget, max batch, KV block size), each with where it comes from.

A user who names an engine (`--engine`, `size.engine`) gets that engine's behaviour without knowing its
knobs; a knob given explicitly still wins. Several defaults depend on the GPU's memory, as the engines
decide them at startup.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from llmcap.catalog import GpuSpec
from llmcap.errors import LlmcapError

GIB = 2**30
ENGINES = ("vllm", "sglang", "trtllm")
# the admission policies each engine offers, its default first (TensorRT-LLM's capacity scheduler has two)
ENGINE_ADMISSIONS = {
    "vllm": ("vllm",),
    "sglang": ("sglang",),
    "trtllm": ("trtllm-guaranteed-no-evict", "trtllm-max-utilization"),
}


@dataclass(frozen=True)
class EnginePreset:
    engine: str
    version: str  # the release whose defaults these are
    admission_policy: str  # llmcap's name of its admission (`llmcap.policy_names`)
    max_num_batched_tokens: int  # tokens per scheduler step (chunked-prefill budget)
    max_num_seqs: int  # most running requests
    block_size: int  # KV block (page) size in tokens
    sources: tuple[str, ...]  # where each value comes from

    def line(self) -> str:
        return (
            f"{self.engine} {self.version} defaults: admission {self.admission_policy}, chunk {self.max_num_batched_tokens:,} tokens, "
            f"max batch {self.max_num_seqs:,}, KV block {self.block_size}"
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "engine": self.engine,
            "version": self.version,
            "admission_policy": self.admission_policy,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_num_seqs": self.max_num_seqs,
            "block_size": self.block_size,
            "sources": list(self.sources),
            "line": self.line(),
        }


def _vllm(gpu: GpuSpec) -> EnginePreset:
    # vllm serve (usage context OPENAI_API_SERVER): larger defaults on >= 70 GiB GPUs other than the A100
    large = gpu.hbm_bytes >= 70 * GIB and "a100" not in gpu.name.lower()
    return EnginePreset(
        "vllm",
        "0.11",
        "vllm",
        8192 if large else 2048,
        1024 if large else 256,
        16,
        (
            "vllm/engine/arg_utils.py EngineArgs.get_batch_defaults: OPENAI_API_SERVER max_num_batched_tokens 8192 and "
            "max_num_seqs 1024 on GPUs with >= 70 GiB that are not A100, else 2048 and 256 (Apache-2.0)",
            "vllm/config/cache.py CacheConfig: block_size 16 on CUDA",
            "vLLM v1 scheduler: admit by this step's blocks, preempt the newest by recompute (llmcap admission 'vllm')",
        ),
    )


def _sglang(gpu: GpuSpec) -> EnginePreset:
    mib = gpu.hbm_bytes / 2**20
    chunk = 2048 if mib < 35 * 1024 else 8192 if mib < 160 * 1024 else 16384
    return EnginePreset(
        "sglang",
        "0.5",
        "sglang",
        chunk,
        4096,
        1,
        (
            "sglang/srt/server_args.py ServerArgs: chunked_prefill_size 2048 below 35 GiB, 8192 below 160 GiB (H100, H200, "
            "A100), else 16384 (B200, MI300); page_size 1 (Apache-2.0)",
            "sglang scheduler: max_running_requests unset = max_total_num_tokens // 2, bounded by the request pool "
            "(at most 4096): 4096 here, KV admission decides below it",
            "sglang schedule policy: admit while free KV covers the newcomer and a decaying share of the running "
            "requests' remaining outputs (new_token_ratio; llmcap admission 'sglang')",
        ),
    )


def _trtllm(gpu: GpuSpec) -> EnginePreset:
    return EnginePreset(
        "trtllm",
        "1.0",
        "trtllm-guaranteed-no-evict",
        8192,
        2048,
        32,
        (
            "tensorrt_llm/llmapi/llm_args.py: max_batch_size 2048, max_num_tokens 8192; KvCacheConfig tokens_per_block 32 "
            "(Apache-2.0)",
            "https://nvidia.github.io/TensorRT-LLM/performance/performance-tuning-guide/useful-runtime-flags.html: "
            "capacity scheduler policy GUARANTEED_NO_EVICT by default (llmcap admission 'trtllm-guaranteed-no-evict')",
        ),
    )


_PRESETS = {"vllm": _vllm, "sglang": _sglang, "trtllm": _trtllm}


def presets_for(engine: str | None, gpus: Iterable[GpuSpec]) -> dict[str, EnginePreset]:
    """Each GPU's preset of `engine`, by GPU name (none without an engine)."""
    return {} if engine is None else {g.name: engine_preset(engine, g) for g in gpus}


def engine_preset(engine: str, gpu: GpuSpec) -> EnginePreset:
    """`engine`'s defaults on `gpu`; a clear error for an engine without a preset."""
    if engine not in _PRESETS:
        raise LlmcapError(f"--engine {engine!r}: expected one of {', '.join(ENGINES)}")
    return _PRESETS[engine](gpu)
