"""Step 5: the chosen plan's unit replayed open loop at scales of its predicted max feasible rate, beside
the simulator's prediction of the same excerpts (`check_unit`), with a per-bucket comparison and a verdict.

- `unit`: which unit (one instance, or one prefill + one decode instance) and the rate the plan predicts;
- `runs`: the excerpts at each rate, measured against an endpoint and predicted by the simulator;
- `compare`: ISL x OSL bucket percentiles side by side, attainment per run, the verdict;
- `twin_process`: the unit's digital twin as a subprocess when no endpoint is configured.
"""

from llmcap.replaycheck.check import ReplayCheck, check_replay, check_unit
from llmcap.replaycheck.unit import PlanUnit, unit_from_plan

__all__ = ["PlanUnit", "ReplayCheck", "check_replay", "check_unit", "unit_from_plan"]
