"""max_tokens in each reader that has it: guidellm's request data (its output count is the max_tokens it sends),
OpenAI-style request logs (the body's `max_tokens` or `max_completion_tokens`, nested objects by dotted names), and
vLLM bench's saved results, which keep no cap (unknown, and the plan says what it assumed instead)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmcap.errors import InputFileError
from llmcap.planning import reservation_note
from llmcap.trace import ingest
from llmcap.trace.params import TraceParams

VLLM_BENCH = Path(__file__).parents[1] / "fixtures" / "vllm_bench" / "vllm-0.32.0-cpu-tiny-llama-random.json"


def _jsonl(path: Path, records: list[dict | str]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def test_guidellm_sends_its_output_count_as_max_tokens(tmp_path) -> None:
    # guidellm formats each request with max_tokens = output_tokens_count and ignore_eos: the cap is the output
    rows = [
        {"prompt": "p" * 40, "prompt_tokens_count": 10 * (i + 1), "output_tokens_count": 7 * (i + 1)} for i in range(4)
    ]
    result = ingest(_jsonl(tmp_path / "guidellm.jsonl", rows))
    assert result.report.source_format == "guidellm"
    assert result.trace.column("max_tokens").to_pylist() == result.trace.column("osl").to_pylist() == [7, 14, 21, 28]


def _logged(i: int, cap: dict, model: str = "chat") -> dict:
    """One line of a gateway's request log: the OpenAI request body and the response with its usage."""
    return {
        "timestamp": 1_733_000_000.0 + i,
        "request": {"model": model, "messages": [{"role": "user", "content": "hi"}], **cap},
        "response": {
            "object": "chat.completion",
            "usage": {"prompt_tokens": 100 + i, "completion_tokens": 10 + i, "total_tokens": 110 + 2 * i},
        },
    }


LOG_COLUMNS = {
    "isl": "response.usage.prompt_tokens",
    "osl": "response.usage.completion_tokens",
    "model": "request.model",
}


@pytest.mark.parametrize("name", ["max_completion_tokens", "max_tokens"])
def test_an_openai_request_log_states_the_cap_under_either_name(tmp_path, name) -> None:
    # the third request states no cap (null); the cap column is found by its name, not mapped
    path = _jsonl(tmp_path / "log.jsonl", [_logged(0, {name: 64}), _logged(1, {name: 11}), _logged(2, {})])
    result = ingest(path, TraceParams(file=str(path), columns=LOG_COLUMNS))
    t = result.trace.to_pydict()
    assert (t["isl"], t["osl"], t["max_tokens"], t["model"]) == (
        [100, 101, 102],
        [10, 11, 12],
        [64, 11, None],
        ["chat"] * 3,
    )
    assert t["arrival_s"] == [0.0, 1.0, 2.0] and result.report.arrival_column == "timestamp"


def test_a_malformed_line_leaves_the_nested_fields_readable(tmp_path) -> None:
    # one line that is not JSON sends the file down the line-by-line path, which follows the dotted names too
    path = _jsonl(
        tmp_path / "log.jsonl",
        [_logged(0, {"max_completion_tokens": 64}), "{not json", _logged(2, {"max_completion_tokens": 32})],
    )
    result = ingest(path, TraceParams(file=str(path), columns=LOG_COLUMNS))
    assert result.trace.column("max_tokens").to_pylist() == [64, 32] and result.report.by_reason == {
        "malformed_record": 1
    }


def test_two_caps_are_not_guessed_between(tmp_path) -> None:
    path = _jsonl(tmp_path / "log.jsonl", [_logged(0, {"max_tokens": 64, "max_completion_tokens": 32})])
    with pytest.raises(
        InputFileError,
        match=r"several columns could be max_tokens \(request.max_tokens, request.max_completion_tokens\)",
    ):
        ingest(path, TraceParams(file=str(path), columns=LOG_COLUMNS))
    mapped = ingest(
        path, TraceParams(file=str(path), columns=LOG_COLUMNS | {"max_tokens": "request.max_completion_tokens"})
    )
    assert mapped.trace.column("max_tokens").to_pylist() == [32]


def test_a_flat_log_with_openais_newer_name(tmp_path) -> None:
    path = tmp_path / "log.csv"
    path.write_text("created,prompt_tokens,completion_tokens,max_completion_tokens\n0,100,10,16\n1,200,20,\n")
    result = ingest(
        path, TraceParams(file=str(path), time_unit="s", columns={"isl": "prompt_tokens", "osl": "completion_tokens"})
    )
    assert result.trace.column("max_tokens").to_pylist() == [16, None]


def test_vllm_bench_results_keep_no_cap_and_the_plan_says_what_it_assumed() -> None:
    # the saved result holds the measured lengths (input_lens, output_lens) and timings, no request's max_tokens
    assert not {"max_tokens", "max_completion_tokens"} & set(json.loads(VLLM_BENCH.read_text()))
    trace = ingest(VLLM_BENCH).trace
    assert trace.num_rows == 12 and trace.column("max_tokens").null_count == 12
    assert reservation_note(trace, "trtllm-guaranteed-no-evict") == (
        "output lengths: the trace states no max_tokens, so admission trtllm-guaranteed-no-evict was simulated reserving "
        "each request's real output length, which no engine knows in advance (optimistic)"
    )
