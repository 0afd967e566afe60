"""`replay_ports`: the timing of a DAG schedule with link contention, the simulator's default
(planners/fddps/problem.py's module doc has the port model; simulator/engine.py, `contention=True`).
Every device has ONE send port and ONE receive port; a transfer from device k to l holds both for
w(k, l). A schedule made with links="ports" (planners/fddps/ports.py `PortLedger`) equals
`replay_ports` of its placement, order and booked transfer order.
"""

from __future__ import annotations

import heapq
import math
from typing import NamedTuple

import numpy as np

from paraplan.planners.fddps.problem import DagProblem, DagProblemError, placed_order


class PortReplay(NamedTuple):
    start_s: np.ndarray
    finish_s: np.ndarray
    makespan_s: float
    transfer_start_s: np.ndarray  # per edge; NaN for an edge within one device
    transfer_finish_s: np.ndarray
    transfer_order: tuple[int, ...]  # the edges crossing devices, in the order they were served


def replay_ports(problem: DagProblem, device, order, transfer_order=None) -> PortReplay:
    """`replay` with link contention (the port model of the module doc): every device has one send
    and one receive port; a transfer of a tensor from device k to l starts at max(its producer
    finished, the transfer before it on k's send port finished, the one before it on l's receive
    port finished) and holds both ports for w(k, l) = alpha + bytes / beta, even when that is 0. As
    in simulator/dag.py, a tensor goes to a device once per (producer, destination device, bytes):
    the edges from one producer to consumers on one device with the same bytes share a transfer.

    `transfer_order` fixes the order in which the ports serve their transfers: a sequence of every
    edge crossing devices, each port serving its transfers in the order their edges first appear
    (what a port-aware scheduler booked: `DagSchedule.transfer_order()`). None: the simulator's rule
    (simulator/engine.py with contention): tasks are served as they become ready, by (ready time,
    task id), with the task ids simulator/dag.py's `build_dag_graph` gives a plan of these device
    orders (the operators device by device in run order, then the transfers as their first edges
    come in edge order). Compute tasks are ordered by the device orders either way, so the two
    rules differ only in the port orders. `transfer_order` of the result: the edges crossing
    devices, in the order their transfers were served (a shared transfer's edges together)."""
    tasks = _PortTasks(problem, device, order)
    if transfer_order is not None:
        tasks.serve_in_order(transfer_order)
    else:
        tasks.serve_as_ready(order)
    return tasks.result()


class _PortTasks:
    """The task graph of a placement with ports: node i is task i, transfer u is task n + u (numbered
    as the simulator creates them), each task with its successors and how many it waits for."""

    def __init__(self, problem: DagProblem, device, order):
        n = problem.n_nodes
        self.problem, self.n = problem, n
        dev, prev = placed_order(problem, device, order)
        self.dev, self.prev = dev, prev
        lists = problem.lists
        et, alpha, beta = lists.et, lists.alpha, lists.beta
        self.et = et
        src, dst, nbytes = problem.edge_src.tolist(), problem.edge_dst.tolist(), problem.edge_bytes.tolist()
        self.src = src
        remote = [e for e in range(problem.n_edges) if dev[src[e]] != dev[dst[e]]]
        self.remote = remote
        unit_of: dict[int, int] = {}  # edge -> its transfer (numbered as the simulator creates them)
        index: dict[tuple[int, int, float], int] = {}
        edges_of: list[list[int]] = []
        for e in remote:
            key = (src[e], dev[dst[e]], nbytes[e])
            if key not in index:
                index[key] = len(edges_of)
                edges_of.append([])
            unit_of[e] = index[key]
            edges_of[index[key]].append(e)
        self.unit_of, self.edges_of = unit_of, edges_of
        n_units = len(edges_of)
        self.n_units = n_units
        self.u_src = [src[es[0]] for es in edges_of]
        self.u_send = [dev[src[es[0]]] for es in edges_of]
        self.u_recv = [dev[dst[es[0]]] for es in edges_of]
        u_send, u_recv = self.u_send, self.u_recv
        self.dur = [alpha[u_send[u]][u_recv[u]] + nbytes[edges_of[u][0]] / beta[u_send[u]][u_recv[u]]
                    for u in range(n_units)]
        self.u_start, self.u_end = [0.0] * n_units, [0.0] * n_units
        self.start, self.finish = [0.0] * n, [0.0] * n
        # the tasks: node i is task i, transfer u is task n + u
        inputs: list[list[int]] = [[] for _ in range(n)]  # per node: the tasks its inputs come from
        for e in range(problem.n_edges):
            inputs[dst[e]].append(n + unit_of[e] if e in unit_of else src[e])
        self.inputs = inputs
        succ: list[list[int]] = [[] for _ in range(n + n_units)]
        waiting = [0] * (n + n_units)
        for i in range(n):
            for t in inputs[i] + ([prev[i]] if prev[i] >= 0 else []):
                succ[t].append(i)
                waiting[i] += 1
        for u in range(n_units):
            succ[self.u_src[u]].append(n + u)
            waiting[n + u] += 1
        self.succ, self.waiting = succ, waiting
        self.served: list[int] = []

    def run_node(self, i: int, s: float) -> None:
        self.start[i], self.finish[i] = s, s + self.et[i][self.dev[i]]

    def node_ready(self, i: int) -> float:
        finish, u_end, n = self.finish, self.u_end, self.n
        s = finish[self.prev[i]] if self.prev[i] >= 0 else 0.0
        for t in self.inputs[i]:
            arrive = finish[t] if t < n else u_end[t - n]
            if arrive > s:
                s = arrive
        return s

    def serve_in_order(self, transfer_order) -> None:
        """Each port serves its transfers in the order their edges first appear in transfer_order."""
        n, n_units, succ, waiting = self.n, self.n_units, self.succ, self.waiting
        unit_of, finish, u_end = self.unit_of, self.finish, self.u_end
        chosen = [int(e) for e in transfer_order]
        if sorted(chosen) != self.remote:
            raise DagProblemError("transfer_order: must list every edge between two devices exactly once")
        last: dict[tuple[str, int], int] = {}
        port_prev: list[list[int]] = [[] for _ in range(n_units)]
        seen_units: set[int] = set()
        for e in chosen:
            u = unit_of[e]
            if u in seen_units:
                continue
            seen_units.add(u)
            for port in (("send", self.u_send[u]), ("recv", self.u_recv[u])):
                if port in last:
                    port_prev[u].append(last[port])
                    succ[n + last[port]].append(n + u)
                    waiting[n + u] += 1
                last[port] = u
        stack = [t for t in range(n) if waiting[t] == 0]
        done = 0
        while stack:
            t = stack.pop()
            done += 1
            if t < n:
                self.run_node(t, self.node_ready(t))
            else:
                u = t - n
                s = finish[self.u_src[u]]
                for q in port_prev[u]:
                    if u_end[q] > s:
                        s = u_end[q]
                self.u_start[u], u_end[u] = s, s + self.dur[u]
                self.served.append(u)
            for v in succ[t]:
                waiting[v] -= 1
                if waiting[v] == 0:
                    stack.append(v)
        if done < n + n_units:
            raise DagProblemError("transfer_order: the port orders deadlock with the edges and device orders")

    def serve_as_ready(self, order) -> None:
        """The simulator's rule: tasks served as they become ready, by (ready time, task id)."""
        n, n_units, succ, waiting = self.n, self.n_units, self.succ, self.waiting
        finish, dev = self.finish, self.dev
        tid = [0] * (n + n_units)  # build_dag_graph's task ids
        for rank, i in enumerate(i for seq in order for i in seq):
            tid[int(i)] = rank
        for u in range(n_units):
            tid[n + u] = n + u
        d = self.problem.n_devices
        send_free, recv_free = [0.0] * d, [0.0] * d
        ready = [0.0] * (n + n_units)
        heap = [(0.0, tid[t], t) for t in range(n) if waiting[t] == 0]
        heapq.heapify(heap)
        while heap:
            r, _, t = heapq.heappop(heap)
            if t < n:
                self.run_node(t, r)
                e_t = finish[t]
            else:
                u = t - n
                a, b = self.u_send[u], self.u_recv[u]
                s = r
                if send_free[a] > s:
                    s = send_free[a]
                if recv_free[b] > s:
                    s = recv_free[b]
                e_t = s + self.dur[u]
                self.u_start[u], self.u_end[u] = s, e_t
                send_free[a] = recv_free[b] = e_t
                self.served.append(u)
            for v in succ[t]:
                if e_t > ready[v]:
                    ready[v] = e_t
                waiting[v] -= 1
                if waiting[v] == 0:
                    heapq.heappush(heap, (ready[v], tid[v], v))
        if any(waiting[t] for t in range(n)):
            stuck = next(i for i in range(n) if waiting[i] > 0)
            raise DagProblemError(f"order: the device orders deadlock with the edges ({self.problem.label(stuck)} on "
                                  f"device {dev[stuck]} waits for a node its device runs later)")

    def result(self) -> PortReplay:
        n_edges = self.problem.n_edges
        t_start = [math.nan] * n_edges
        t_end = [math.nan] * n_edges
        for e, u in self.unit_of.items():
            t_start[e], t_end[e] = self.u_start[u], self.u_end[u]
        start_a, finish_a = np.array(self.start), np.array(self.finish)
        return PortReplay(start_a, finish_a, float(finish_a.max()), np.array(t_start), np.array(t_end),
                          tuple(e for u in self.served for e in self.edges_of[u]))


def port_sequences(problem: DagProblem, device, transfer_order) -> dict[tuple[str, int], tuple[int, ...]]:
    """Each port's transfers in the order `transfer_order` serves them: {("send" | "recv", device): edges}."""
    dev = np.asarray(device).tolist()
    out: dict[tuple[str, int], list[int]] = {}
    for e in transfer_order:
        e = int(e)
        out.setdefault(("send", dev[int(problem.edge_src[e])]), []).append(e)
        out.setdefault(("recv", dev[int(problem.edge_dst[e])]), []).append(e)
    return {port: tuple(seq) for port, seq in out.items()}
