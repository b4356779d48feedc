"""Timing engine steps through a `StepTimeModel`, one step or a whole run of pure-decode steps.

A run of k pure-decode steps with B sequences is the same batch each step except that the context
grows by B (the longest by 1). Step ends are a running sum that starts from the run's start time, so
ends come out bit-identical however a stretch of steps is split into runs (sequential float addition
in the same order). For the linear model and the roofline's scalar path a run is timed on demand:
its ends are recomputed in plain floats when asked (`run_end`, `run_scan`, a few ns a step compiled)
and its durations are produced in bulk for the engine's step log (`decode_durations`); other models
get both as arrays from one vectorised call (`decode_run`).

Which path a model takes is the model's own declaration (`StepTimeModel`'s optional `timing_form`):
a `LinearStepModel` form is evaluated inline (its six terms, fixed order) because a numpy call per step
costs more than the whole step's arithmetic; an `InlineStepModel` form (a roofline's `CompiledRoofline`)
is timed through its plain-float methods; a model without a form is timed through `step_time`. Per
element, Python floats and numpy float64 give identical IEEE results for the same operations, which
keeps single steps and runs consistent.
"""

from __future__ import annotations

from array import array

import numpy as np

from llmcap.perf.model import InlineStepModel, LinearStepModel, StepBatch, StepTimeModel
from llmcap.perf.roofline_scalar import ScalarRoofline

_SHORT_RUN = 8  # below this many steps a Python loop beats numpy's per-call overhead
_INF = float("inf")


def timing_form(model: StepTimeModel) -> LinearStepModel | InlineStepModel | None:
    """The form `model` declares for fast timing (see `StepTimeModel`), or None."""
    offer = getattr(model, "timing_form", None)
    return offer() if callable(offer) else None


class StepTimer:
    def __init__(self, model: StepTimeModel) -> None:
        if not isinstance(model, StepTimeModel):
            raise TypeError(f"{type(model).__name__} does not implement StepTimeModel.step_time")
        self.model = model
        form = timing_form(model)
        self.is_linear = isinstance(form, LinearStepModel)
        if isinstance(form, LinearStepModel):
            c = [float(x) for x in form.coefficients]
            self.c0, self.c_tok, self.c_pair, self.c_pseq, self.c_dseq, self.c_ctx = c
        self.fast: InlineStepModel | None = None if form is None or isinstance(form, LinearStepModel) else form
        # a compiled roofline at pp = 1 also has a plain-float evaluator this module can call natively
        scalar = getattr(self.fast, "scalar", None) if getattr(self.fast, "pp", 0) == 1 else None
        self.scalar: ScalarRoofline | None = scalar if isinstance(scalar, ScalarRoofline) else None
        # `linear` is what the engine reads: the step time comes inline from plain floats and ignores
        # decode_max_context, so the engine need not compute the longest context per step.
        self.linear = self.is_linear or self.fast is not None

    def one(self, p_tok: float, p_pairs: float, p_seqs: float, d_seqs: float, d_ctx: float, d_max: float) -> float:
        """Seconds of one step."""
        if self.is_linear:
            return (
                (((self.c0 + self.c_tok * p_tok) + self.c_pair * p_pairs) + self.c_pseq * p_seqs) + self.c_dseq * d_seqs
            ) + self.c_ctx * d_ctx
        if self.scalar is not None:
            d = self.scalar.step(p_tok, p_pairs, p_seqs, d_seqs, d_ctx)
            if d >= 0.0:
                return d
        if self.fast is not None:  # (also a scalar step outside the tables: grows them or times it exactly)
            return self.fast.step_time_scalar(p_tok, p_pairs, p_seqs, d_seqs, d_ctx, d_max)
        b = StepBatch(
            np.array([p_tok], dtype=np.float64),
            np.array([p_pairs], dtype=np.float64),
            np.array([p_seqs], dtype=np.float64),
            np.array([d_seqs], dtype=np.float64),
            np.array([d_ctx], dtype=np.float64),
            np.array([d_max], dtype=np.float64),
        )
        return float(self.model.step_time(b)[0])

    # ------------------------------------------------------------ decode runs timed on demand
    # A run of decode steps is (start time, b, first context, length): its step ends are the running sum
    # from the start, recomputed in plain floats whenever asked (`run_end`, `run_scan`), and its
    # durations are written to the step log in bulk (`decode_durations`). Nothing per step is stored,
    # so a long run costs a few ns a step instead of two boxed floats. The sums are the additions of a
    # step-by-step sum of `one`'s numbers in the same order, and the bulk durations are those numbers.

    def on_demand(self, b: int) -> bool:
        """Whether decode runs of b sequences can be timed on demand: the linear model, or the
        roofline's scalar path inside its tables."""
        return self.is_linear or (self.scalar is not None and b < self.scalar.n)

    def _decode_base(self, b: int) -> float:
        """The linear model's step time of b decodes at zero context (`one`'s terms in its order)."""
        return (((self.c0 + self.c_tok * 0.0) + self.c_pair * 0.0) + self.c_pseq * 0.0) + self.c_dseq * float(b)

    def run_end(self, t: float, b: int, ctx0: int, j0: int, j1: int) -> float:
        """The end of step j1 - 1 of a decode run, given t, the start of its step j0 (step j: b sequences
        at total context ctx0 + j·b; on_demand(b) must hold): a scan that no finite end stops."""
        return self.run_scan(t, b, ctx0, j0, j1, _INF)[1]

    def run_scan(self, t: float, b: int, ctx0: int, j: int, k: int, until: float) -> tuple[int, float]:
        """Walk a decode run from its step j, which starts at t, to the first step in [j, k) that ends at
        or after `until`: (that step, its start), or (k, the end of step k - 1) when none does."""
        fb = float(b)
        ctx = float(ctx0 + j * b)  # exact: integers below 2**53, and so is every sum below
        if not self.is_linear:
            assert self.scalar is not None
            return self.scalar.decode_scan(t, fb, ctx, j, k, until)
        base, c = self._decode_base(b), self.c_ctx
        while j < k:
            e = t + (base + c * ctx)
            if e >= until:
                return j, t
            t = e
            ctx += fb
            j += 1
        return k, t

    def decode_durations(self, b: np.ndarray, ctx: np.ndarray) -> np.ndarray:
        """Durations of decode steps of b[i] sequences at total context ctx[i] (float64, integers), in bulk:
        the numbers `run_end` adds up (on_demand(b) for every b)."""
        if self.is_linear:
            base = (((self.c0 + self.c_tok * 0.0) + self.c_pair * 0.0) + self.c_pseq * 0.0) + self.c_dseq * b.astype(
                np.float64
            )
            return base + self.c_ctx * ctx
        assert self.fast is not None
        return self.fast.decode_times_batch(b, ctx)

    def decode_run(self, t0: float, b: int, ctx0: int, max0: int, k: int) -> tuple[array[float], list[float]]:
        """Durations and absolute end times of k pure-decode steps of `b` sequences starting at t0, the
        first with total context ctx0 (longest max0); step j has ctx0 + j·b (longest max0 + j). For the
        runs `on_demand` does not cover (a compiled roofline outside its scalar tables or at pp > 1, any
        other model). Durations come as an array('d'): array-to-array copies are memcpy."""
        if self.on_demand(b):
            raise ValueError("runs of this timer are timed on demand (run_end, run_scan, decode_durations)")
        if self.fast is not None:
            fb, f0, fm = float(b), float(ctx0), float(max0)
            if k <= _SHORT_RUN:
                durs, ends, t = [], [], t0
                for j in range(k):
                    d = self.fast.step_time_scalar(0.0, 0.0, 0.0, fb, f0 + j * fb, fm + j)  # exact: integers
                    t += d
                    durs.append(d)
                    ends.append(t)
                return array("d", durs), ends
            d_arr = self.fast.decode_times(fb, np.arange(k, dtype=np.float64) * fb + f0)  # exact: integers
        else:
            steps = np.arange(k, dtype=np.float64)
            zeros = np.zeros(k)
            batch = StepBatch(
                zeros, zeros, zeros, np.full(k, float(b)), steps * float(b) + float(ctx0), steps + float(max0)
            )
            d_arr = np.asarray(self.model.step_time(batch), dtype=np.float64)
        run = np.empty(k + 1)  # t0, then the durations: their running sum is the step ends
        run[0] = t0
        run[1:] = d_arr
        durations = array("d", run[1:].tobytes())
        np.cumsum(run, out=run)
        return durations, run[1:].tolist()
