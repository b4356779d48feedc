"""Convert the per-operation timings that ship in NVIDIA's `aiconfigurator-core` wheel (Apache-2.0) into
calibration sets (the ops.json format of measure_ops.py) for the catalog GPUs it covers.

    python -m pip download aiconfigurator-core==0.12.0 --no-deps -d /tmp/aic
    python benchmarks/gpu/import_aiconfigurator.py /tmp/aic/aiconfigurator_core-0.12.0-*.whl
    llmcap calibrate llmcap/catalog/data/calibration/H100-SXM-80GB/ops.json --gpu h100 --write   # per GPU

The wheel times each operation with the kernels an engine runs (here vLLM's: its GEMM backends, its
FlashAttention / FlashInfer builds, its custom all-reduce in CUDA-graph mode), per GPU system. A subset is
kept, chosen to span what the roofline models and no more: GEMMs with 1-8192 rows over a grid of weight
shapes in bf16 and per-tensor fp8, causal prefill attention and one-token decode attention at the head
layouts of Llama-3.1-70B sharded over TP 1/2/4/8 (head dim 128, bf16 KV, no window), and all-reduces over
2/4/8 GPUs of one node. Each row carries the FLOPs and bytes the roofline counts for it and names its
source (file inside the wheel, its sha256, engine version, kernel, URL and licence).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import zipfile
from pathlib import Path

import pandas as pd

PACKAGE = "aiconfigurator-core"
PACKAGE_URL = "https://pypi.org/project/aiconfigurator-core/{version}/"
LICENCE = "Apache-2.0"
CALIBRATION_DIR = Path(__file__).resolve().parents[2] / "llmcap" / "catalog" / "data" / "calibration"
# catalog GPU name -> the wheel's system folder (MI300X and H20 have none)
SYSTEMS = {
    "H100-SXM-80GB": "h100_sxm",
    "H200-SXM-141GB": "h200_sxm",
    "B200-SXM-180GB": "b200_sxm",
    "A100-SXM-80GB": "a100_sxm",
    "L40S-48GB": "l40s",
}
ENGINE = "vllm"
GEMM_DTYPES = {"bfloat16": ("bf16", 2), "fp8": ("fp8", 1)}  # wheel dtype -> (roofline dtype, weight/input bytes)
GEMM_KERNELS = ("torch.nn.functional.linear", "CutlassFP8ScaledMMLinearKernel", "vllm_default")
GEMM_NK = (1024, 2048, 4096, 8192, 16384)
GEMM_M = tuple(2**i for i in range(14))  # 1 .. 8192 rows
HEAD_DIM = 128
HEADS = ((64, 8), (32, 4), (16, 2), (8, 1))  # Llama-3.1-70B's (query, KV) heads on one rank at TP 1/2/4/8
MAX_PREFILL_TOKENS = 32768
MAX_DECODE_CONTEXT = 2**21  # cached tokens over the batch
# the attention build vLLM picks on each architecture, first found wins
ATTENTION_KERNELS = (
    "vllm_flash_attn_fa3",
    "vllm_flash_attn",
    "vllm_flash_attn_fa2",
    "vllm_flashinfer_trtllmprefill",
    "vllm_flashinfer_trtllmdecode",
)
ALLREDUCE_BACKEND = "vllm_graph"
ACT_BYTES = 2  # bf16 activations and KV


class Wheel:
    """The wheel (or its unpacked folder): read files by their path inside it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.zip = zipfile.ZipFile(path) if path.is_file() else None
        names = self.zip.namelist() if self.zip else [str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()]
        self.names = sorted(names)
        meta = next(n for n in self.names if n.endswith(".dist-info/METADATA"))
        self.version = next(
            line.split(":", 1)[1].strip()
            for line in self.read(meta).decode().splitlines()
            if line.startswith("Version:")
        )

    def read(self, name: str) -> bytes:
        return self.zip.read(name) if self.zip else (self.path / name).read_bytes()

    def newest(self, system: str, op_dir: str, filename: str) -> str | None:
        """The wheel path of `filename` for the engine's newest version that has it."""
        prefix = f"aiconfigurator_core/systems/data/{system}/{op_dir}/{ENGINE}/"
        found = [n for n in self.names if n.startswith(prefix) and n.endswith("/" + filename)]
        return max(
            found,
            key=lambda n: tuple(int(p) if p.isdigit() else 0 for p in n[len(prefix) :].split("/")[0].split(".")),
            default=None,
        )


def _source(wheel: Wheel, name: str, frame: pd.DataFrame, kernel: str) -> dict:
    return {
        "url": PACKAGE_URL.format(version=wheel.version),
        "licence": LICENCE,
        "package": f"{PACKAGE} {wheel.version}",
        "file": name,
        "sha256": hashlib.sha256(wheel.read(name)).hexdigest(),
        "engine": f"{ENGINE} {name.split('/')[-2]}",
        "kernel": kernel,
        "device": str(frame["device"].iloc[0]),
    }


def gemm_rows(frame: pd.DataFrame, source: str) -> list[dict]:
    rows = []
    keep = frame[
        frame.kernel_source.isin(GEMM_KERNELS)
        & frame.gemm_dtype.isin(list(GEMM_DTYPES))
        & frame.m.isin(GEMM_M)
        & frame.n.isin(GEMM_NK)
        & frame.k.isin(GEMM_NK)
    ]
    for r in keep.sort_values(["gemm_dtype", "n", "k", "m"]).itertuples():
        dtype, elem = GEMM_DTYPES[r.gemm_dtype]
        m, n, k = int(r.m), int(r.n), int(r.k)
        rows.append(
            {
                "op": "gemm",
                "dtype": dtype,
                "m": m,
                "n": n,
                "k": k,
                "group": f"gemm {dtype} n={n} k={k}",
                "time_s": float(r.latency) * 1e-3,
                "flops": 2.0 * m * n * k,
                "bytes": float(n * k * elem + m * k * elem + m * n * ACT_BYTES),
                "source": source,
            }
        )
    return rows


def _attention(frame: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    kernel = next(k for k in ATTENTION_KERNELS if (frame.kernel_source == k).any())
    frame = frame.assign(
        **{c: frame.get(c, 0 if c == "window_size" else 1) for c in ("window_size", "beam_width")}
    )  # older sets lack them
    heads = pd.Series(list(zip(frame.num_heads, frame.num_key_value_heads, strict=True)), index=frame.index).isin(HEADS)
    keep = frame[
        (frame.kernel_source == kernel)
        & heads
        & (frame.head_dim == HEAD_DIM)
        & (frame.kv_cache_dtype == "bfloat16")
        & (frame.window_size == 0)
        & (frame.beam_width == 1)
    ]
    return keep, kernel


def _per_token_bytes(hq: int, hkv: int) -> tuple[float, float]:
    """(KV bytes a token adds, bytes a new token costs: its KV written, its query read, its output written)."""
    kv = 2.0 * hkv * HEAD_DIM * ACT_BYTES
    return kv, kv + 2.0 * hq * HEAD_DIM * ACT_BYTES


def prefill_rows(frame: pd.DataFrame, source: str) -> list[dict]:
    rows = []
    for r in (
        frame[frame.batch_size * frame.isl <= MAX_PREFILL_TOKENS]
        .sort_values(["num_heads", "isl", "batch_size"])
        .itertuples()
    ):
        b, s, hq, hkv = int(r.batch_size), int(r.isl), int(r.num_heads), int(r.num_key_value_heads)
        tokens, pairs = b * s, b * s * (s + 1) / 2
        rows.append(
            {
                "op": "attn_prefill",
                "dtype": "bf16",
                "batch": b,
                "isl": s,
                "tokens": tokens,
                "q_heads": hq,
                "kv_heads": hkv,
                "head_dim": HEAD_DIM,
                "pairs": pairs,
                "group": f"attn_prefill heads={hq}/{hkv} isl={s}",
                "time_s": float(r.latency) * 1e-3,
                "flops": 4.0 * pairs * hq * HEAD_DIM,
                "bytes": tokens * _per_token_bytes(hq, hkv)[1],
                "source": source,
            }
        )
    return rows


def decode_rows(frame: pd.DataFrame, source: str) -> list[dict]:
    rows = []
    frame = frame.assign(context=frame.isl + frame.step)  # cached tokens a sequence attends to
    for r in (
        frame[frame.batch_size * frame.context <= MAX_DECODE_CONTEXT]
        .sort_values(["num_heads", "batch_size", "context"])
        .itertuples()
    ):
        b, c, hq, hkv = int(r.batch_size), int(r.context), int(r.num_heads), int(r.num_key_value_heads)
        kv, new = _per_token_bytes(hq, hkv)
        rows.append(
            {
                "op": "attn_decode",
                "dtype": "bf16",
                "batch": b,
                "context": c,
                "q_heads": hq,
                "kv_heads": hkv,
                "head_dim": HEAD_DIM,
                "group": f"attn_decode heads={hq}/{hkv} B={b}",
                "time_s": float(r.latency) * 1e-3,
                "flops": 4.0 * b * c * hq * HEAD_DIM,
                "bytes": b * c * kv + b * new,
                "source": source,
            }
        )
    return rows


def allreduce_rows(frame: pd.DataFrame, source: str) -> list[dict]:
    keep = frame[(frame.backend == ALLREDUCE_BACKEND) & (frame.allreduce_dtype == "bfloat16")]
    return [
        {
            "op": "allreduce",
            "dtype": "bf16",
            "ranks": int(r.num_gpus),
            "elements": int(r.message_size),
            "group": f"allreduce {int(r.num_gpus)} GPUs",
            "time_s": float(r.latency) * 1e-3,
            "flops": 0.0,
            "bytes": float(r.message_size) * ACT_BYTES,
            "source": source,
        }
        for r in keep.sort_values(["num_gpus", "message_size"]).itertuples()
    ]


PARTS = (
    ("gemm", "gemm_perf.parquet", gemm_rows),
    ("attention", "context_attention_perf.parquet", prefill_rows),
    ("attention", "generation_attention_perf.parquet", decode_rows),
    ("comm", "custom_allreduce_perf.parquet", allreduce_rows),
)


def calibration_set(wheel: Wheel, system: str) -> dict:
    sources: dict[str, dict] = {}
    rows: list[dict] = []
    for op_dir, filename, convert in PARTS:
        name = wheel.newest(system, op_dir, filename)
        if name is None:
            continue
        frame = pd.read_parquet(io.BytesIO(wheel.read(name)))
        kernel = (
            ALLREDUCE_BACKEND if op_dir == "comm" else ", ".join(sorted(set(frame.kernel_source) & set(GEMM_KERNELS)))
        )
        if op_dir == "attention":
            frame, kernel = _attention(frame)
        key = f"{system}/{filename.removesuffix('_perf.parquet')}"
        sources[key] = _source(wheel, name, frame, kernel)
        rows += convert(frame, key)
    devices = sorted({s["device"] for s in sources.values()})
    return {
        "environment": {"device": " / ".join(devices), "source": f"{PACKAGE} {wheel.version} ({LICENCE}), {system}"},
        "script": "benchmarks/gpu/import_aiconfigurator.py",
        "sources": sources,
        "rows": rows,
    }


def write(doc: dict, path: Path) -> None:
    """One row per line: the file stays diffable and small."""
    head = json.dumps({k: v for k, v in doc.items() if k != "rows"}, indent=1)[:-2]
    body = ",\n".join("  " + json.dumps(r, sort_keys=False) for r in doc["rows"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'{head},\n "rows": [\n{body}\n ]\n}}\n')


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("wheel", type=Path, help="aiconfigurator_core-*.whl or its unpacked folder")
    ap.add_argument(
        "--out", type=Path, default=CALIBRATION_DIR, help="one <GPU>/ops.json per catalog GPU under this folder"
    )
    args = ap.parse_args()
    wheel = Wheel(args.wheel)
    for gpu, system in SYSTEMS.items():
        doc = calibration_set(wheel, system)
        write(doc, args.out / gpu / "ops.json")
        counts = pd.Series([r["op"] for r in doc["rows"]]).value_counts().to_dict()
        print(f"{gpu}: {len(doc['rows'])} rows from {system} {counts}")


if __name__ == "__main__":
    main()
