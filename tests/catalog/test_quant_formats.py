"""Weight formats store scales, zero points and indices next to the values; bytes counted by hand."""

import pytest

from llmcap.catalog import kv_dtype_bytes, weight_format
from llmcap.errors import LlmcapError

N = 256 * 256


@pytest.mark.parametrize(
    "name,expected",
    [
        ("bf16", 2 * N),
        ("fp16", 2 * N),
        ("fp8", N + 4),  # one fp32 per-tensor scale
        ("fp8-channel", N + 256 * 4),  # fp32 per output channel
        ("int8", N + 256 * 4),
        ("int4-awq", N // 2 + 256 * 2 * 2 + 256 * 2 // 2),  # g128: 2 groups/row, fp16 scale + int4 zero
        ("int4-gptq", N // 2 + 256 * 2 * 2 + 256 * 2 // 2 + 256 * 4),  # + int32 g_idx per input row
        ("int4-awq-g64", N // 2 + 256 * 4 * 2 + 256 * 4 // 2),
        ("nvfp4", N // 2 + 256 * 16 * 1 + 8),  # fp8 scale per 16 values + two fp32 globals
        ("mxfp4", N // 2 + 256 * 8 * 1),  # e8m0 scale per 32 values
    ],
)
def test_square_matrix_bytes(name, expected):
    assert weight_format(name).tensor_bytes(256, 256) == expected


def test_fp8_block_scales_round_up_to_whole_tiles():
    # 256 x 300: 2 x 3 tiles of 128 x 128, one fp32 each
    assert weight_format("fp8-block").tensor_bytes(256, 300) == 256 * 300 + 2 * 3 * 4


def test_effective_bits_per_weight():
    assert weight_format("mxfp4").bits_per_weight(256, 256) == 4.25
    assert weight_format("nvfp4").bits_per_weight(256, 256) == (N // 2 + 4096 + 8) * 8 / N
    assert weight_format("int4-awq").bits_per_weight(256, 256) == (N // 2 + 1280) * 8 / N


def test_names_are_normalised():
    assert weight_format("INT4_AWQ").name == "int4-awq-g128"
    assert weight_format("bfloat16").name == "bf16"


def test_unknown_format_is_one_clear_error():
    with pytest.raises(LlmcapError, match="unknown weight format 'int3'.*nvfp4"):
        weight_format("int3")


def test_kv_dtypes():
    assert [kv_dtype_bytes(x) for x in ("bf16", "fp16", "fp8", "fp8_e4m3", "fp8_e5m2", "int8")] == [2, 2, 1, 1, 1, 1]
    with pytest.raises(LlmcapError, match="unknown KV cache dtype 'int4'"):
        kv_dtype_bytes("int4")
