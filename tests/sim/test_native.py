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
FAST_SCALER = sim.AutoscaleConfig(
    min_replicas=1,
    max_replicas=4,
    initial_replicas=1,
    t_ready_s=0.3,
    interval_s=0.1,
    min_residency_s=0.4,
    scale_down_window_s=0.3,
    metric_window_s=0.2,
    waiting_per_replica=1.0,
    kv_usage=0.3,
)
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
                    h.update(
                        json.dumps(
                            [r.autoscale.ticks.to_pydict(), r.autoscale.replicas.to_pydict()], sort_keys=True
                        ).encode()
                    )
                out[key] = h.hexdigest()
    return out


def _in_child(code: str, **env: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, check=True
    )
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


def test_the_core_loads_explicitly_without_an_import_hook(tmp_path) -> None:
    """`import llmcap` loads no part of the core; `import llmcap.sim` loads every compiled module of sim (and
    perf's, which sim's compiled code calls) from llmcap/_compiled, and installs no meta-path finder."""
    code = (
        "import json, sys; import llmcap; bare = sorted(m for m in sys.modules if m.startswith('llmcap.'));"
        "import llmcap.sim as s, llmcap.sim.engine, llmcap.perf.roofline_scalar, llmcap.trace.lru;"
        "hooks = [repr(f) for f in sys.meta_path if 'llmcap' in getattr(type(f), '__module__', '')];"
        "print(json.dumps([bare, s.CORE, hooks, [sys.modules[m].__file__ for m in"
        " ('llmcap.sim.engine', 'llmcap.perf.roofline_scalar', 'llmcap.trace.lru')]]))"
    )
    bare, core, hooks, files = json.loads(_in_child(code))
    assert bare == [] and core == "native" and hooks == []
    assert all(Path(f).is_relative_to(_native.COMPILED) for f in files), files


def test_a_stale_build_runs_the_sources_with_a_warning(tmp_path) -> None:
    manifest = json.loads(_native.MANIFEST.read_text())
    manifest["modules"]["sim.engine"] = "0" * 64  # as if engine.py had changed after the build
    fake = tmp_path / "native.json"
    fake.write_text(json.dumps(manifest))
    code = (
        f"import json, warnings; from llmcap import _native; _native.MANIFEST = __import__('pathlib').Path({str(fake)!r});"
        "warnings.simplefilter('always'); import warnings as w\n"
        "with w.catch_warnings(record=True) as seen:\n"
        "    import llmcap.sim as s, llmcap.sim.engine as e, llmcap.trace.lru as l\n"
        "print(json.dumps([s.CORE, e.__file__, l.__file__, [str(x.message) for x in seen]]))"
    )
    core, engine, lru, warned = json.loads(_in_child(code))
    assert core == "source" and engine.endswith("llmcap/sim/engine.py") and lru.endswith("llmcap/trace/lru.py")
    assert any("stale or partial (sim.engine)" in m for m in warned), warned
