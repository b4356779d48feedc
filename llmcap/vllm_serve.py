"""The chosen plan as `vllm serve` command lines: one per pool (one for an aggregated plan, a prefill and a
decode one for P/D), with the engine knobs the plan was sized with, so that the deployment serves what
was simulated.

    vllm serve MODEL --tensor-parallel-size 4 --max-num-seqs 256 --max-num-batched-tokens 2048 ...

What a flag cannot say is returned as a note beside the command: a weight format vLLM reads from a
pre-quantized checkpoint rather than quantizing online, and the P/D connector's own settings.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from llmcap.sizing.units import candidate_row

# vLLM quantizes these online from a 16-bit checkpoint (`--quantization fp8`: dynamic per-tensor/channel scales)
_ONLINE_QUANT = {"fp8": "fp8", "fp8-channel": "fp8"}
_DTYPE = {"bf16": "bfloat16", "fp16": "float16"}
_KV_CACHE_DTYPE = {
    "bf16": "auto",
    "bfloat16": "auto",
    "fp16": "auto",
    "float16": "auto",
    "fp8": "fp8",
    "fp8_e4m3": "fp8_e4m3",
    "fp8_e5m2": "fp8_e5m2",
}
# vLLM's NIXL connector, as in its disaggregated-serving examples: each instance both sends and receives KV
PD_KV_TRANSFER = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}


@dataclass(frozen=True)
class ServeCommand:
    pool: str  # "instances" (aggregated), "prefill" or "decode"
    instances: int
    gpus_per_instance: int
    argv: list[str]
    notes: list[str] = field(default_factory=list)

    @property
    def shell(self) -> str:
        return shlex.join(self.argv)

    def to_dict(self) -> dict[str, Any]:
        return {
            "pool": self.pool,
            "instances": self.instances,
            "gpus_per_instance": self.gpus_per_instance,
            "argv": self.argv,
            "command": self.shell,
            "notes": self.notes,
        }


def serve_argv(
    row: Mapping[str, Any],
    model: str,
    gpu_memory_utilization: float,
    disaggregated: bool = False,
    lora: tuple[int, int] = (0, 16),
) -> tuple[list[str], list[str]]:
    """`vllm serve` arguments for one candidate row of the candidates table, and the notes that go with them;
    `lora`: (adapter slots, max rank) the memory plan reserved (0 slots: no LoRA)."""
    notes: list[str] = []
    argv = ["vllm", "serve", model, "--tensor-parallel-size", str(int(row["tp"]))]
    if int(row["pp"]) > 1:
        argv += ["--pipeline-parallel-size", str(int(row["pp"]))]
    if int(row["ep"]) > 1:
        argv += ["--enable-expert-parallel"]
    quant = str(row["weight_quant"])
    if quant in _DTYPE:
        argv += ["--dtype", _DTYPE[quant]]
    elif quant in _ONLINE_QUANT:
        argv += ["--quantization", _ONLINE_QUANT[quant]]
    else:
        notes.append(
            f"weights {quant}: serve a checkpoint quantized as {quant} (vLLM reads the method from its config)"
        )
    kv = str(row["kv_dtype"])
    if kv in _KV_CACHE_DTYPE:
        argv += ["--kv-cache-dtype", _KV_CACHE_DTYPE[kv]]
    else:
        notes.append(f"KV cache {kv}: no vLLM --kv-cache-dtype matches; the plan's KV capacity assumes {kv}")
    argv += [
        "--max-num-seqs",
        str(int(row["max_num_seqs"])),
        "--max-num-batched-tokens",
        str(int(row["max_num_batched_tokens"])),
        "--block-size",
        str(int(row["block_size"])),
        "--max-model-len",
        str(int(row["max_context_len"])),
        "--gpu-memory-utilization",
        f"{gpu_memory_utilization:g}",
    ]
    if lora[0] > 0:
        argv += ["--enable-lora", "--max-loras", str(lora[0]), "--max-lora-rank", str(lora[1])]
    if disaggregated:
        argv += ["--kv-transfer-config", json.dumps(PD_KV_TRANSFER, separators=(",", ":"))]
    return argv, notes


def serve_commands(
    summary: Mapping[str, Any],
    candidates: pd.DataFrame,
    model: str,
    gpu_memory_utilization: float,
    lora: tuple[int, int] = (0, 16),
) -> list[ServeCommand]:
    """One command per pool of the plan in `summary` (the size summary: `mode`, `pool_plans`), each pool's
    configuration looked up by its key and role in the candidates table."""
    disaggregated = summary["mode"] == "disaggregated"
    out = []
    for pool, plan in summary["pool_plans"].items():
        row = candidate_row(candidates, str(plan["configuration"]), (pool,) if disaggregated else ("both",))
        argv, notes = serve_argv(row, model, gpu_memory_utilization, disaggregated, lora)
        if disaggregated:
            notes.append(
                "P/D: put a proxy in front that sends each request to a prefill instance, then to a decode one "
                "(vLLM's disaggregated-serving examples); the KV connector's side channel needs its own port per instance"
            )
        out.append(ServeCommand(pool, int(plan["instances"]), int(plan["gpus_per_instance"]), argv, notes))
    return out
