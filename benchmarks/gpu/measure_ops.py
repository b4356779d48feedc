"""Time the roofline's operations on the GPU this runs on: the calibration set of `llmcap.perf.calibration`.

Standalone (PyTorch only; no llmcap import), so it runs on a bare GPU machine:

    python benchmarks/gpu/measure_ops.py --out h200.json

What it times, each as the median of `REPEATS` CUDA-event timings of a CUDA graph of back-to-back calls
(as an engine replays its steps; `timed` says why a graph):
- `gemm`: the linear layers of the dense models in `MODELS` (their config.json in the catalog) per
  tensor-parallel degree: qkv, o, gate_up, down, with T rows (tokens) from 1 to 8192, in bf16 and fp8
  (torch._scaled_mm, per-tensor scales, bf16 out: what vLLM's fp8 linear layers run). Weights rotate over
  enough copies to be several times the L2 cache, so a small GEMM reads HBM as it does in an engine.
- `attn_prefill`: causal self-attention (scaled_dot_product_attention, bf16, head dim 128) over T tokens.
- `attn_decode`: one query token per sequence over a context of C cached tokens, B sequences, grouped
  query heads: the KV read that bounds decoding.
- `copy`: a device-to-device copy of 2 GiB: the HBM bandwidth a streaming kernel reaches.
Each row carries the FLOPs and HBM bytes the roofline counts for it, so a fit needs nothing else.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]
MODELS = ("Llama-3.1-8B", "Llama-3.1-70B")
TPS = (1, 2, 4, 8)
ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
PREFILL_TOKENS = (256, 512, 1024, 2048, 4096, 8192, 16384)
PREFILL_HEADS = 32
HEAD_DIM = 128
DECODE_BATCH = (1, 8, 32, 128)
DECODE_CONTEXT = (512, 2048, 8192, 32768)
DECODE_HEADS = (32, 8)  # query heads, KV heads (Llama-3.1-8B at TP1)
MAX_DECODE_TOKENS = 1 << 20  # B x C: 4 GiB of bf16 KV at 8 KV heads
COPY_BYTES = 2 << 30
ROTATE_BYTES = 512 << 20  # weights rotated per GEMM: ~8x the 60 MB L2 of an H200
REPEATS = 5
LOOP_S = 0.004  # each timing loops for about this long


def timed(call, repeats: int = REPEATS, graph: bool = True) -> tuple[float, int]:
    """(median seconds per call, calls per timing): CUDA events around the replay of a CUDA graph of
    back-to-back calls. A graph, as vLLM runs its decode steps: timed from Python, a small kernel would
    measure the ~15-20 us it takes Python and PyTorch to launch one, not the GPU. `graph=False` times the
    calls as launched (a device copy: captured, it becomes a copy-engine node, slower than the SMs' copy)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (cuBLAS picks and caches its kernel) off the capture stream
        for i in range(3):
            call(i)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    call(1)
    torch.cuda.synchronize()
    once = max(time.perf_counter() - t0, 1e-6)  # an upper bound (launch included): sizes the graph
    iters = max(3, min(1000, int(LOOP_S / once)))

    def loop() -> None:
        for i in range(iters):
            call(i)

    run = loop
    if graph:
        captured = torch.cuda.CUDAGraph()
        with torch.cuda.graph(captured):
            loop()
        run = captured.replay
    run()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / iters)
    times.sort()
    return times[len(times) // 2], iters


def linear_shapes(cfg: dict, tp: int) -> dict[str, tuple[int, int]]:
    """(N, K) of each linear layer of one decoder layer on one of `tp` ranks (weights stored N x K)."""
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or h // heads
    return {
        "qkv": ((heads + 2 * kv) * d // tp, h),
        "o": (h, heads * d // tp),
        "gate_up": (2 * inter // tp, h),
        "down": (h, inter // tp),
    }


def gemm_rows(model: str, cfg: dict) -> list[dict]:
    rows = []
    dev = torch.device("cuda")
    for tp in TPS:
        for layer, (n, k) in linear_shapes(cfg, tp).items():
            for dtype in ("bf16", "fp8"):
                elem = 2 if dtype == "bf16" else 1
                copies = max(1, -(-ROTATE_BYTES // (n * k * elem)))
                w = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
                if dtype == "fp8":
                    w = [x.to(torch.float8_e4m3fn) for x in w]
                one = torch.ones((), device=dev, dtype=torch.float32)
                for m in ROWS:
                    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                    if dtype == "bf16":

                        def call(i, x=x, w=w, copies=copies):
                            return x @ w[i % copies].t()
                    else:
                        x = x.to(torch.float8_e4m3fn)

                        def call(i, x=x, w=w, copies=copies, one=one):
                            return torch._scaled_mm(
                                x, w[i % copies].t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16
                            )

                    try:
                        t, iters = timed(call)
                    except RuntimeError as e:  # a shape the fp8 kernel refuses: recorded, not timed
                        rows.append(
                            {
                                "op": "gemm",
                                "dtype": dtype,
                                "model": model,
                                "tp": tp,
                                "layer": layer,
                                "m": m,
                                "n": n,
                                "k": k,
                                "error": str(e).splitlines()[0][:200],
                            }
                        )
                        continue
                    rows.append(
                        {
                            "op": "gemm",
                            "dtype": dtype,
                            "model": model,
                            "tp": tp,
                            "layer": layer,
                            "m": m,
                            "n": n,
                            "k": k,
                            "time_s": t,
                            "iters": iters,
                            "flops": 2.0 * m * n * k,
                            "bytes": float(n * k * elem + m * k * elem + m * n * 2),
                        }
                    )
                del w
                torch.cuda.empty_cache()
    return rows


def prefill_rows() -> list[dict]:
    rows = []
    for t_tok in PREFILL_TOKENS:
        q, k, v = (
            torch.randn(1, PREFILL_HEADS, t_tok, HEAD_DIM, device="cuda", dtype=torch.bfloat16) for _ in range(3)
        )
        t, iters = timed(lambda i, q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        pairs = t_tok * (t_tok + 1) / 2  # causal (query, key) pairs
        rows.append(
            {
                "op": "attn_prefill",
                "dtype": "bf16",
                "tokens": t_tok,
                "heads": PREFILL_HEADS,
                "head_dim": HEAD_DIM,
                "pairs": pairs,
                "time_s": t,
                "iters": iters,
                "flops": 4.0 * pairs * PREFILL_HEADS * HEAD_DIM,
                "bytes": 4.0 * t_tok * PREFILL_HEADS * HEAD_DIM * 2,
            }
        )
    return rows


def decode_rows() -> list[dict]:
    rows = []
    hq, hkv = DECODE_HEADS
    for b in DECODE_BATCH:
        for c in DECODE_CONTEXT:
            if b * c > MAX_DECODE_TOKENS:
                continue
            q = torch.randn(b, hq, 1, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
            k, v = (torch.randn(b, hkv, c, HEAD_DIM, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            t, iters = timed(lambda i, q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
            rows.append(
                {
                    "op": "attn_decode",
                    "dtype": "bf16",
                    "batch": b,
                    "context": c,
                    "q_heads": hq,
                    "kv_heads": hkv,
                    "head_dim": HEAD_DIM,
                    "time_s": t,
                    "iters": iters,
                    "flops": 4.0 * b * c * hq * HEAD_DIM,
                    "bytes": 2.0 * b * c * hkv * HEAD_DIM * 2,
                }
            )
            del q, k, v
            torch.cuda.empty_cache()
    return rows


def copy_rows() -> list[dict]:
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t, iters = timed(lambda i: dst.copy_(src), graph=False)
    return [{"op": "copy", "dtype": "u8", "time_s": t, "iters": iters, "flops": 0.0, "bytes": 2.0 * COPY_BYTES}]


def environment() -> dict:
    props = torch.cuda.get_device_properties(0)
    smi = subprocess.run(
        [
            "nvidia-smi",
            "--query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem",
            "--format=csv,noheader",
        ],
        capture_output=True,
        text=True,
    )
    return {
        "device": torch.cuda.get_device_name(0),
        "multiprocessors": props.multi_processor_count,
        "memory_bytes": props.total_memory,
        "nvidia_smi": smi.stdout.strip(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    started = time.perf_counter()
    rows = copy_rows() + prefill_rows() + decode_rows()
    for model in MODELS:
        cfg = json.loads((REPO / "llmcap" / "catalog" / "data" / "models" / model / "config.json").read_text())
        rows += gemm_rows(model, cfg)
        print(
            f"{model}: {sum(r.get('model') == model for r in rows)} GEMM rows, {time.perf_counter() - started:.0f} s",
            flush=True,
        )
    doc = {"environment": environment(), "script": "benchmarks/gpu/measure_ops.py", "repeats": REPEATS, "rows": rows}
    args.out.write_text(json.dumps(doc, indent=1))
    print(f"{len(rows)} rows in {time.perf_counter() - started:.0f} s -> {args.out}")


if __name__ == "__main__":
    main()
