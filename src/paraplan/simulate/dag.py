"""Operator-DAG schedules (FD-DPS): a placement of operators on devices with a per-device order.

Each operator is a compute task on its device, run in the order the placement lists; an edge
between operators on different devices becomes a transfer of its tensor over the link between
them (FD-DPS Definition 4: alpha + bytes / beta). The operator graph itself (from torch.fx, with
intra-operator splits) and op costs come from the caller, so this stays pure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from paraplan.plan.plan import OperatorPlacement, PlanError
from paraplan.simulate.engine import TaskGraph, Timeline, simulate


@dataclass(frozen=True)
class OpEdge:
    src: str
    dst: str
    nbytes: float


def build_dag_graph(placement: Sequence[OperatorPlacement], edges: Sequence[OpEdge],
                    op_seconds: Callable[[str, int], float], link_seconds: Callable[[int, int, float], float],
                    n_devices: int) -> tuple[TaskGraph, dict[str, int]]:
    """`op_seconds(op, device)` and `link_seconds(src_device, dst_device, nbytes)` price the tasks."""
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
    for p in placement:
        for op in p.ops:
            task[op] = graph.compute(p.device, op_seconds(op, p.device), "op")
    for e in edges:
        a, b = where[e.src], where[e.dst]
        if a == b:
            graph.depend(task[e.dst], task[e.src])
        else:
            t = graph.transfer(a, b, link_seconds(a, b, e.nbytes), "transfer", deps=[task[e.src]])
            graph.depend(task[e.dst], t)
    return graph, task


def simulate_dag(placement, edges, op_seconds, link_seconds, n_devices: int,
                 overlap_slowdown: float = 1.0) -> tuple[Timeline, dict[str, int]]:
    graph, task = build_dag_graph(placement, edges, op_seconds, link_seconds, n_devices)
    return simulate(graph, overlap_slowdown), task
