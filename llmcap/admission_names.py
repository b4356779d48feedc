"""Admission policy names (`llmcap.sim.admission` has one class for each), kept apart from the simulator so
that validating a params file (every stage does) knows them without importing the simulator."""

from __future__ import annotations

from llmcap.errors import LlmcapError

ADMISSION_POLICY_NAMES = ("vllm", "trtllm-max-utilization", "trtllm-guaranteed-no-evict", "sglang")
DEFAULT_ADMISSION = "vllm"
NEVER_PREEMPTS = ("trtllm-guaranteed-no-evict",)  # reserve a request's whole KV life at admission
RESERVES_OUTPUT = (*NEVER_PREEMPTS, "sglang")  # admit against the output a request may still generate (its max_tokens)


def known_admission(name: str) -> str:
    """`name` if it is an admission policy (a configuration's validator), else a ValueError listing them."""
    if name not in ADMISSION_POLICY_NAMES:
        raise ValueError(f"unknown admission policy {name!r}; known: {', '.join(ADMISSION_POLICY_NAMES)}")
    return name


def admission_option(name: str) -> str:
    """`name` if it is an admission policy, else the command line's one-line error for `--admission-policy`."""
    if name not in ADMISSION_POLICY_NAMES:
        raise LlmcapError(f"--admission-policy must be one of {', '.join(ADMISSION_POLICY_NAMES)}, got {name!r}")
    return name
