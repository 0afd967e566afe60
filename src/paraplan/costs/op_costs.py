"""Operator times and transfers for the operator-graph planners (FD-DPS Definitions 3 and 4).

Definition 3 (computation cost E_(i,v)): the paper averages measured run times of operator o_i on
device v. We have two sources, like the layer costs: the analytic device model (the roofline of
costs/timefn.py `ComputeTime` with one kernel per operator: per-kernel overhead + max(FLOPs /
(peak x efficiency), bytes / memory bandwidth)) and, for the machine it was measured on, a per-
operator profile (`OperatorProfile`: seconds affine in the batch per operator name, from
`paraplan profile --operators`).

Definition 4 (communication cost C_(i,j) = f(A(T) / b_ij) + theta_B): alpha + bytes / beta over
the link between the two devices (`LinkSpec.transfer_s`), 0 on the same device.

All vectorised over the graph's nodes: 80,000 operators price in milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paraplan.errors import ParaplanError
from paraplan.hardware.cluster import Cluster, DeviceSpec
from paraplan.models.opspec import OpGraph


@dataclass(frozen=True)
class OperatorProfile:
    """Measured seconds per operator: seconds(batch) = fixed + per_sample x batch, by operator
    name, on one device type (`device_name`)."""

    model: str
    device_name: str
    seconds: dict  # operator name -> (fixed_s, per_sample_s)


def _column(graph: OpGraph, field: str, batch: float) -> np.ndarray:
    fixed = np.fromiter((getattr(n, field).fixed for n in graph.nodes), float, len(graph.nodes))
    per = np.fromiter((getattr(n, field).per_sample for n in graph.nodes), float, len(graph.nodes))
    return fixed + per * batch


def analytic_op_seconds(graph: OpGraph, device: DeviceSpec, batch: float) -> np.ndarray:
    """ET(o_i, v) for every node at `batch`, from the device model (one kernel per operator)."""
    flops = _column(graph, "flops", batch)
    traffic = _column(graph, "bytes_accessed", batch)
    compute = np.where(flops > 0, (flops + device.half_efficiency_flops) / (device.peak_flops * device.max_efficiency),
                       0.0)
    memory = traffic / device.memory_bandwidth_bytes_per_s
    return device.kernel_overhead_s + np.maximum(compute, memory)


def profiled_op_seconds(graph: OpGraph, profile: OperatorProfile, batch: float, device: DeviceSpec) -> np.ndarray:
    """ET(o_i, v) from a measured operator profile. A split part "x/part<i>" of d parts runs x on
    batch / d: the profile's fixed time + its per-sample time x batch / d; a gather (not a kernel
    of the unsplit model, so never measured) is priced by the device model."""
    out = analytic_op_seconds(graph, device, batch)
    parts: dict[str, int] = {}
    for node in graph.nodes:
        base, sep, k = node.name.rpartition("/part")
        if sep and k.isdigit():
            parts[base] = max(parts.get(base, 0), int(k) + 1)
    missing = []
    for i, node in enumerate(graph.nodes):
        entry = profile.seconds.get(node.name)
        if entry is not None:
            out[i] = entry[0] + entry[1] * batch
            continue
        base, sep, k = node.name.rpartition("/part")
        whole = profile.seconds.get(base) if sep and k.isdigit() else None
        if whole is not None:
            out[i] = whole[0] + whole[1] * batch / parts[base]
        elif not node.name.endswith("/gather"):
            missing.append(node.name)
    if missing:
        raise ParaplanError(f"the operator profile of {profile.model} lacks {len(missing)} operators of the graph "
                            f"(e.g. {missing[0]!r}); profile the same model again")
    return out


def op_seconds_per_device(graph: OpGraph, cluster: Cluster, batch: float,
                          profile: OperatorProfile | None = None) -> np.ndarray:
    """[n_nodes, n_devices] ET(o_i, v_k): one column per device (devices of one type share it)."""
    columns: dict[str, np.ndarray] = {}
    out = np.empty((len(graph.nodes), cluster.n_devices))
    for slot in cluster.devices:
        if slot.spec.name not in columns:
            columns[slot.spec.name] = (profiled_op_seconds(graph, profile, batch, slot.spec) if profile is not None
                                       else analytic_op_seconds(graph, slot.spec, batch))
        out[:, slot.id] = columns[slot.spec.name]
    return out


def link_matrices(cluster: Cluster) -> tuple[np.ndarray, np.ndarray]:
    """(alpha [d, d] seconds, beta [d, d] bytes/s) so that w = alpha + bytes / beta between two
    devices (Definition 4); the diagonal is 0 latency and infinite bandwidth."""
    d = cluster.n_devices
    alpha = np.zeros((d, d))
    beta = np.full((d, d), np.inf)
    for a in range(d):
        for b in range(d):
            if a != b:
                link = cluster.link(a, b)
                alpha[a, b] = link.latency_s
                beta[a, b] = link.bandwidth_bytes_per_s
    return alpha, beta
