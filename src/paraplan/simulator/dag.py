"""Operator-DAG schedules (FD-DPS): a placement of operators on devices with a per-device order.

Each operator is a compute task on its device, run in the order the placement lists (the engine
chains a device's compute tasks in the order they are added); an edge between operators on
different devices becomes a transfer of its tensor over the link between them (FD-DPS
Definition 4: alpha + bytes / beta), once per (producer, destination device, bytes). With
`contention=False` transfers never wait for a busy port,
and the simulated makespan is the schedule's dynamic critical-path length (eq. (10)); with
contention each device sends and receives one transfer at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from paraplan.costs.op_costs import op_seconds_per_device
from paraplan.costs.op_memory import peak_per_device, resident_bytes
from paraplan.models.opspec import OpGraph
from paraplan.plans.plan import OperatorPlacement, Plan, PlanError
from paraplan.simulator.engine import TaskGraph, Timeline, simulate


@dataclass(frozen=True)
class OpEdge:
    src: str
    dst: str
    nbytes: float


def build_dag_graph(placement: Sequence[OperatorPlacement], edges: Sequence[OpEdge],
                    op_seconds: Callable[[str, int], float], link_seconds: Callable[[int, int, float], float],
                    n_devices: int, op_layer: Callable[[str], int] | None = None) -> tuple[TaskGraph, dict[str, int]]:
    """`op_seconds(op, device)` and `link_seconds(src_device, dst_device, nbytes)` price the tasks;
    `op_layer(op)` (optional) tags each task with its model layer (Gantt colours)."""
    where: dict[str, int] = {}
    position: dict[str, int] = {}
    for p in placement:
        for i, op in enumerate(p.ops):
            where[op] = p.device
            position[op] = i
    for e in edges:
        for op in (e.src, e.dst):
            if op not in where:
                raise PlanError(f"operators: operator {op!r} of the graph is not placed on any device")
        if where[e.src] == where[e.dst] and position[e.src] > position[e.dst]:
            raise PlanError(f"operators: device {where[e.src]} runs {e.dst!r} before {e.src!r}, which it needs")
    graph = TaskGraph(n_devices)
    task: dict[str, int] = {}
    transfers: list[int] = []  # per edge: its transfer task, -1 on one device
    for p in placement:
        for op in p.ops:
            layer = op_layer(op) if op_layer else 0
            task[op] = graph.compute(p.device, op_seconds(op, p.device), "op", layers=(layer, layer + 1))
    # a tensor goes to another device once, however many operators there read it: one transfer per
    # (producer, destination device, bytes read) — consumers reading different parts of a producer's
    # outputs get their own, so each edge's arrival is its own alpha + bytes / beta (eq. (6))
    sent: dict[tuple[str, int, float], int] = {}
    for e in edges:
        a, b = where[e.src], where[e.dst]
        if a == b:
            graph.depend(task[e.dst], task[e.src])
            transfers.append(-1)
            continue
        key = (e.src, b, e.nbytes)
        if key not in sent:
            sent[key] = graph.transfer(a, b, link_seconds(a, b, e.nbytes), "transfer", deps=[task[e.src]])
        graph.depend(task[e.dst], sent[key])
        transfers.append(sent[key])
    graph.edge_transfers = transfers
    return graph, task


def simulate_dag(placement, edges, op_seconds, link_seconds, n_devices: int,
                 overlap_slowdown: float = 1.0, contention: bool = True,
                 op_layer=None) -> tuple[Timeline, dict[str, int]]:
    graph, task = build_dag_graph(placement, edges, op_seconds, link_seconds, n_devices, op_layer)
    return simulate(graph, overlap_slowdown, contention), task


@dataclass(frozen=True)
class DagRun:
    graph: OpGraph  # the graph simulated (the plan's splits applied)
    tasks: np.ndarray  # per node: its task in the timeline
    timeline: Timeline
    busy_s: np.ndarray  # per device
    peak_bytes: np.ndarray  # per device (costs/op_memory.py)
    n_ops: np.ndarray  # per device
    critical_path: tuple[int, ...]  # node indices, first to last: each waited for the one before
    critical_compute_s: float  # operator time on the critical path
    critical_transfer_s: float  # transfer time on it (the rest of the makespan)


def run_dag_plan(plan: Plan, graph: OpGraph, cm, contention: bool = True) -> DagRun:
    """Simulate a 'dag' plan on `graph` (the plan's operators, splits applied) under cost model `cm`."""
    if graph.model != plan.model:
        raise PlanError(f"operators: the plan is for {plan.model!r}, the operator graph for {graph.model!r}")
    index = graph.index()
    for p in plan.operators:
        for op in p.ops:
            if op not in index:
                raise PlanError(f"operators: {op!r} is not an operator of {plan.model} (the graph has "
                                f"{graph.n_nodes}; was the plan made for other sizes?)")
    placed = sum(len(p.ops) for p in plan.operators)
    if placed != graph.n_nodes:
        raise PlanError(f"operators: the plan places {placed} operators, the graph of {plan.model} has {graph.n_nodes}")
    n_dev = cm.cluster.n_devices
    for p in plan.operators:
        if p.device >= n_dev:
            raise PlanError(f"operators: device {p.device} does not exist ({cm.cluster.name} has {n_dev})")
    batch = plan.global_batch
    seconds = op_seconds_per_device(graph, cm.cluster, batch, getattr(cm, "operator_profile", None))
    names = [n.name for n in graph.nodes]
    edges = [OpEdge(names[e.src], names[e.dst], e.nbytes.at(batch)) for e in graph.edges]
    layer = {n.name: max(n.layer, 0) for n in graph.nodes}
    tasks_graph, task = build_dag_graph(plan.operators, edges, lambda op, d: float(seconds[index[op], d]),
                                        lambda a, b, nbytes: cm.cluster.link(a, b).transfer_s(nbytes), n_dev,
                                        layer.__getitem__)
    timeline = simulate(tasks_graph, cm.overlap_slowdown, contention)
    tasks = np.array([task[name] for name in names])
    device = np.empty(graph.n_nodes, dtype=np.int64)
    for p in plan.operators:
        for op in p.ops:
            device[index[op]] = p.device
    start, finish = timeline.start[tasks], timeline.end[tasks]
    params = np.array([n.param_bytes for n in graph.nodes], dtype=float)
    backward = np.array([n.phase == "backward" for n in graph.nodes])
    output = np.array([n.output_bytes.at(batch) for n in graph.nodes])
    src = np.array([e.src for e in graph.edges], dtype=np.int64)
    dst = np.array([e.dst for e in graph.edges], dtype=np.int64)
    peaks = peak_per_device(device, start, finish, resident_bytes(params, backward), output, src, dst, n_dev,
                            cm.memory.reserve_bytes)
    busy = np.bincount(device, weights=finish - start, minlength=n_dev)
    arrival = finish[src].copy()  # when each edge's data is on the consumer's device
    moved = np.array(tasks_graph.edge_transfers, dtype=np.int64)
    remote = moved >= 0
    arrival[remote] = timeline.end[moved[remote]]
    path, compute_s = _critical_path(plan, index, start, finish, src, dst, arrival)
    return DagRun(graph, tasks, timeline, busy, peaks, np.bincount(device, minlength=n_dev), path, compute_s,
                  float(finish.max() - compute_s) if len(finish) else 0.0)


def _critical_path(plan: Plan, index: dict[str, int], start, finish, src, dst, arrival):
    """Walk back from the operator that finishes last: each step goes to what made the current
    operator wait (the latest-arriving input, or the operator before it on its device)."""
    previous = {}
    for p in plan.operators:
        for a, b in zip(p.ops, p.ops[1:], strict=False):
            previous[index[b]] = index[a]
    inputs: dict[int, list[int]] = {}
    for e, v in enumerate(dst):
        inputs.setdefault(int(v), []).append(e)
    node = int(np.argmax(finish)) if len(finish) else -1
    path, compute_s = [], 0.0
    while node >= 0:
        path.append(node)
        compute_s += float(finish[node] - start[node])
        waits = [(float(arrival[e]), int(src[e])) for e in inputs.get(node, [])]
        if node in previous:
            waits.append((float(finish[previous[node]]), previous[node]))
        if not waits or start[node] <= 0.0:
            break
        node = max(waits)[1]
    return tuple(reversed(path)), compute_s
