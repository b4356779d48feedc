"""The planned deployment as data: what `summary.json` records so that the plan can be simulated again on its
own, at its counts or in any of its scenarios, without the sizer (`llmcap simulate --plan summary.json`).

The record holds the simulator config at the plan's counts (engines, router, P→D link and where TTFT ends),
what timed each pool's steps (a roofline configuration, rebuilt the same way), the planning rate and seed
of the sizer's whole-trace scenarios, the serving counts of every scenario and the SLO the plan was judged
by, and, with an availability target, the states it is judged over (`llmcap.sizing.availability`: every instance
serving and each pool with its fullest node down, with the share of time of each). A plan whose steps were timed by a measured profile or corrected step times cannot be rebuilt from the
record alone; it says so instead of substituting the roofline.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from llmcap.errors import LlmcapError
from llmcap.first_token import first_token_from
from llmcap.perf import RooflineModel, build_step_model
from llmcap.perf.model import StepTimeModel
from llmcap.sim import SimConfig, SimResult, simulate
from llmcap.sizing import availability as avail
from llmcap.sizing.availability import State
from llmcap.sizing.params import SloParams
from llmcap.sizing.search import EvalResult
from llmcap.sizing.simeval import SimEvaluate
from llmcap.sizing.slo import attainment, run_checks, run_miss, with_deadlines
from llmcap.trace.synth import scale_rate, spread_ties

STEP_MODEL_FIELDS = ("gpu", "tp", "pp", "ep", "weight_quant", "kv_dtype")


@dataclass(frozen=True)
class PlannedDeployment:
    model: str  # the model source the step models are built from (catalog name or config path)
    planning_rps: float  # the rate every scenario replays the whole trace at
    seed: int  # the seed of the sizer's whole-trace runs (tie spreading, power-of-two draws)
    config: SimConfig  # the deployment at the plan's counts
    step_models: Mapping[
        str, Mapping[str, Any]
    ]  # pool -> roofline configuration (STEP_MODEL_FIELDS) or {"source": ...}
    scenarios: Mapping[str, Mapping[str, int]]  # scenario name -> serving instances per pool
    slo: SloParams
    availability: tuple[State, ...] = ()  # with slo.availability: the states judged over time (module docstring)

    @property
    def counts(self) -> dict[str, int]:
        pd = self.config.pd
        return (
            {"instances": self.config.replicas}
            if pd is None
            else {"prefill": pd.prefill_replicas, "decode": pd.decode_replicas}
        )

    def config_at(self, counts: Mapping[str, int]) -> SimConfig:
        """The deployment with `counts` serving instances per pool (a pool with none left cannot be simulated)."""
        empty = [pool for pool, n in counts.items() if n < 1]
        if empty:
            raise LlmcapError(
                f"no {empty[0]} instance left serving: nothing to simulate (the scenario fails by construction)"
            )
        if self.config.pd is None:
            return self.config.model_copy(update={"replicas": counts["instances"]})
        pd = self.config.pd.model_copy(
            update={"prefill_replicas": counts["prefill"], "decode_replicas": counts["decode"]}
        )
        return self.config.model_copy(update={"pd": pd})

    def scenario_counts(self, name: str) -> dict[str, int]:
        if name not in self.scenarios:
            raise LlmcapError(
                f"--scenario {name!r}: the plan's scenarios are {', '.join(repr(s) for s in self.scenarios)}"
            )
        return dict(self.scenarios[name])

    def step_times(self) -> tuple[StepTimeModel, StepTimeModel | None]:
        """(the step model of the only or prefill pool, the decode pool's or None), rebuilt from the record."""
        models = []
        for pool in self.counts:
            desc = self.step_models[pool]
            if desc.get("source") != "roofline":
                raise LlmcapError(
                    f"the plan's {pool} pool was timed by {desc.get('source')!r}, which summary.json does not carry: "
                    "simulate that configuration with --profile instead"
                )
            models.append(build_step_model(self.model, str(desc["gpu"]), **{k: desc[k] for k in STEP_MODEL_FIELDS[1:]}))
        return models[0], (models[1] if len(models) > 1 else None)

    def replay(self, trace: pa.Table, counts: Mapping[str, int] | None = None, seed: int | None = None) -> SimResult:
        """The whole `trace` at the planning rate through the deployment at `counts` (default: the plan's), as the
        sizer's scenarios replay it: ties spread and power-of-two draws on `seed` (default: the sizer's)."""
        seed = self.seed if seed is None else seed
        workload = scale_rate(spread_ties(trace, np.random.default_rng(seed)), self.planning_rps)
        step, decode = self.step_times()
        return simulate(
            workload, step, self.config_at(counts or self.counts), rng=np.random.default_rng(seed), decode_model=decode
        )

    def judge(self, result: SimResult, trace: pa.Table | None = None) -> PlanCheck:
        """The plan's SLO on one replay of `trace`: steady-window attainment against the target (each request's own
        deadline from the trace included), and every run-level target."""
        records = result.records if trace is None else with_deadlines(result.records, trace)
        share = attainment(records, self.slo)
        missed = run_miss(run_checks(records, result.itl_values, result.itl_weights, self.slo))
        return PlanCheck(share, self.slo.attainment_target, missed, share >= self.slo.attainment_target and not missed)

    def evaluate(self, trace: pa.Table, counts: Mapping[str, int], seed: int | None = None) -> EvalResult:
        """The sizer's whole-trace evaluation of the deployment at `counts`: attainment over the steady window, the
        run-level targets and whether the run was overloaded (`llmcap.sizing.simeval`)."""
        config = self.config_at(counts)
        step, decode = self.step_times()
        whole = SimEvaluate(
            trace,
            step,
            config.engine,
            self.slo,
            max(trace.num_rows, 2),
            config.replicas,
            config.router,
            config.pd,
            decode,
        )
        return whole(self.planning_rps, self.seed if seed is None else seed)

    def judge_availability(self, trace: pa.Table, seed: int | None = None) -> AvailabilityCheck:
        """The availability target on `trace`: each recorded state replayed once, weighted by its share of the time."""
        if self.slo.availability is None or not self.availability:
            raise LlmcapError("the plan has no availability target (size it with --slo-availability)")
        runs: dict[tuple[tuple[str, int], ...], EvalResult] = {}
        for state in self.availability:
            if state.serving not in runs:
                runs[state.serving] = self.evaluate(trace, dict(state.serving), seed)
        judged = [(s, runs[s.serving]) for s in self.availability]
        share = avail.availability(judged)
        costliest = avail.costliest(judged)[0]
        return AvailabilityCheck(share, self.slo.availability, avail.describe(judged), costliest.down or "all serving")

    def to_dict(self) -> dict[str, Any]:
        config = self.config.model_dump(mode="json", exclude_defaults=True)
        if (
            self.config.pd is not None
        ):  # where TTFT ends is always written: the record must not change meaning with a default
            lean, pd = config["pd"], self.config.pd.model_dump(mode="json")
            config["pd"] = {
                k: lean.get(k, v) for k, v in pd.items() if k in lean or k == "first_token_from"
            }  # in field order
        return {
            "model": self.model,
            "planning_rps": self.planning_rps,
            "seed": self.seed,
            "counts": self.counts,
            "sim_config": config,
            "step_models": {k: dict(v) for k, v in self.step_models.items()},
            "scenarios": {k: dict(v) for k, v in self.scenarios.items()},
            "slo": self.slo.model_dump(mode="json"),
        } | (
            {
                "availability": [
                    {"serving": dict(s.serving), "share": s.share, "down": s.down} for s in self.availability
                ]
            }
            if self.availability
            else {}
        )

    @classmethod
    def from_dict(cls, record: Mapping[str, Any], where: str = "summary.json") -> PlannedDeployment:
        try:
            slo = SloParams.model_validate(record["slo"])
            states = tuple(
                State(tuple((str(k), int(v)) for k, v in s["serving"].items()), float(s["share"]), str(s["down"]))
                for s in record.get("availability") or ()
            )
            return cls(
                str(record["model"]),
                float(record["planning_rps"]),
                int(record["seed"]),
                _sim_config(record["sim_config"], slo),
                dict(record["step_models"]),
                dict(record["scenarios"]),
                slo,
                states,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise LlmcapError(
                f"{where}: no usable `deployment` record ({type(exc).__name__}: {exc}); size the plan again with this version"
            ) from None


def _sim_config(record: Mapping[str, Any], slo: SloParams) -> SimConfig:
    """The recorded deployment. A P/D record that leaves out where TTFT ends (written when that was the default)
    ends it where its SLO says: the sizer set the two together (`PdFactory`)."""
    pd = record.get("pd")
    if isinstance(pd, Mapping) and "first_token_from" not in pd:
        record = {**record, "pd": {**pd, "first_token_from": first_token_from(slo.ttft_includes_handoff)}}
    return SimConfig.model_validate(record)


@dataclass(frozen=True)
class PlanCheck:
    attainment: float  # steady-window share of requests meeting every per-request target
    target: float
    run_miss: str  # a run-level target missed ("" when none)
    passes: bool

    def line(self) -> str:
        why = f"; {self.run_miss}" if self.run_miss else ""
        return f"attainment {self.attainment:.4f} vs target {self.target:g}{why} → {'pass' if self.passes else 'FAIL'}"


@dataclass(frozen=True)
class AvailabilityCheck:
    share: float  # A: requests served within the SLOs over time
    target: float
    detail: str  # each state's share of the time and what it serves
    costliest: str  # the state that loses the most requests ("all serving" or the pool with a node down)

    @property
    def passes(self) -> bool:
        return self.share >= self.target

    def line(self) -> str:
        verdict = "pass" if self.passes else f"FAIL (most lost: {self.costliest})"
        return f"availability {self.share:.5f} vs target {self.target:g} ({self.detail}) → {verdict}"


def step_model_record(step: StepTimeModel, row: Mapping[str, Any]) -> dict[str, Any]:
    """What timed a pool's steps: its roofline configuration (from the candidate `row`), or only the kind when measured or corrected."""
    if type(step) is not RooflineModel:
        return {"source": "measured profile or corrected step times"}
    return {"source": "roofline"} | {
        k: (str(row[k]) if k in ("gpu", "weight_quant", "kv_dtype") else int(row[k])) for k in STEP_MODEL_FIELDS
    }


def sized_blocks(summary: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """KV blocks per instance of the (prefill or only, decode) pool as the plan was sized (its `deployment` record: the
    engine's stated KV where `size.kv_budget` used it, `llmcap.sizing.kvbudget`); None where the summary has no record."""
    config = (summary.get("deployment") or {}).get("sim_config") or {}
    front = (config.get("engine") or {}).get("num_blocks")
    back = ((config.get("pd") or {}).get("decode_engine") or {}).get("num_blocks", front)
    return front, back
