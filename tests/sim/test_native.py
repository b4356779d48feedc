"""The compiled simulator core (mypyc, `make setup`) against the Python sources it was built from.

The identity check runs the same random workloads here (compiled core) and in a child process with
LLMCAP_SIM_PURE=1 (the sources), and compares digests of every output byte for byte."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

import llmcap.sim as sim
from llmcap import _native
from tests.sim._workloads import MODEL, random_config, random_trace

REPO = Path(__file__).resolve().parents[2]
FAST_SCALER = sim.AutoscaleConfig(min_replicas=1, max_replicas=4, initial_replicas=1, t_ready_s=0.3, interval_s=0.1,
                                  min_residency_s=0.4, scale_down_window_s=0.3, metric_window_s=0.2, waiting_per_replica=1.0, kv_usage=0.3)
SEEDS = range(40)


def _roofline():
    from llmcap.perf import build_step_model

    return build_step_model("Llama-3.1-8B", "h100")


def digests(seeds: range) -> dict[str, str]:
    """sha256 of records, ITL distribution and time series per run (linear stand-in and roofline)."""
    out = {}
    roofline = _roofline()
    for seed in seeds:
        for name, model in (("linear", MODEL), ("roofline", roofline)):
            rng = np.random.default_rng(seed)
            trace = random_trace(rng, int(rng.integers(5, 60)))
            config = random_config(rng, seed)
            runs = {f"{name}/{seed}": config}
            if config.pd is None and config.router != "power_of_two":  # the same pool, autoscaled on a fast clock
                runs[f"{name}/{seed}/autoscaled"] = config.model_copy(update={"autoscale": FAST_SCALER})
            for key, cfg in runs.items():
                r = sim.simulate(trace, model, cfg, rng=np.random.default_rng(seed))
                h = hashlib.sha256(r.records_parquet())
                h.update(r.itl_values.tobytes() + r.itl_weights.tobytes())
                h.update(json.dumps(r.timeseries.to_pydict(), sort_keys=True).encode())
                if r.autoscale is not None:
                    h.update(json.dumps([r.autoscale.ticks.to_pydict(), r.autoscale.replicas.to_pydict()], sort_keys=True).encode())
                out[key] = h.hexdigest()
    return out


def _in_child(code: str, **env: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def test_make_setup_built_the_native_core() -> None:
    assert sim.CORE == "native", "make setup compiles the core (scripts/build_native.py); see .work/native-build.log"
    assert all(_native.extension_files(m) for m in _native.NATIVE_MODULES) and _native.stale_modules() == []


def test_compiled_core_gives_the_same_bytes_as_the_sources() -> None:
    code = f"import json, llmcap.sim as s; from tests.sim.test_native import digests; print(json.dumps([s.CORE, digests(range({SEEDS.stop}))]))"
    core, pure = json.loads(_in_child(code, LLMCAP_SIM_PURE="1"))
    assert core == "source" and sim.CORE == "native"
    assert digests(SEEDS) == pure


def test_a_source_changed_since_the_build_is_stale(tmp_path, monkeypatch) -> None:
    manifest = json.loads(_native.MANIFEST.read_text())
    manifest["modules"]["sim.engine"] = "0" * 64  # as if engine.py had changed after the build
    fake = tmp_path / "native.json"
    fake.write_text(json.dumps(manifest))
    monkeypatch.setattr(_native, "MANIFEST", fake)
    assert _native.stale_modules() == ["sim.engine"]
    fake.unlink()  # no record at all: nothing compiled can be trusted
    assert _native.stale_modules() == list(_native.NATIVE_MODULES)
