"""Weight and KV-cache formats with their real storage overheads.

A quantized checkpoint is not params x bits/8: every format stores scales (and some zero points, group
indices or a per-tensor global scale) next to the packed values, and some layers stay in the model dtype.
`WeightFormat.tensor_bytes(out, in)` gives the bytes of one (out x in) linear weight as stored, using the
layouts the common checkpoints and vLLM kernels use:

| format       | values          | scales / extras                                                          |
|--------------|-----------------|--------------------------------------------------------------------------|
| bf16, fp16   | 2 B             | -                                                                        |
| fp8          | 1 B (e4m3)      | one fp32 scale per tensor                                                |
| fp8-channel  | 1 B             | one fp32 scale per output channel                                        |
| fp8-block    | 1 B             | one fp32 scale per 128x128 block (DeepSeek-V3 `weight_scale_inv`)        |
| int8         | 1 B             | one fp32 scale per output channel (W8A8 / W8A16 channel-wise)            |
| int4-awq     | 0.5 B, packed   | per group of G input channels: fp16 scale + packed int4 zero point       |
| int4-gptq    | 0.5 B, packed   | per group: fp16 scale + packed int4 zero point; int32 g_idx per input row |
| nvfp4        | 0.5 B (e2m1)    | fp8-e4m3 scale per 16 values + fp32 global scale and fp32 input scale    |
| mxfp4        | 0.5 B (e2m1)    | e8m0 (1 B) scale per 32 values                                           |

Group size defaults to 128 and can be given as a suffix: `int4-awq-g64`, `int4-gptq-g32`.
Which layers stay unquantized is a `QuantPolicy` (default: embeddings, lm_head, norms, biases, MoE router).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from llmcap.errors import LlmcapError

FP32 = 4
FP16 = 2


@dataclass(frozen=True)
class WeightFormat:
    name: str
    value_bits: int  # bits per stored weight value
    scheme: str  # "none", "tensor", "channel", "block", "group", "micro"
    group_size: int = 0  # input channels per group (group/micro schemes)
    block: tuple[int, int] = (0, 0)  # (out, in) tile for block scales
    scale_bytes: float = 0.0  # bytes per scale
    zero_bits: int = 0  # packed zero point bits per group (0: symmetric)
    g_idx: bool = False  # GPTQ stores an int32 group index per input row
    global_scale_bytes: int = 0  # per-tensor extra scales (nvfp4: weight_scale_2 + input_scale)

    @property
    def is_quantized(self) -> bool:
        return self.scheme != "none"

    def tensor_bytes(self, out_features: int, in_features: int) -> int:
        """Bytes of one stored (out x in) weight, scales and packing included."""
        n = out_features * in_features
        values = math.ceil(n * self.value_bits / 8)
        if self.scheme == "none":
            return values
        if self.scheme == "tensor":
            return values + FP32
        if self.scheme == "channel":
            return values + out_features * FP32
        if self.scheme == "block":
            bo, bi = self.block
            return values + math.ceil(out_features / bo) * math.ceil(in_features / bi) * FP32
        groups = out_features * math.ceil(in_features / self.group_size)
        extra = math.ceil(groups * self.scale_bytes) + math.ceil(groups * self.zero_bits / 8)
        if self.g_idx:
            extra += in_features * 4
        return values + extra + self.global_scale_bytes

    def bits_per_weight(self, out_features: int = 4096, in_features: int = 4096) -> float:
        """Effective stored bits per weight for a matrix of the given shape."""
        return 8 * self.tensor_bytes(out_features, in_features) / (out_features * in_features)


@dataclass(frozen=True)
class QuantPolicy:
    """Which components a weight format applies to. The defaults match common checkpoints (AWQ, GPTQ,
    FP8, NVFP4): embeddings, lm_head, norms, biases and the MoE router stay in the model dtype."""

    weights: WeightFormat
    quantize_embeddings: bool = False
    quantize_lm_head: bool = False
    unquantized_dtype_bytes: int = 2  # bf16 / fp16 for everything not quantized


def weight_format(name: str) -> WeightFormat:
    """Parse a weight-format name ('bf16', 'fp8-block', 'int4-awq-g64', 'nvfp4', ...)."""
    key = name.strip().lower().replace("_", "-")
    m = re.fullmatch(r"int4-(awq|gptq)(?:-g(\d+))?", key)
    if m:
        g = int(m.group(2) or 128)
        if g <= 0:
            raise LlmcapError(f"group size must be > 0 in '{name}'")
        return WeightFormat(
            name=f"int4-{m.group(1)}-g{g}",
            value_bits=4,
            scheme="group",
            group_size=g,
            scale_bytes=FP16,
            zero_bits=4,
            g_idx=m.group(1) == "gptq",
        )
    fixed = {
        "bf16": WeightFormat("bf16", 16, "none"),
        "bfloat16": WeightFormat("bf16", 16, "none"),
        "fp16": WeightFormat("fp16", 16, "none"),
        "float16": WeightFormat("fp16", 16, "none"),
        "fp8": WeightFormat("fp8", 8, "tensor"),
        "fp8-tensor": WeightFormat("fp8", 8, "tensor"),
        "fp8-channel": WeightFormat("fp8-channel", 8, "channel"),
        "fp8-block": WeightFormat("fp8-block", 8, "block", block=(128, 128)),
        "int8": WeightFormat("int8", 8, "channel"),
        "nvfp4": WeightFormat("nvfp4", 4, "micro", group_size=16, scale_bytes=1, global_scale_bytes=2 * FP32),
        "mxfp4": WeightFormat("mxfp4", 4, "micro", group_size=32, scale_bytes=1),
    }
    if key in fixed:
        return fixed[key]
    raise LlmcapError(f"unknown weight format '{name}'; known: {', '.join(WEIGHT_FORMAT_NAMES)}")


WEIGHT_FORMAT_NAMES = (
    "bf16",
    "fp16",
    "fp8",
    "fp8-channel",
    "fp8-block",
    "int8",
    "int4-awq",
    "int4-gptq",
    "int4-awq-g<N>",
    "int4-gptq-g<N>",
    "nvfp4",
    "mxfp4",
)

# KV-cache element sizes. fp8/int8 KV also keep per-tensor (per layer) scales: a few bytes, ignored.
KV_DTYPE_BYTES: dict[str, int] = {
    "bf16": 2,
    "bfloat16": 2,
    "fp16": 2,
    "float16": 2,
    "auto": 2,
    "fp8": 1,
    "fp8-e4m3": 1,
    "fp8-e5m2": 1,
    "int8": 1,
}


def kv_dtype_bytes(name: str) -> int:
    """Bytes per KV-cache element for a dtype name ('bf16', 'fp8', 'fp8_e4m3', 'int8')."""
    key = name.strip().lower().replace("_", "-")
    try:
        return KV_DTYPE_BYTES[key]
    except KeyError:
        raise LlmcapError(
            f"unknown KV cache dtype '{name}'; known: bf16, fp16, fp8, fp8_e4m3, fp8_e5m2, int8"
        ) from None
