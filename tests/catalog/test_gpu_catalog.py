"""GPU catalog: the YAML validates, units convert as documented, lookup is forgiving, errors are clear."""

from pathlib import Path

import pytest

from llmcap.catalog import get_gpu, load_gpu_catalog
from llmcap.catalog.gpus import default_catalog_dir
from llmcap.errors import InputFileError, LlmcapError

REQUIRED = [
    "H100-SXM-80GB",
    "H200-SXM-141GB",
    "B200-SXM-180GB",
    "A100-SXM-80GB",
    "L40S-48GB",
    "MI300X-192GB",
    "H20-96GB",
]


def test_catalog_has_the_required_gpus_in_file_order():
    assert load_gpu_catalog().names == REQUIRED


def test_every_section_names_a_source():
    for gpu in load_gpu_catalog().gpus:
        assert set(gpu.sources) == {"memory", "compute", "interconnect", "cost"}
        assert all(s for s in gpu.sources.values()), gpu.name


def test_units_are_converted_to_si():
    h100 = get_gpu("H100-SXM-80GB")
    assert h100.hbm_bytes == 81559 * 2**20  # nvidia-smi memory.total, MiB
    assert h100.hbm_bandwidth_bytes_s == 3350e9
    assert h100.peak_flops("bf16") == 989.5e12  # dense, half the datasheet's sparse 1,979
    assert h100.peak_flops("fp8") == 1979e12
    assert h100.scale_up_bytes_s == 900e9
    assert h100.nic_bytes_s == 400e9 / 8
    assert h100.gpus_per_node == 8
    assert get_gpu("mi300x").hbm_bytes == 206158430208  # rocm-smi VRAM Total Memory (B)


def test_fp4_only_where_the_hardware_has_it():
    assert get_gpu("b200").peak_flops("fp4") == 9000e12
    with pytest.raises(LlmcapError, match="lists no fp4"):
        get_gpu("h100").peak_flops("fp4")
    with pytest.raises(LlmcapError, match="lists no fp8"):
        get_gpu("a100").peak_flops("fp8")


def test_pcie_card_has_no_scale_up():
    l40s = get_gpu("l40s")
    assert l40s.scale_up is None and l40s.scale_up_bytes_s is None


@pytest.mark.parametrize("alias", ["h100", "H100", "H100-SXM", "h100_sxm5", "h100 sxm", "H100-SXM-80GB"])
def test_lookup_is_case_and_punctuation_insensitive(alias):
    assert get_gpu(alias).name == "H100-SXM-80GB"


def test_unknown_gpu_lists_known_names():
    with pytest.raises(LlmcapError) as exc:
        get_gpu("tpu-v5e")
    msg = str(exc.value)
    assert "unknown GPU 'tpu-v5e'" in msg
    assert all(n in msg for n in REQUIRED)


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "gpus.yaml"
    p.write_text(text)
    return p


def test_invalid_yaml_names_file_and_line(tmp_path):
    p = _write(tmp_path, "gpus:\n  - name: [unclosed\n")
    with pytest.raises(InputFileError) as exc:
        load_gpu_catalog(p)
    assert exc.value.path == str(p) and exc.value.line is not None


def test_schema_error_names_the_field(tmp_path):
    good = (default_catalog_dir() / "gpus.yaml").read_text()
    bad = good.replace("bandwidth_gb_s: 3350", "bandwidth_gb_s: fast", 1)
    with pytest.raises(InputFileError) as exc:
        load_gpu_catalog(_write(tmp_path, bad))
    assert exc.value.field == "gpus.0.memory.bandwidth_gb_s"


def test_missing_source_is_rejected(tmp_path):
    good = (default_catalog_dir() / "gpus.yaml").read_text()
    bad = good.replace("      source: https://www.nvidia.com/en-us/data-center/h100/\n", "", 1)
    with pytest.raises(InputFileError) as exc:
        load_gpu_catalog(_write(tmp_path, bad))
    assert exc.value.field == "gpus.0.memory.source"


def test_duplicate_alias_is_rejected(tmp_path):
    good = (default_catalog_dir() / "gpus.yaml").read_text()
    bad = good.replace("aliases: [h200,", "aliases: [h100, h200,", 1)
    with pytest.raises(InputFileError, match="used by both"):
        load_gpu_catalog(_write(tmp_path, bad))
