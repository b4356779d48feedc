"""What one deployment is: the engine and pool options (model, GPU, TP, replicas or P/D pools, router, engine
limits, KV cache) and the `SimConfig` plus step-time models they build. The one way a deployment description
becomes simulator configs, used by `simulate`, `twin serve`, the replay unit and the rollout predictions, so the
simulator and the twin always see the same engine. The command line's options for it are in
`llmcap.commands._deployment`.

Step times come from the roofline (`llmcap.perf.build_step_model`, compiled for speed by the
simulator); KV blocks per replica come from the memory plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel, ValidationError

import llmcap.perf as perf
from llmcap.catalog import GpuSpec, ModelSpec, get_gpu
from llmcap.catalog.quant import kv_dtype_bytes
from llmcap.engine_presets import EnginePreset
from llmcap.errors import LlmcapError
from llmcap.first_token import FIRST_TOKEN_FROM
from llmcap.memory import MemoryParams, plan_memory
from llmcap.parallelism import Parallelism
from llmcap.perf.model import StepTimeModel
from llmcap.policy_names import admission_option, queue_option
from llmcap.sim import EngineConfig, LinkConfig, PDConfig, SimConfig, TierConfig, router_names
from llmcap.sim.config import tier_of
from llmcap.sizing.params import PrefixTier


def model_default(model: type[BaseModel], name: str) -> Any:
    """A simulator or memory model's default of `name`: the command line's defaults are those, never copies."""
    return model.model_fields[name].get_default(call_default_factory=True)


@dataclass(frozen=True)
class EngineOptions:
    """The engine and pool options of a deployment, as the command line gives them. Each default is the
    simulator's own (`llmcap.sim.config`, `llmcap.memory`), in the command line's units; the commands'
    options default to these (`ENGINE`), and tests/test_cli_defaults.py keeps every one equal."""

    tp: int = 1
    replicas: int = model_default(SimConfig, "replicas")
    router: str = model_default(SimConfig, "router")
    admission_policy: str = model_default(EngineConfig, "admission_policy")
    scheduling_policy: str = model_default(EngineConfig, "scheduling_policy")
    pd: str | None = None
    first_token_from: str = model_default(PDConfig, "first_token_from")  # after the P→D handoff (llmcap.first_token)
    link_gbps: float = model_default(LinkConfig, "bandwidth_bytes_s") / 1e9
    link_latency_ms: float = model_default(LinkConfig, "latency_s") * 1e3
    quant: str = "bf16"
    kv_dtype: str = "bf16"
    max_num_seqs: int = model_default(EngineConfig, "max_num_seqs")
    max_num_batched_tokens: int = model_default(EngineConfig, "max_num_batched_tokens")
    block_size: int = model_default(EngineConfig, "block_size")
    num_blocks: int | None = None
    gpu_memory_utilization: float = model_default(MemoryParams, "gpu_memory_utilization")
    prefix_caching: bool = model_default(EngineConfig, "enable_prefix_caching")
    host_blocks: int = model_default(EngineConfig, "host_blocks")
    host_gbps: float = model_default(EngineConfig, "host_bandwidth_bytes_s") / 1e9
    tiers: tuple[str, ...] = ()  # offload tiers below the host: NAME:GB:GBps[:lookup_ms] each (parse_tier)
    max_model_len: int | None = None
    decode_gpu: str | None = None
    decode_tp: int | None = None
    decode_max_num_seqs: int | None = None
    decode_max_num_batched_tokens: int | None = None
    decode_num_blocks: int | None = None

    @property
    def decode_differs(self) -> bool:
        return any(
            v is not None
            for v in (
                self.decode_gpu,
                self.decode_tp,
                self.decode_max_num_seqs,
                self.decode_max_num_batched_tokens,
                self.decode_num_blocks,
            )
        )


ENGINE = EngineOptions()  # the commands' option defaults (`tp: TpOpt = ENGINE.tp`)


def parse_pd(spec: str | None) -> tuple[int, int] | None:
    if spec is None:
        return None
    parts = spec.split(":")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise LlmcapError(f"--pd must be P:D with positive integers (e.g. 2:3), got {spec!r}")
    return int(parts[0]), int(parts[1])


def tier_spec(spec: str) -> PrefixTier:
    """`--tier NAME:GB:GBps[:lookup_ms]`: an offload tier of GB capacity per instance, loading at GBps, asked
    at lookup_ms a time."""
    parts = spec.split(":")
    try:
        if len(parts) not in (3, 4):
            raise ValueError
        gb, gbps, lookup_ms = float(parts[1]), float(parts[2]), float(parts[3]) if len(parts) == 4 else 0.0
        if not parts[0] or min(gb, gbps) <= 0 or lookup_ms < 0:
            raise ValueError
    except ValueError:
        raise LlmcapError(
            f"--tier must be NAME:GB:GBps[:lookup_ms] with GB and GBps > 0 (e.g. ssd:2000:6:0.2), got {spec!r}"
        ) from None
    return PrefixTier(name=parts[0], gb=gb, gbps=gbps, lookup_ms=lookup_ms)


def parse_tier(spec: str, block_bytes: float) -> TierConfig:
    """`--tier` in the engine's KV blocks of `block_bytes`."""
    t = tier_spec(spec)
    if t.gb * 1e9 < block_bytes:
        raise LlmcapError(f"--tier {spec}: {t.gb:g} GB holds no KV block of {block_bytes:,.0f} bytes")
    return tier_of(t.name, t.gb, t.gbps, t.lookup_ms, block_bytes)


def check_choices(o: EngineOptions) -> None:
    """The options' one-line errors that need no catalog (checked before any file is read)."""
    if o.router not in router_names():
        raise LlmcapError(f"--router must be one of {', '.join(router_names())}, got {o.router!r}")
    admission_option(o.admission_policy)
    queue_option(o.scheduling_policy)
    if o.first_token_from not in FIRST_TOKEN_FROM:
        raise LlmcapError(f"--first-token-from must be {' or '.join(FIRST_TOKEN_FROM)}, got {o.first_token_from!r}")
    parse_pd(o.pd)
    for spec in o.tiers:
        tier_spec(spec)


def step_model(model: str, gpu: str, tp: int, quant: str, kv_dtype: str) -> StepTimeModel:
    return perf.build_step_model(model, gpu, tp=tp, weight_quant=quant, kv_dtype=kv_dtype)


def _engine(
    spec: ModelSpec,
    g: GpuSpec,
    o: EngineOptions,
    tp: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    num_blocks: int | None,
) -> EngineConfig:
    """One replica's engine (KV blocks from the memory plan unless given)."""
    mem = MemoryParams(
        gpu_memory_utilization=o.gpu_memory_utilization,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
    )
    plan = plan_memory(spec, g, Parallelism(tp=tp), o.quant, o.kv_dtype, o.block_size, mem)
    blocks = num_blocks if num_blocks is not None else plan.kv_blocks_per_rank
    if blocks < 1:
        raise LlmcapError(f"{spec.name} does not fit on {g.name} with TP={tp}: no memory left for KV blocks")
    kv_bytes = spec.kv_bytes_per_token(kv_dtype_bytes(o.kv_dtype))
    return EngineConfig(
        num_blocks=blocks,
        block_size=o.block_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        enable_prefix_caching=o.prefix_caching,
        host_blocks=o.host_blocks,
        host_bandwidth_bytes_s=o.host_gbps * 1e9,
        kv_bytes_per_token=kv_bytes,
        tiers=tuple(parse_tier(t, kv_bytes * o.block_size) for t in o.tiers),
        max_model_len=o.max_model_len or spec.max_position_embeddings,
        admission_policy=o.admission_policy,
        scheduling_policy=o.scheduling_policy,
    )


def sim_config(
    spec: ModelSpec,
    g: GpuSpec,
    o: EngineOptions,
    *,
    reference: bool = False,
    resolution: float = 1.0,
    max_time: float | None = None,
) -> SimConfig:
    """The simulator's config of this deployment (KV blocks from the memory plan unless given)."""
    pools = parse_pd(o.pd)
    try:
        engine = _engine(spec, g, o, o.tp, o.max_num_seqs, o.max_num_batched_tokens, o.num_blocks)
        pd_cfg = None
        if pools is not None:
            link = LinkConfig(bandwidth_bytes_s=o.link_gbps * 1e9, latency_s=o.link_latency_ms / 1e3)
            decode = None
            if o.decode_differs:
                decode = _engine(
                    spec,
                    get_gpu(o.decode_gpu) if o.decode_gpu else g,
                    o,
                    o.decode_tp or o.tp,
                    o.decode_max_num_seqs or o.max_num_seqs,
                    o.decode_max_num_batched_tokens or o.max_num_batched_tokens,
                    o.decode_num_blocks,
                )
            pd_cfg = PDConfig(
                prefill_replicas=pools[0],
                decode_replicas=pools[1],
                link=link,
                first_token_from=o.first_token_from,
                decode_engine=decode,
            )
        return SimConfig(
            engine=engine,
            replicas=o.replicas,
            router=o.router,
            pd=pd_cfg,
            reference=reference,
            timeseries_resolution_s=resolution,
            max_time_s=max_time if max_time else math.inf,
        )
    except ValidationError as exc:
        err = exc.errors()[0]
        raise LlmcapError(f"invalid option {'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from None


def decode_step_model(model: str, gpu: str, o: EngineOptions) -> StepTimeModel | None:
    """P/D: the decode pool's step model when its GPU or TP differs from the prefill pool's (None: the same)."""
    if o.pd is None or (o.decode_gpu in (None, gpu) and o.decode_tp in (None, o.tp)):
        return None
    return step_model(model, o.decode_gpu or gpu, o.decode_tp or o.tp, o.quant, o.kv_dtype)


def deployment_label(cfg: SimConfig) -> str:
    return f"P/D {cfg.pd.prefill_replicas}:{cfg.pd.decode_replicas}" if cfg.pd else f"{cfg.replicas} replica(s)"


PRESET_FIELDS = (
    "admission_policy",
    "max_num_seqs",
    "max_num_batched_tokens",
    "block_size",
)  # what an engine preset sets


def with_preset(o: EngineOptions, preset: EnginePreset, given: set[str]) -> EngineOptions:
    """`o` with the engine's own defaults for every preset knob the user did not give (`given`: option names)."""
    return replace(o, **{name: getattr(preset, name) for name in PRESET_FIELDS if name not in given})
