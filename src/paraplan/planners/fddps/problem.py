"""The abstract DAG placement problem of FD-DPS (§3) and the timing every DAG scheduler is judged by.

`DagProblem` is array-based and knows nothing of models: n nodes (operators o_i), d devices (v_k),

  exec_s[i, k]             ET(o_i, v_k), Definition 3
  edge_src/dst/bytes       e_ij = (o_i, o_j) with the tensor it carries
  link_alpha_s[k, l],
  link_bytes_per_s[k, l]   w(o_ik, o_jl) = alpha[k, l] + bytes / beta[k, l] for k != l, 0 on one
                           device (Definition 4; the diagonals are never read)
  resident_bytes[i]        what o_i pins on its device for the whole iteration (parameters, their
                           gradients, optimizer state)
  output_bytes[i]          o_i's output tensor
  capacity_bytes[d]        the memory limit C of eqs. (4)-(5) (inf: unlimited)

Nodes come in topological order (every edge has src < dst), which also proves the graph acyclic.

`replay` is the list-scheduling semantics the project's simulator uses for operator plans
(simulator/dag.py) with link contention off: each device runs its nodes in the given order and a
node starts at max(the previous node on its device finished, every parent finished + w(parent's
device, this device)). Transfers occupy no device and never wait for each other. Every scheduler
returns start/finish times equal to `replay` of its own placement and order.

`replay_ports` (planners/fddps/port_replay.py) is the same with link contention, the simulator's
default (simulator/engine.py, `contention=True`): every device has ONE send port and ONE receive port (full duplex); a transfer
from device k to l holds k's send port and l's receive port together for w(k, l), so transfers out
of one device, or into one device, serialize. The FD-DPS paper (and `replay`) lets every transfer
start the moment its data is ready; on real graphs with many cross-device edges that model is
optimistic by up to 2x against the contended simulator. A tensor crosses to a device once per
(producer, destination device, bytes), however many consumers there read it (simulator/dag.py). A schedule made with links="ports" (ours,
beyond the paper: ports.PortLedger) carries the transfer times it booked and equals
`replay_ports` of its placement, order and booked transfer order.

Memory rule (`device_peaks`): on device k at time tau the usage is the resident bytes of every node
placed on k plus the outputs alive on k. The output of o_i is alive on its producer's device over
the closed interval [finish(o_i), release(o_i)], release = the latest start of any consumer, on any
device (a transfer to another device leaves by the consumer's start, so the producer keeps its copy
until then), or finish(o_i) itself for a node nobody consumes. The received copy on a consumer's
device is not counted separately: it is the consumer's input, which the caller folds into the
consumer's own bytes if it matters. Intervals are closed, so a producer released at t and an
output born at t count together at t.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

import numpy as np

from paraplan.costs.op_memory import peak_per_device
from paraplan.errors import ParaplanError


class DagProblemError(ParaplanError):
    """A malformed DAG problem or an order that cannot run (a bad adapter, never a user's flag)."""


def _frozen(name: str, value, dtype, shape: tuple[int, ...] | None, ndim: int) -> np.ndarray:
    array = np.array(value, dtype=dtype)  # a copy: the caller's buffer may change later
    if array.ndim != ndim or (shape is not None and array.shape != shape):
        want = shape if shape is not None else f"{ndim}-D"
        raise DagProblemError(f"{name}: expected shape {want}, got {array.shape}")
    array.flags.writeable = False
    return array


def _check(ok, name: str, what: str) -> None:
    bad = np.flatnonzero(~np.asarray(ok).ravel())
    if bad.size:
        raise DagProblemError(f"{name}: {what} (first bad entry at flat index {int(bad[0])})")


@dataclass(frozen=True, eq=False)
class DagProblem:
    exec_s: np.ndarray  # [n, d] ET(o_i, v_k), Definition 3
    edge_src: np.ndarray  # [e] int
    edge_dst: np.ndarray  # [e] int, edge_src < edge_dst
    edge_bytes: np.ndarray  # [e] the tensor A(T) of eq. (2)
    link_alpha_s: np.ndarray  # [d, d] latency
    link_bytes_per_s: np.ndarray  # [d, d] bandwidth b_ij of eq. (2)
    resident_bytes: np.ndarray  # [n]
    output_bytes: np.ndarray  # [n]
    capacity_bytes: np.ndarray  # [d] (inf: no limit)
    names: tuple[str, ...] | None = None
    # [n] int or None: the node whose device o_i must share (-1: free). A runtime that keeps an
    # operator's backward with its forward (PyTorch's autograd) needs it; the caller also adds an
    # edge from that node, so that it is always placed first (planners/fddps/planner.py, runnable=true)
    colocate: np.ndarray | None = None

    def __post_init__(self):
        exec_s = _frozen("exec_s", self.exec_s, np.float64, None, 2)
        n, d = exec_s.shape
        if n < 1 or d < 1:
            raise DagProblemError(f"exec_s: need at least one node and one device, got shape {exec_s.shape}")
        _check(np.isfinite(exec_s) & (exec_s >= 0), "exec_s", "execution times must be finite and >= 0")
        src = _frozen("edge_src", self.edge_src, np.int64, None, 1)
        e = src.shape[0]
        dst = _frozen("edge_dst", self.edge_dst, np.int64, (e,), 1)
        nbytes = _frozen("edge_bytes", self.edge_bytes, np.float64, (e,), 1)
        _check((src >= 0) & (dst < n), "edges", f"node indices must lie in [0, {n})")
        backwards = np.flatnonzero(src >= dst)
        if backwards.size:
            j = int(backwards[0])
            a, b = int(src[j]), int(dst[j])
            raise DagProblemError(f"edge {j} ({self._label(a)} -> {self._label(b)}): nodes must come in "
                                  "topological order (every edge src < dst); this also rules out cycles")
        _check(np.isfinite(nbytes) & (nbytes >= 0), "edge_bytes", "must be finite and >= 0")
        alpha = _frozen("link_alpha_s", self.link_alpha_s, np.float64, (d, d), 2)
        beta = _frozen("link_bytes_per_s", self.link_bytes_per_s, np.float64, (d, d), 2)
        off = ~np.eye(d, dtype=bool)
        _check(~off | (np.isfinite(alpha) & (alpha >= 0)), "link_alpha_s", "latencies must be finite and >= 0")
        _check(~off | (beta > 0), "link_bytes_per_s", "bandwidths must be > 0 (inf: free)")
        resident = _frozen("resident_bytes", self.resident_bytes, np.float64, (n,), 1)
        output = _frozen("output_bytes", self.output_bytes, np.float64, (n,), 1)
        capacity = _frozen("capacity_bytes", self.capacity_bytes, np.float64, (d,), 1)
        for name, arr in (("resident_bytes", resident), ("output_bytes", output)):
            _check(np.isfinite(arr) & (arr >= 0), name, "must be finite and >= 0")
        _check(capacity > 0, "capacity_bytes", "must be > 0 (inf: no limit)")
        if self.colocate is not None:
            colocate = _frozen("colocate", self.colocate, np.int64, (n,), 1)
            _check((colocate >= -1) & (colocate < np.arange(n)), "colocate",
                   "must be -1 or an earlier node's index")
            object.__setattr__(self, "colocate", colocate)
        if self.names is not None and len(self.names) != n:
            raise DagProblemError(f"names: {len(self.names)} names for {n} nodes")
        for key, value in (("exec_s", exec_s), ("edge_src", src), ("edge_dst", dst), ("edge_bytes", nbytes),
                           ("link_alpha_s", alpha), ("link_bytes_per_s", beta), ("resident_bytes", resident),
                           ("output_bytes", output), ("capacity_bytes", capacity)):
            object.__setattr__(self, key, value)
        if self.names is not None:
            object.__setattr__(self, "names", tuple(str(x) for x in self.names))

    # --- sizes and labels -----------------------------------------------------------------------
    @property
    def n_nodes(self) -> int:
        return self.exec_s.shape[0]

    @property
    def n_devices(self) -> int:
        return self.exec_s.shape[1]

    @property
    def n_edges(self) -> int:
        return self.edge_src.shape[0]

    def _label(self, i: int) -> str:
        return repr(self.names[i]) if self.names is not None else f"node {i}"

    def label(self, i: int) -> str:
        """How messages name node i: its name when the caller gave names, else its index."""
        return self._label(i)

    # --- costs ----------------------------------------------------------------------------------
    def transfer_s(self, src_device: int, dst_device: int, nbytes: float) -> float:
        """w(o_ik, o_jl), Definition 4; the hot loops inline the same expression on `lists`."""
        if src_device == dst_device:
            return 0.0
        return self.lists.alpha[src_device][dst_device] + nbytes / self.lists.beta[src_device][dst_device]

    @cached_property
    def lists(self) -> ProblemLists:
        """Plain-Python copies for the schedulers' inner loops (list indexing beats numpy's per element)."""
        n = self.n_nodes
        parents: list[list[tuple[int, float]]] = [[] for _ in range(n)]
        children: list[list[tuple[int, float]]] = [[] for _ in range(n)]
        for a, b, nb in zip(self.edge_src.tolist(), self.edge_dst.tolist(), self.edge_bytes.tolist(), strict=True):
            parents[b].append((a, nb))
            children[a].append((b, nb))
        return ProblemLists(self.exec_s.tolist(), parents, children, self.link_alpha_s.tolist(),
                            self.link_bytes_per_s.tolist())


@dataclass(frozen=True, eq=False)
class ProblemLists:
    et: list[list[float]]  # ET(o_i, v_k)
    parents: list[list[tuple[int, float]]]  # per node: (parent, bytes)
    children: list[list[tuple[int, float]]]  # per node: (child, bytes)
    alpha: list[list[float]]
    beta: list[list[float]]


@dataclass(frozen=True, eq=False)
class DagSchedule:
    """A placement, a run order per device and its timing (always `replay` of device + order)."""

    device: np.ndarray  # [n] int: S, the map O -> V
    order: tuple[tuple[int, ...], ...]  # per device, node indices in run order: the queue Q
    start_s: np.ndarray  # [n]
    finish_s: np.ndarray  # [n]
    makespan_s: float  # the final DCPL, eq. (10)
    peak_bytes: np.ndarray  # [d] by the memory rule of this module
    feasible: bool
    reason: str | None = None  # why not feasible
    stats: dict = field(default_factory=dict)  # what the scheduler wants to report (counts, seconds)
    # links="ports" only (see `replay_ports`): per edge, when its transfer held the ports; NaN for an
    # edge within one device. None: a contention-free schedule (transfers never wait).
    transfer_start_s: np.ndarray | None = None
    transfer_finish_s: np.ndarray | None = None

    def transfer_order(self) -> tuple[int, ...] | None:
        """The edges crossing devices in the order the schedule booked them on the ports (by booked
        start, then finish, then index): what `replay_ports` needs to reproduce a port-aware schedule."""
        if self.transfer_start_s is None:
            return None
        start, finish = self.transfer_start_s, self.transfer_finish_s
        remote = np.flatnonzero(~np.isnan(start))
        return tuple(int(e) for e in remote[np.lexsort((remote, finish[remote], start[remote]))])


class Replay(NamedTuple):
    start_s: np.ndarray
    finish_s: np.ndarray
    makespan_s: float


def placed_order(problem: DagProblem, device, order) -> tuple[list[int], list[int]]:
    """Validate a placement and its per-device orders: (device per node, the node before each on its
    device or -1)."""
    n, d = problem.n_nodes, problem.n_devices
    dev = [int(x) for x in np.asarray(device).tolist()]
    if len(dev) != n:
        raise DagProblemError(f"device: {len(dev)} entries for {n} nodes")
    if len(order) != d:
        raise DagProblemError(f"order: {len(order)} device orders for {d} devices")
    prev = [-1] * n
    seen = [False] * n
    for k, seq in enumerate(order):
        last = -1
        for i in seq:
            i = int(i)
            if not 0 <= i < n or seen[i]:
                raise DagProblemError(f"order: node {i} is out of range or listed twice")
            if dev[i] != k:
                raise DagProblemError(f"order: device {k} lists {problem.label(i)}, placed on device {dev[i]}")
            seen[i], prev[i], last = True, last, i
    if not all(seen):
        raise DagProblemError(f"order: {problem.label(seen.index(False))} is on no device's order")
    return dev, prev


def replay(problem: DagProblem, device, order) -> Replay:
    """Start and finish of every node when device k runs order[k] in sequence (see the module doc)."""
    n = problem.n_nodes
    dev, prev = placed_order(problem, device, order)
    lists = problem.lists
    et, parents, children, alpha, beta = lists.et, lists.parents, lists.children, lists.alpha, lists.beta
    nxt = [-1] * n
    for i in range(n):
        if prev[i] >= 0:
            nxt[prev[i]] = i
    waiting = [len(parents[i]) + (prev[i] >= 0) for i in range(n)]
    stack = [i for i in range(n) if waiting[i] == 0]
    start, finish = [0.0] * n, [0.0] * n
    done = 0
    while stack:
        i = stack.pop()
        k = dev[i]
        s = finish[prev[i]] if prev[i] >= 0 else 0.0
        for p, nb in parents[i]:
            kp = dev[p]
            arrive = finish[p] if kp == k else finish[p] + (alpha[kp][k] + nb / beta[kp][k])
            if arrive > s:
                s = arrive
        start[i], finish[i] = s, s + et[i][k]
        done += 1
        for c, _ in children[i]:
            waiting[c] -= 1
            if waiting[c] == 0:
                stack.append(c)
        if nxt[i] >= 0:
            waiting[nxt[i]] -= 1
            if waiting[nxt[i]] == 0:
                stack.append(nxt[i])
    if done < n:
        stuck = next(i for i in range(n) if waiting[i] > 0)
        raise DagProblemError(f"order: the device orders deadlock with the edges ({problem.label(stuck)} on device "
                              f"{dev[stuck]} waits for a node its device runs later)")
    start_a, finish_a = np.array(start), np.array(finish)
    return Replay(start_a, finish_a, float(finish_a.max()))


def device_peaks(problem: DagProblem, device, start_s, finish_s) -> np.ndarray:
    """Peak bytes per device of a timed schedule under the module's memory rule: the one rule of
    costs/op_memory.py, which the simulator reports too (the reserve is outside `capacity_bytes`)."""
    return peak_per_device(np.asarray(device, dtype=np.int64), np.asarray(start_s, dtype=np.float64),
                           np.asarray(finish_s, dtype=np.float64), problem.resident_bytes, problem.output_bytes,
                           problem.edge_src, problem.edge_dst, problem.n_devices)


def peak_memory(problem: DagProblem, schedule: DagSchedule) -> np.ndarray:
    return device_peaks(problem, schedule.device, schedule.start_s, schedule.finish_s)


def format_bytes(nbytes: float) -> str:
    if math.isinf(nbytes):
        return "unlimited"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= size:
            return f"{nbytes / size:.2f} {unit}"
    return f"{nbytes:.0f} B"


def make_schedule(problem: DagProblem, device, order, start_s, finish_s, reason: str | None = None,
                  stats: dict | None = None, transfers: tuple | None = None) -> DagSchedule:
    """Wrap a scheduler's result; feasibility = no reason given and every peak within capacity.
    `transfers`: (start, finish) per edge of a port-aware schedule (NaN within a device)."""
    dev = np.array(device, dtype=np.int64)
    start, finish = np.array(start_s, dtype=np.float64), np.array(finish_s, dtype=np.float64)
    peaks = device_peaks(problem, dev, start, finish)
    over = np.flatnonzero(peaks > problem.capacity_bytes * (1 + 1e-12))
    if reason is None and over.size:
        k = int(over[0])
        reason = (f"device {k} peaks at {format_bytes(peaks[k])}, over its "
                  f"{format_bytes(problem.capacity_bytes[k])}")
    moved = (None, None) if transfers is None else tuple(np.array(x, dtype=np.float64) for x in transfers)
    for arr in (dev, start, finish, peaks, *(x for x in moved if x is not None)):
        arr.flags.writeable = False
    return DagSchedule(dev, tuple(tuple(int(i) for i in seq) for seq in order), start, finish,
                       float(finish.max()), peaks, reason is None, reason, dict(stats or {}), *moved)
