"""The workload's ISL + OSL sizes the enumeration: context-length columns, max context, params.yaml's section."""

import pytest

from llmcap.candidates import EnumerationSpec, ParallelGrid, enumerate_candidates, workload_context_lengths
from llmcap.catalog import load_model
from llmcap.config import EnumerateParams, load_params
from llmcap.errors import InputFileError, LlmcapError
from tests.conftest import ROOT

WORKLOAD = {
    "isl": {"mean": 3000.2, "p50": 2000.0, "p90": 7000.0, "p99.9": 15000.5, "min": 10.0, "max": 30000.0},
    "osl": {"mean": 300.0, "p50": 250.0, "p90": 600.0, "p99.9": 1100.0, "min": 1.0, "max": 2000.0},
}


def test_context_lengths_add_isl_and_osl_statistics():
    assert workload_context_lengths(WORKLOAD) == {"mean": 3301, "p50": 2250, "p90": 7600, "p99_9": 16101, "max": 32000}


def test_a_summary_without_lengths_is_one_clear_error():
    with pytest.raises(LlmcapError, match="no usable ISL/OSL statistics"):
        workload_context_lengths({"rows": 3})


def test_concurrency_columns_follow_the_kv_capacity():
    spec = EnumerationSpec(
        gpus=["h100"], parallel=ParallelGrid(tp=[2, 4, 8]), modes=["aggregated"], max_context_len=8192
    )
    res = enumerate_candidates(load_model("Llama-3.1-70B"), spec, {"p50": 2250, "long": 100_000})
    t = res.table
    assert list(t.columns[t.columns.get_loc("max_seqs_at_max_context") + 1 :][:2]) == ["max_seqs_p50", "max_seqs_long"]
    blocks = t["kv_tokens_per_instance"] // 16
    assert list(t["max_seqs_p50"]) == [min(int(b // 141), 256) for b in blocks]  # ceil(2250 / 16) = 141 blocks
    assert list(t["max_seqs_long"]) == [int(b // 6250) for b in blocks]
    assert res.summary["context_lengths"] == {"p50": 2250, "long": 100_000}


def test_bad_context_labels_are_rejected():
    with pytest.raises(LlmcapError, match="labels are"):
        enumerate_candidates(load_model("Llama-3.1-8B"), EnumerationSpec(), {"P 50": 100})


def test_params_yaml_enumerate_section():
    p = load_params(ROOT / "params.yaml").enumerate
    assert isinstance(p, EnumerationSpec) and p.model == "Llama-3.1-70B"
    load_model(p.model)  # a shipped catalog model
    grid = p.grid(WORKLOAD)
    assert type(grid) is EnumerationSpec and grid.max_context_len == 32_000
    assert grid.gpus == p.gpus and grid.memory == p.memory


def test_max_context_len_choices():
    assert EnumerateParams(max_context_len=8192).grid().max_context_len == 8192
    assert EnumerateParams(max_context_len="model").grid().max_context_len is None
    with pytest.raises(LlmcapError, match="no workload summary"):
        EnumerateParams().grid()


@pytest.mark.parametrize(
    ("section", "field"),
    [
        ({"max_context_len": 0}, "enumerate.max_context_len"),
        ({"gpus": []}, "enumerate.gpus"),
        ({"parallel": {"tq": [2]}}, "enumerate.parallel.tq"),
        ({"memory": {"gpu_memory_utilization": 1.5}}, "enumerate.memory.gpu_memory_utilization"),
    ],
)
def test_bad_enumerate_params_name_the_field(tmp_path, section, field):
    import yaml

    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"trace": {"file": "x.jsonl"}, "enumerate": section}))
    with pytest.raises(InputFileError, match=f"field '{field}'"):
        load_params(path)
