"""A plan's summary.json record says where its P/D TTFT ends, whatever the library's default (`PlannedDeployment`)."""

from __future__ import annotations

import pytest

from llmcap.sim import EngineConfig, PDConfig, SimConfig
from llmcap.sizing.params import SloParams
from llmcap.sizing.planned import PlannedDeployment


def _plan(first_token_from: str, includes_handoff: bool) -> PlannedDeployment:
    config = SimConfig(
        engine=EngineConfig(num_blocks=100),
        pd=PDConfig(prefill_replicas=2, decode_replicas=3, first_token_from=first_token_from),
    )
    return PlannedDeployment("Llama-3.1-8B", 1.0, 0, config, {}, {}, SloParams(ttft_includes_handoff=includes_handoff))


@pytest.mark.parametrize(("first_token_from", "includes_handoff"), [("decode", True), ("prefill", False)])
def test_the_record_names_where_ttft_ends_and_reads_back(first_token_from: str, includes_handoff: bool) -> None:
    record = _plan(first_token_from, includes_handoff).to_dict()
    pd = record["sim_config"]["pd"]
    assert pd["first_token_from"] == first_token_from  # written even where it is the default
    assert list(pd) == [
        "prefill_replicas",
        "decode_replicas",
        "first_token_from",
    ]  # the model's field order, defaults left out
    again = PlannedDeployment.from_dict(record)
    assert again.config == _plan(first_token_from, includes_handoff).config


@pytest.mark.parametrize(("includes_handoff", "expected"), [(True, "decode"), (False, "prefill")])
def test_an_older_record_without_it_ends_ttft_where_its_slo_says(includes_handoff: bool, expected: str) -> None:
    # written when `prefill` was PDConfig's default and left out: the sizer always set the two together
    record = _plan(expected, includes_handoff).to_dict()
    del record["sim_config"]["pd"]["first_token_from"]
    planned = PlannedDeployment.from_dict(record)
    assert planned.config.pd is not None and planned.config.pd.first_token_from == expected
