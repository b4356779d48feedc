"""The simulator's forecast for the candidate at each traffic share of a rollout: the trace thinned to
that share (a seeded draw per request, as a hash split draws keys), simulated on the candidate's
deployment, read through the same histogram bounds the gateway uses."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from llmcap.errors import InputFileError
from llmcap.perf.model import StepTimeModel
from llmcap.rollout.gates import Prediction
from llmcap.sim import SimConfig, simulate
from llmcap.sim.records import with_client_latency


def thinned(trace: pa.Table, share: float, seed: int = 0) -> pa.Table:
    """The requests a `share` split would send to the candidate (each kept with probability `share`)."""
    keep = np.random.default_rng(seed).random(trace.num_rows) < share
    return trace.filter(pa.array(keep))


def predict_share(
    trace: pa.Table,
    config: SimConfig,
    model: StepTimeModel,
    share: float,
    seed: int = 0,
    decode_model: StepTimeModel | None = None,
    client_latency_s: float = 0.0,
) -> Prediction:
    """`client_latency_s`: the HTTP path's own share of TTFT (API server, gateway), which the simulator (an
    engine core) does not contain, e.g. a calibration's `client_overhead_s`."""
    part = thinned(trace, share, seed)
    if part.num_rows == 0:
        empty = np.empty(0)
        return Prediction.from_values(share, empty, empty, empty, 0.0, 0.0, 0)
    result = simulate(part, model, config, decode_model=decode_model)
    rec = with_client_latency(result.records, client_latency_s) if client_latency_s else result.records
    ttft = pc.drop_null(rec.column("ttft_s")).to_numpy()
    ts = result.timeseries
    preemptions = int(pc.sum(rec.column("preemptions")).as_py() or 0)
    return Prediction.from_values(
        share,
        ttft,
        result.itl_values,
        result.itl_weights,
        float(pc.max(ts.column("kv_usage")).as_py() or 0.0),
        float(pc.max(ts.column("waiting")).as_py() or 0.0),
        preemptions,
    )


PREDICTIONS_KIND = "llmcap-rollout-predictions"


def predictions_doc(preds: dict[float, Prediction], about: dict) -> dict:
    """The file `llmcap rollout predict` writes: what was simulated (`about`) and a prediction per step."""
    return {"kind": PREDICTIONS_KIND, "simulated": True, **about, "steps": [preds[w].to_json() for w in sorted(preds)]}


def load_predictions(path: Path) -> dict[float, Prediction]:
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputFileError(path, f"cannot read the rollout predictions: {exc}") from None
    if not isinstance(doc, dict) or doc.get("kind") != PREDICTIONS_KIND:
        raise InputFileError(
            path,
            f"not a rollout predictions file (not {PREDICTIONS_KIND!r}): write one with `llmcap rollout predict`",
            field="kind",
        )
    out = {}
    for i, step in enumerate(doc.get("steps") or []):
        try:
            p = Prediction.from_json(step)
        except (KeyError, TypeError, ValueError) as exc:
            raise InputFileError(path, f"{type(exc).__name__}: {exc}", field=f"steps.{i}") from None
        out[p.share] = p
    return out
