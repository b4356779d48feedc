"""Collective and point-to-point costs between the GPUs of one instance (alpha-beta model)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from llmcap.catalog.gpus import GpuSpec
from llmcap.perf.efficiency import RooflineParams
from llmcap.perf.model import F64


@dataclass(frozen=True)
class Link:
    """What one rank sees of a group of `ranks` GPUs: per-step latency and achieved one-direction bytes/s."""

    name: str
    latency_s: float
    bytes_s: float  # achieved (peak x comm_efficiency), one direction


def link_for(gpu: GpuSpec, group_span: int, params: RooflineParams) -> Link:
    """The link a group of GPUs spanning `group_span` consecutive ranks talks over.

    Inside one scale-up domain (group_span <= gpus_per_node): NVLink / Infinity Fabric, whose catalog
    figure is aggregate bidirectional, so one direction is half; PCIe-only cards use `pcie_bytes_s`.
    Beyond a node: the scale-out NIC (per GPU, one direction).
    """
    eff = params.comm_efficiency
    if group_span > gpu.gpus_per_node:
        return Link("nic", params.scale_out_latency_s, gpu.nic_bytes_s * eff)
    if gpu.scale_up_bytes_s is None:
        return Link("pcie", params.scale_up_latency_s, params.pcie_bytes_s * eff)
    return Link(gpu.scale_up or "scale-up", params.scale_up_latency_s, gpu.scale_up_bytes_s / 2 * eff)


def ring_allreduce_time(message_bytes: ArrayLike, ranks: int, link: Link) -> F64:
    """Ring all-reduce of `message_bytes` per rank: 2(n-1) steps of latency, 2(n-1)/n of the bytes on the wire."""
    b = np.asarray(message_bytes, dtype=np.float64)
    if ranks <= 1:
        return np.zeros_like(b)
    steps = 2 * (ranks - 1)
    return np.where(b > 0, steps * link.latency_s + steps / ranks * b / link.bytes_s, 0.0)


def gather_time(message_bytes: ArrayLike, ranks: int, link: Link) -> F64:
    """Gather of a message of `message_bytes` in total, 1/n from each rank: (n-1) steps, (n-1)/n of the bytes."""
    b = np.asarray(message_bytes, dtype=np.float64)
    if ranks <= 1:
        return np.zeros_like(b)
    return np.where(b > 0, (ranks - 1) * link.latency_s + (ranks - 1) / ranks * b / link.bytes_s, 0.0)


def all_to_all_time(send_bytes: ArrayLike, ranks: int, link: Link) -> F64:
    """One all-to-all where each rank sends `send_bytes` in total to the other ranks (pairwise exchange)."""
    b = np.asarray(send_bytes, dtype=np.float64)
    if ranks <= 1:
        return np.zeros_like(b)
    return np.where(b > 0, (ranks - 1) * link.latency_s + b / link.bytes_s, 0.0)


def p2p_time(message_bytes: ArrayLike, link: Link) -> F64:
    """One send/recv of `message_bytes` between neighbouring pipeline stages."""
    b = np.asarray(message_bytes, dtype=np.float64)
    return np.where(b > 0, link.latency_s + b / link.bytes_s, 0.0)
