"""Step 4: SLO-goodput sizing — attainment and goodput over request records, analytic demand and bounds,
the max-feasible-rate search, headroom by risk, request-class pools and a pluggable executor.

Submodules: `params`, `slo`, `analytic`, `search`, `headroom`, `pools`, `executor` (dask imported lazily).
"""
