"""Goodput under failures (issue 53 item 4): how much of a run's time trains, given how often nodes
fail, how long a checkpoint takes to write and how long a restart takes.

  M_job = M_node / N                      the job's mean time between failures over N nodes
  C                                       a checkpoint's write time: every parameter's fp32 weights and
                                          Adam moments (12 bytes), once, at the shared storage's
                                          bandwidth (its read bandwidth, assumed the same for writes)
                                          and the nodes' ports together
  tau = sqrt(2 C M_job)                   the checkpoint interval (Young 1974; Daly 2006's first order)
  waste = C / tau + (tau / 2 + R) / M_job the share of time lost: writing checkpoints, the work since
                                          the last one (half an interval on average), the restart R
  goodput = throughput x (1 - waste)

A fallback ladder (planners/ladder.py) loses one node per failure and carries on on the next rung:
rung k runs N - k nodes until the next failure, M_node / (N - k) on average, at its own goodput, so
over the time to the ladder's last rung's failure the expected useful throughput is the time-weighted
mean of the rungs' goodputs.

The default M_node is the Llama 3 paper's (Dubey et al. 2024, §3.3.4: 466 job interruptions in a
54-day snapshot of pre-training on 16,384 H100s, 2,048 nodes of 8): 54 x 24 x 2,048 / 466 = 5,696 h.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Llama 3 (§3.3.4): 466 interruptions in 54 days over 2,048 nodes of 8 H100s
LLAMA3_NODE_MTBF_H = 54 * 24 * 2048 / 466
BYTES_PER_PARAM = 12  # a checkpoint's fp32 weights and Adam's two moments (runtime/state/layout_state.py)


@dataclass(frozen=True)
class Goodput:
    job_mtbf_s: float  # M_job
    checkpoint_s: float  # C
    interval_s: float  # tau
    restart_s: float  # R
    waste: float  # the share of time lost (capped at 1)
    goodput: float  # samples/s trained usefully

    @property
    def useful(self) -> float:
        return 1.0 - self.waste


def young_interval(checkpoint_s: float, job_mtbf_s: float) -> float:
    """Young's checkpoint interval, sqrt(2 C M_job)."""
    return math.sqrt(2.0 * checkpoint_s * job_mtbf_s)


def checkpoint_write_s(param_count: float, storage_bytes_per_s: float, port_bytes_per_s: float) -> float:
    """C: the parameters' weights and Adam moments written once, at the storage's bandwidth and the
    writing nodes' ports together (the lesser)."""
    return BYTES_PER_PARAM * param_count / min(storage_bytes_per_s, port_bytes_per_s)


def goodput(throughput: float, nodes: int, node_mtbf_h: float, checkpoint_s: float, restart_s: float) -> Goodput:
    """The expected useful throughput of a plan on `nodes` nodes (module docstring)."""
    job = node_mtbf_h * 3600.0 / nodes
    tau = young_interval(checkpoint_s, job)
    waste = min(1.0, checkpoint_s / tau + (tau / 2.0 + restart_s) / job) if tau > 0 else restart_s / job
    return Goodput(job, checkpoint_s, tau, restart_s, waste, throughput * (1.0 - waste))


def ladder_goodput(rungs: list[Goodput], nodes: int, node_mtbf_h: float) -> float:
    """A ladder's expected useful throughput until its last rung fails: rung k (on nodes - k nodes)
    lasts M_node / (nodes - k) on average, its goodput over that time."""
    times = [node_mtbf_h / (nodes - k) for k in range(len(rungs))]
    return sum(t * g.goodput for t, g in zip(times, rungs, strict=True)) / sum(times)


def plan_checkpoint_s(devices, cluster, param_count: float) -> tuple[float, int]:
    """(C, the nodes used): a checkpoint of `param_count` parameters written by the nodes holding
    `devices`, through their ports and the cluster's shared storage (one node at the default
    storage when `cluster` is None: a plan whose cluster cannot be loaded)."""
    from paraplan.hardware.cluster import DEFAULT_STORAGE

    nodes = sorted({cluster.devices[d].node for d in devices}) if cluster is not None else []
    storage = (cluster.storage if cluster is not None else None) or DEFAULT_STORAGE
    ports = sum(cluster.nodes[n].network.bandwidth_bytes_per_s for n in nodes) or storage.shared_read_bytes_per_s
    return checkpoint_write_s(param_count, storage.shared_read_bytes_per_s, ports), max(1, len(nodes))


def plan_goodput(plan, throughput: float, iteration_s: float, cm, node_mtbf_h: float, restart_s: float | None = None
                 ) -> Goodput:
    """A plan's goodput on `cm`'s cluster: over the nodes it uses, its checkpoint written through
    their ports and the shared storage, its restart as costs/restart.py prices loading it (or
    `restart_s`, where the caller priced it)."""
    from paraplan.costs.restart import switch_cost

    write, nodes = plan_checkpoint_s(plan.devices, cm.cluster, sum(layer.param_count for layer in cm.model.layers))
    if restart_s is None:
        restart_s = switch_cost(plan, cm, iteration_s).restart_s
    return goodput(throughput, nodes, node_mtbf_h, write, restart_s)
