"""Written-back step-time corrections: versions compound, aliases pick what a plan applies, files round-trip,
and the corrected step model is the base model's times × the factors."""

from __future__ import annotations

import numpy as np
import pytest

from llmcap.errors import InputFileError
from llmcap.perf import build_step_model
from llmcap.perf.corrections import (
    StepCorrection,
    apply_corrections,
    history_for,
    read_histories,
    registered_model_name,
    resolve_all,
    write_history,
)
from llmcap.perf.model import StepBatch

CONF = {"gpu": "H100-SXM-80GB", "tp": 2, "pp": 1, "ep": 1, "weight_quant": "fp8", "kv_dtype": "fp8"}


def test_versions_compound_and_the_alias_names_what_a_plan_applies(tmp_path) -> None:
    h = history_for(tmp_path, CONF)
    assert h.registered_model == registered_model_name(CONF) == "llmcap-step-model-H100-SXM-80GB-tp2pp1ep1-fp8-kv-fp8"
    v1 = h.add([StepCorrection(factor=1.25)], "a" * 64, "digital twin", "champion", "c1")
    v2 = h.add(
        [StepCorrection(factor=1.1), StepCorrection(factor=2.0, min_context=8192)],
        "b" * 64,
        "digital twin",
        "champion",
        "c2",
    )
    assert [c.factor for c in v1.corrections] == [1.25]
    assert [c.factor for c in v2.corrections] == [1.25, 1.1, 2.0] and [c.factor for c in v2.added] == [1.1, 2.0]
    h.add(
        [StepCorrection(factor=0.9)], "c" * 64, "http://engine:8000", "candidate", "c3"
    )  # another alias starts afresh
    h.record_registry(2, "run2", "7")
    write_history(tmp_path, h)

    (again,) = read_histories(tmp_path)
    assert again == h and again.aliases == {"champion": 2, "candidate": 3}
    (champion,) = resolve_all(tmp_path, "champion")
    assert champion["version"] == 2 and champion["mlflow_version"] == "7" and champion["configuration"] == CONF
    assert [c["factor"] for c in champion["corrections"]] == [1.25, 1.1, 2.0]
    assert [e["version"] for e in resolve_all(tmp_path, "candidate")] == [3]
    assert (
        resolve_all(tmp_path, None) == []
        and resolve_all(tmp_path, "nobody") == []
        and resolve_all(None, "champion") == []
    )


def test_the_corrected_model_scales_every_step_and_long_prefills_on_top() -> None:
    base = build_step_model("Llama-3.1-8B", "h100")
    corrected = apply_corrections(base, [StepCorrection(factor=3.0, min_context=4096), StepCorrection(factor=1.2)])
    decode = StepBatch.build(
        np.zeros(2), np.zeros(2), decode_seqs=np.array([8.0, 8.0]), decode_context=np.array([4000.0, 9000.0])
    )
    np.testing.assert_allclose(corrected.step_time(decode), 1.2 * base.step_time(decode), rtol=1e-12)
    short, long = (
        StepBatch.build(np.array([512.0]), np.array([512.0 * 513 / 2])),
        StepBatch.build(np.array([512.0]), np.array([512.0 * (8000 + 513 / 2)])),
    )
    np.testing.assert_allclose(corrected.step_time(short), 1.2 * base.step_time(short), rtol=1e-12)
    np.testing.assert_allclose(corrected.step_time(long), 3.6 * base.step_time(long), rtol=1e-12)


def test_a_bad_corrections_file_is_one_error_naming_it(tmp_path) -> None:
    (tmp_path / "llmcap-step-model-x.json").write_text(
        '{"registered_model": "x", "configuration": {}, "versions": [{"version": 0}]}'
    )
    with pytest.raises(InputFileError, match="llmcap-step-model-x.json"):
        resolve_all(tmp_path, "champion")
    with pytest.raises(ValueError, match="greater than 0"):
        StepCorrection(factor=0.0)
