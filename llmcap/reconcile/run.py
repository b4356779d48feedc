"""Reconcile measured with predicted request records: read, pair, estimate per bucket, decide."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from llmcap.errors import InputFileError, LlmcapError
from llmcap.reconcile.bias import bucket_biases, pair
from llmcap.reconcile.decide import Reconciliation, decide
from llmcap.reconcile.drift import speed_drifts
from llmcap.reconcile.params import ReconcileParams


def read_records(path: str | Path) -> pa.Table:
    """A request-records parquet file (llmcap's request schema, from replay or the simulator)."""
    try:
        return pq.read_table(path)
    except FileNotFoundError:
        raise InputFileError(path, "file not found") from None
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputFileError(path, f"not a readable parquet file ({exc})") from None


def reconcile(
    measured: pa.Table, predicted: pa.Table, params: ReconcileParams, stale_fields: tuple[str, ...] = ()
) -> Reconciliation:
    """`stale_fields`: the fingerprint fields in which the profile behind the prediction differs from the
    measured engine (`llmcap.perf.fingerprint`); any makes a biased bucket's decision a re-profile."""
    m, p, accounting = pair(measured, predicted)
    if accounting.paired_ok == 0:
        raise LlmcapError(
            f"no request is served in both the measured ({measured.num_rows} rows) and predicted "
            f"({predicted.num_rows} rows) records: nothing to reconcile"
        )
    biases = bucket_biases(m, p, params)
    return decide(biases, accounting, params, speed_drifts(m, p, params.min_requests), stale_fields)
