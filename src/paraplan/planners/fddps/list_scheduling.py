"""Machinery shared by the DAG schedulers (FD-DPS and its baselines): mean costs, static levels, the
full EST/LST pass of eqs. (6)-(10), device timelines with idle-slot insertion, a memory ledger and a
builder that commits placements with exactly `replay`'s arithmetic.

Unscheduled nodes (the DCP literature's convention, which FD-DPS inherits through FastT):
  ET of an unscheduled node     = its mean over the devices (HEFT's and DCP's choice; the minimum
                                  would make every estimate optimistic and the slack meaningless on
                                  heterogeneous devices)
  w of an edge with an unscheduled end = the mean of w(k, l) over ordered device pairs k != l, i.e.
                                  mean(alpha) + bytes * mean(1 / beta): Definition 4 is linear in the
                                  bytes, so this is the exact mean transfer. One device: 0.
Scheduled nodes use their own ET and the real link; consecutive nodes on one device are joined by a
zero-weight sequence edge, so with everything placed EST = `replay`'s start and DCPL = makespan.

Link contention (links="ports", ours, beyond the FD-DPS paper): the transfers of a partial schedule
booked on every device's send and receive port, planners/fddps/ports.py (`PortLedger`; its module doc has
the port model, the booking rule and why).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from dataclasses import dataclass

import numpy as np

from paraplan.planners.fddps.ports import PortLedger
from paraplan.planners.fddps.problem import (
    DagProblem,
    DagProblemError,
    DagSchedule,
    format_bytes,
    make_schedule,
)

INF = math.inf
LINKS = ("free", "ports")  # the paper's contention-free links | one send and one receive port per device (ours)


def check_links(links: str) -> None:
    if links not in LINKS:
        raise ValueError(f"links must be one of {LINKS}, got {links!r}")


def tolerance(scale: float) -> float:
    """EST = LST 'within a tolerance' (eq. (8)): relative to the schedule length, floats drift."""
    return 1e-9 * abs(scale) + 1e-15


def quantize(value: float, scale: float) -> int:
    """A priority with float noise removed (ties within `tolerance(scale)` compare equal, so the
    explicit tie-breaks decide, e.g. HEFT's two rank-80 nodes of its published example)."""
    return round(value / tolerance(scale))


@dataclass(frozen=True, eq=False)
class MeanCosts:
    et_mean: list[float]  # ET of an unscheduled node
    mean_alpha: float
    mean_inv_beta: float

    def transfer(self, nbytes: float) -> float:
        """w of an edge with an unscheduled end."""
        return self.mean_alpha + nbytes * self.mean_inv_beta


def mean_costs(problem: DagProblem) -> MeanCosts:
    d = problem.n_devices
    et_mean = problem.exec_s.mean(axis=1).tolist()
    if d == 1:
        return MeanCosts(et_mean, 0.0, 0.0)
    off = ~np.eye(d, dtype=bool)
    inv_beta = 1.0 / problem.link_bytes_per_s[off]
    return MeanCosts(et_mean, float(problem.link_alpha_s[off].mean()), float(inv_beta.mean()))


def bottom_levels(problem: DagProblem, mean: MeanCosts) -> tuple[list[float], list[float]]:
    """Static upward levels with mean costs: blevel(i) = ET(i) + tail(i), tail(i) = max over children
    of w(e) + blevel(c) (0 for an exit). HEFT's rank_u; DCPL - blevel is the LST of eq. (7) of any
    node whose descendants are all unscheduled."""
    children = problem.lists.children
    et_mean = mean.et_mean
    ma, mib = mean.mean_alpha, mean.mean_inv_beta
    n = problem.n_nodes
    blevel, tail = [0.0] * n, [0.0] * n
    for i in range(n - 1, -1, -1):  # reverse topological: every child has a larger index
        best = 0.0
        for c, nb in children[i]:
            v = (ma + nb * mib) + blevel[c]
            if v > best:
                best = v
        tail[i] = best
        blevel[i] = et_mean[i] + best
    return blevel, tail


@dataclass(frozen=True, eq=False)
class CriticalPathTimes:
    est: np.ndarray  # EST(o_i), eq. (6)
    lst: np.ndarray  # LST(o_i), eq. (7) in its standard form (see dps.py)
    dcpl: float  # eq. (10)
    critical: np.ndarray  # eq. (8)
    path: tuple[int, ...]  # one dynamic critical path, entry to exit


def critical_path_times(problem: DagProblem, device=None, order=None) -> CriticalPathTimes:
    """The full O(n + e) pass over the graph plus the device sequence edges of a partial schedule:
    device[i] = -1 marks o_i unscheduled, order[k] lists device k's scheduled nodes in run order.
    The schedulers keep these numbers incrementally; this is the reference they are tested against
    (and FastT's one static pass, with nothing scheduled)."""
    n = problem.n_nodes
    lists, mean = problem.lists, mean_costs(problem)
    dev = [-1] * n if device is None else [int(x) for x in np.asarray(device).tolist()]
    nxt, has_prev = [-1] * n, [False] * n
    for seq in order or ():
        for a, b in zip(seq, seq[1:], strict=False):
            nxt[a], has_prev[b] = b, True
    et = [lists.et[i][dev[i]] if dev[i] >= 0 else mean.et_mean[i] for i in range(n)]

    def weight(a: int, b: int, nb: float) -> float:
        ka, kb = dev[a], dev[b]
        if ka < 0 or kb < 0:
            return mean.transfer(nb)
        return 0.0 if ka == kb else lists.alpha[ka][kb] + nb / lists.beta[ka][kb]

    succ = [[(c, weight(i, c, nb)) for c, nb in lists.children[i]] + ([(nxt[i], 0.0)] if nxt[i] >= 0 else [])
            for i in range(n)]
    waiting = [len(lists.parents[i]) + has_prev[i] for i in range(n)]
    queue = [i for i in range(n) if waiting[i] == 0]
    topo = []
    est = [0.0] * n
    while queue:
        i = queue.pop()
        topo.append(i)
        fin = est[i] + et[i]
        for c, w in succ[i]:
            arrive = fin + w if w else fin
            if arrive > est[c]:
                est[c] = arrive
            waiting[c] -= 1
            if waiting[c] == 0:
                queue.append(c)
    if len(topo) < n:
        raise DagProblemError("order: the device orders deadlock with the edges")
    dcpl = max(est[i] + et[i] for i in range(n))
    lst = [0.0] * n
    for i in reversed(topo):
        latest = dcpl
        for c, w in succ[i]:
            v = lst[c] - w
            if v < latest:
                latest = v
        lst[i] = latest - et[i]
    tol = tolerance(dcpl)
    critical = [abs(lst[i] - est[i]) <= tol for i in range(n)]
    path = _trace_path(est, et, succ, critical, tol)
    return CriticalPathTimes(np.array(est), np.array(lst), dcpl, np.array(critical), path)


def _trace_path(est, et, succ, critical, tol) -> tuple[int, ...]:
    """Section 4.2's last step: follow critical nodes whose finish + w is exactly a critical
    successor's EST, from a critical entry node (EST = 0)."""
    starts = [i for i in range(len(est)) if critical[i] and est[i] <= tol]
    if not starts:
        return ()
    path = [starts[0]]
    while True:
        i = path[-1]
        step = next((c for c, w in succ[i] if critical[c] and abs(est[i] + et[i] + w - est[c]) <= tol), None)
        if step is None:
            return tuple(path)
        path.append(step)


class DeviceTimeline:
    """One device's run order with start/finish times and its idle gaps (for insertion). Nodes are
    never moved once placed, so gaps only shrink or split; gaps shorter than `min_gap` (no node
    with work fits) are not kept."""

    def __init__(self, min_gap: float):
        self.nodes: list[int] = []
        self.starts: list[float] = []
        self.finishes: list[float] = []
        self.gap_lo: list[float] = []
        self.gap_hi: list[float] = []
        self.min_gap = min_gap

    @property
    def free_at(self) -> float:
        return self.finishes[-1] if self.nodes else 0.0

    def earliest_slot(self, est: float, dur: float) -> tuple[float, int]:
        """The earliest start >= est with room for `dur`: (start, gap index) or (start, -1) at the end."""
        lo, hi = self.gap_lo, self.gap_hi
        for g in range(bisect_right(hi, est), len(hi)):
            s = lo[g] if lo[g] > est else est
            if s + dur <= hi[g]:
                return s, g
        free = self.free_at
        return (free if free > est else est), -1

    def place(self, node: int, start: float, finish: float, gap: int) -> None:
        if gap < 0:
            free = self.free_at
            if start - free >= self.min_gap and start > free:
                self.gap_lo.append(free)
                self.gap_hi.append(start)
            self.nodes.append(node)
            self.starts.append(start)
            self.finishes.append(finish)
            return
        lo, hi = self.gap_lo[gap], self.gap_hi[gap]
        at = bisect_left(self.starts, hi)  # before the node that ends the gap
        self.nodes.insert(at, node)
        self.starts.insert(at, start)
        self.finishes.insert(at, finish)
        pieces = [(a, b) for a, b in ((lo, start), (finish, hi)) if b - a >= self.min_gap and b > a]
        self.gap_lo[gap:gap + 1] = [a for a, _ in pieces]
        self.gap_hi[gap:gap + 1] = [b for _, b in pieces]


class MemoryLedger:
    """Per-device memory of a partial schedule, an upper bound of the final peak (problem.py's
    rule): an output whose consumers are not all placed is alive to +inf. Releases only lower the
    usage, so a placement that fits here still fits in the finished schedule."""

    def __init__(self, problem: DagProblem):
        d = problem.n_devices
        self.capacity = problem.capacity_bytes.tolist()
        self.resident = [0.0] * d
        self.alive_total = [0.0] * d  # alive at +inf
        self.peak_bound = [0.0] * d  # >= max over time of the alive outputs
        self.peak_exact = [True] * d
        self.events: list[list[tuple[float, int, float]]] = [[] for _ in range(d)]  # (time, 0 birth | 1 death, delta)

    def _suffix_max(self, k: int, t: float) -> float:
        """max over tau >= t of the alive outputs on k."""
        events = self.events[k]
        pos = bisect_left(events, (t, 0))
        tail = events[pos:]
        value = self.alive_total[k] - sum(e[2] for e in tail)
        best = value
        for e in tail:
            value += e[2]
            if value > best:
                best = value
        return best

    def _peak(self, k: int) -> float:
        if not self.peak_exact[k]:
            self.peak_bound[k] = max(0.0, self._suffix_max(k, -INF))
            self.peak_exact[k] = True
        return self.peak_bound[k]

    def headroom(self, k: int, finish: float, resident: float, output: float) -> float:
        """Bytes to spare on k after placing a node finishing at `finish` (< 0: it does not fit)."""
        cap = self.capacity[k]
        if cap == INF:
            return INF
        base = self.resident[k] + resident
        bound = self.peak_bound[k]
        quick = cap - (base + bound + output)
        if quick >= 0:
            return quick
        later = self._suffix_max(k, finish) + output  # usually short: `finish` is near the device's end
        if base + bound > cap:  # only the resident part needs the exact peak (a full scan)
            bound = self._peak(k)
        return cap - base - max(bound, later)

    def place(self, k: int, finish: float, resident: float, output: float) -> None:
        self.resident[k] += resident
        if output > 0:
            self.peak_bound[k] = max(self.peak_bound[k], self._suffix_max(k, finish) + output)
            insort(self.events[k], (finish, 0, output))
            self.alive_total[k] += output

    def release(self, k: int, time: float, output: float) -> None:
        if output > 0:
            insort(self.events[k], (time, 1, -output))
            self.alive_total[k] -= output
            self.peak_exact[k] = False  # the bound stays an upper bound


class ScheduleBuilder:
    """A partial schedule: placements, timelines, memory. `commit` times a node with the same float
    expressions as `replay`, so the finished schedule equals its replay bit for bit. `ports=True`:
    transfers contend for the devices' send and receive ports (`PortLedger`, the module doc) and the
    finished schedule equals `replay_ports` of its booked transfer order instead."""

    def __init__(self, problem: DagProblem, ports: bool = False):
        n, d = problem.n_nodes, problem.n_devices
        self.problem, self.n, self.d = problem, n, d
        self.lists = problem.lists
        self.device = [-1] * n
        self.start = [0.0] * n
        self.finish = [0.0] * n
        positive = problem.exec_s[problem.exec_s > 0]
        min_gap = float(positive.min()) if positive.size else INF
        self.timelines = [DeviceTimeline(min_gap) for _ in range(d)]
        self.memory = MemoryLedger(problem)
        self.resident = problem.resident_bytes.tolist()
        self.output = problem.output_bytes.tolist()
        self.consumers_left = [len(c) for c in self.lists.children]
        self.release_at = [0.0] * n
        self.reason: str | None = None
        self.placed = 0
        self.ports = PortLedger(problem) if ports else None
        self.colocate = problem.colocate.tolist() if problem.colocate is not None else None
        # (node, per device: the transfers `arrivals` booked, how many of them invert FIFO, their seconds)
        self._pending: tuple[int, list, list[int], list[float]] | None = None

    def arrivals(self, i: int) -> list[float]:
        """EST(o_i, v_k) for every k with all parents placed: eq. (6) with the real links (zero from a
        parent on v_k: the paper's EST' of eq. (11) generalised to every placed parent). With ports,
        each arrival includes the wait for the ports (`port_arrivals`)."""
        if self.ports is not None:
            return self.port_arrivals(i)
        d, device, finish = self.d, self.device, self.finish
        alpha, beta = self.lists.alpha, self.lists.beta
        est = [0.0] * d
        for p, nb in self.lists.parents[i]:
            kp, fp = device[p], finish[p]
            row_a, row_b = alpha[kp], beta[kp]
            for k in range(d):
                a = fp if k == kp else fp + (row_a[k] + nb / row_b[k])
                if a > est[k]:
                    est[k] = a
        return est

    def port_arrivals(self, i: int) -> list[float]:
        """EST(o_i, v_k) with link contention: for every k, o_i's incoming transfers from other
        devices booked tentatively in FIFO order (parent finish, edge index) where the simulator's
        first-come-first-served ports would start them (or, for an inversion, in the earliest
        interval both ports are free); a tensor already sent to v_k is not sent again. Kept for
        `commit`."""
        d, device, finish, ledger = self.d, self.device, self.finish, self.ports
        alpha, beta, units = self.lists.alpha, self.lists.beta, ledger.units
        incoming = sorted((finish[p], e, p, nb) for p, nb, e in ledger.in_edges[i])
        # the send-port bounds are the same for every k: the transfers its port serves before and after
        sent_before = [ledger.served_before(device[p], (fp, e)) for fp, e, p, _ in incoming]
        sent_after = [ledger.served_after(device[p], (fp, e)) for fp, e, p, _ in incoming]
        est = [0.0] * d
        plans: list[list[tuple]] = [[] for _ in range(d)]
        inverted = [0] * d
        penalty = [0.0] * d  # per device: the seconds of its inverted transfers
        for k in range(d):
            recv = d + k
            booked = plans[k]
            tentative: dict[int, float] = {}  # port -> last tentative finish (all FIFO-earlier)
            fresh: dict[tuple[int, int, float], float] = {}  # this node's own new transfers -> finish
            best = 0.0
            for (fp, e, p, nb), sent, later in zip(incoming, sent_before, sent_after, strict=True):
                kp = device[p]
                unit = (p, k, nb)
                if kp == k:
                    a = fp
                elif unit in units:  # already on its way to v_k
                    a = units[unit][2]
                    booked.append((unit, e))
                elif unit in fresh:
                    a = fresh[unit]
                    booked.append((unit, e))
                else:
                    w = alpha[kp][k] + nb / beta[kp][k]
                    t = fp
                    if sent > t:
                        t = sent
                    got = ledger.served_before(recv, (fp, e))
                    if got > t:
                        t = got
                    for port in (kp, recv):
                        if tentative.get(port, 0.0) > t:
                            t = tentative[port]
                    # t: where the simulator's first-come-first-served ports start it. Exact iff it
                    # finishes before every booked transfer those ports serve after it starts.
                    got = ledger.served_after(recv, (fp, e))
                    if got < later:
                        later = got
                    if t + w > later:  # it would delay them: an inversion (see the module doc)
                        inverted[k] += 1
                        penalty[k] += w
                        t = ledger.earliest(kp, recv, t, w)
                    a = t + w
                    tentative[kp] = tentative[recv] = fresh[unit] = a
                    booked.append((unit, e, fp, kp, recv, t, a))
                if a > best:
                    best = a
            est[k] = best
        self._pending = (i, plans, inverted, penalty)
        return est

    def exact_devices(self, i: int, devices: list[int], finish: list[float]) -> list[int]:
        """With ports, after `arrivals(i)`: the devices among `devices` where o_i's transfers keep
        every port first come, first served (no inversion: the simulator times them as booked), plus
        any inverting device whose finish `finish[k]` beats every exact device's by more than its
        inverted transfers last (serving one first delays the schedule by at most its length, so
        this bounds what the inversion costs). All of them when none is exact, or without ports."""
        if self.ports is None:
            return devices
        _, _, inverted, penalty = self._pending
        exact = [k for k in devices if not inverted[k]]
        if not exact or len(exact) == len(devices):
            return devices
        bar = min(finish[k] for k in exact)
        return [k for k in devices if not inverted[k] or finish[k] + penalty[k] < bar]

    def slot(self, i: int, k: int, est_k: float, insertion: bool = True) -> tuple[float, int, float]:
        """(start, gap, headroom) of o_i's earliest slot on v_k; when the earliest slot leaves no
        memory, the end of the device (a later finish only shortens the outputs alive after it)."""
        dur = self.lists.et[i][k]
        timeline = self.timelines[k]
        if insertion:
            s, g = timeline.earliest_slot(est_k, dur)
        else:
            free = timeline.free_at
            s, g = (free if free > est_k else est_k), -1
        room = self.memory.headroom(k, s + dur, self.resident[i], self.output[i])
        if room < 0 and g >= 0:
            free = timeline.free_at
            s, g = (free if free > est_k else est_k), -1
            room = self.memory.headroom(k, s + dur, self.resident[i], self.output[i])
        return s, g, room

    def allowed(self, i: int, devices) -> list[int]:
        """`devices` restricted to the one o_i must share with its colocated node (DagProblem.colocate)."""
        if self.colocate is None or self.colocate[i] < 0:
            return list(devices)
        k = self.device[self.colocate[i]]
        if k < 0:  # not placed yet (MP-DPS places a merged group at once): no restriction
            return list(devices)
        return [j for j in devices if j == k]

    def no_room(self, i: int, rooms: list[float]) -> int:
        """No device can take o_i: record why (the first time) and return the least-bad device."""
        k = max(self.allowed(i, range(self.d)), key=lambda j: rooms[j])
        if self.reason is None:
            self.reason = (f"{self.problem.label(i)} needs {format_bytes(self.resident[i])} resident + "
                           f"{format_bytes(self.output[i])} output and no device has room (device {k} "
                           f"comes closest, {format_bytes(-rooms[k])} short)")
        return k

    def commit(self, i: int, k: int, start: float, gap: int) -> float:
        if self.ports is not None:
            if self._pending is None or self._pending[0] != i:
                self.port_arrivals(i)
            for booking in self._pending[1][k]:
                if len(booking) == 2:
                    self.ports.share(*booking)
                else:
                    self.ports.book(*booking)
            self.ports.inversions += self._pending[2][k]
            self._pending = None
        finish = start + self.lists.et[i][k]
        self.device[i], self.start[i], self.finish[i] = k, start, finish
        self.timelines[k].place(i, start, finish, gap)
        memory = self.memory
        memory.place(k, finish, self.resident[i], self.output[i])
        if not self.lists.children[i]:
            memory.release(k, finish, self.output[i])
        for p, _ in self.lists.parents[i]:
            if start > self.release_at[p]:
                self.release_at[p] = start
            self.consumers_left[p] -= 1
            if self.consumers_left[p] == 0:
                memory.release(self.device[p], self.release_at[p], self.output[p])
        self.placed += 1
        return finish

    def result(self, stats: dict | None = None) -> DagSchedule:
        order = [tl.nodes for tl in self.timelines]
        if self.ports is None:
            return make_schedule(self.problem, self.device, order, self.start, self.finish, self.reason, stats)
        stats = dict(stats or {}, port_wait_s=self.ports.wait_s, port_inversions=self.ports.inversions)
        return make_schedule(self.problem, self.device, order, self.start, self.finish, self.reason, stats,
                             (self.ports.transfer_start, self.ports.transfer_finish))
