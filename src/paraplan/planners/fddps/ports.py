"""The send and receive ports of the DAG schedulers' devices: `PortLedger` books a partial schedule's
transfers on them (used by list_scheduling.ScheduleBuilder when links="ports").

Link contention (links="ports", ours, beyond the FD-DPS paper): the paper's eqs. (6)-(11) let every
transfer start the moment its data is ready, while the simulator (simulator/engine.py, contention on
by default) gives every device one send port and one receive port and serializes the transfers on
each. On real graphs the contended iteration of a contention-free schedule is often 2x its own
length. `PortLedger` books transfers the way contention-aware list scheduling does (Sinnen & Sousa,
"List scheduling with contention", 2005, with the simulator's ports as the links): when o_i is
considered for v_k, each incoming transfer from a parent on another device is booked at or after
the parent's finish on the parent device's send port and v_k's receive port; EST(o_i, v_k) (the
slot search and the device choice) includes those waits, and the chosen device's bookings are
committed with o_i. Booked transfers never move, like placed nodes. As in the simulator
(simulator/dag.py), a tensor goes to a device once per (producer, destination device, bytes): later
consumers there share the booked transfer. A zero-length transfer still waits for busy ports.

Where the booking starts is the simulator's rule: its ports serve transfers first come, first
served by ready time (ties: edge index = task id), so a transfer starts at max(ready, the finishes
of the transfers on its two ports that became ready before it). That is exact (the simulator will
time it so) when it also finishes before every booked transfer on those ports that became ready
after it, which it would otherwise delay. If not, it is an "inversion": the transfer is booked in
the earliest interval where both ports are free (Sinnen & Sousa's insertion), i.e. behind a transfer
that became ready later, which the simulator would not do. The device choice avoids inversions:
devices where o_i's transfers invert nothing are preferred, and an inverting device stays in the
running only if its finish beats every exact device's by more than its inverted transfers last
(a heuristic bound: serving one transfer first delays the others by about its length). Without
inversions the schedule equals the simulator's timing bit for bit (`port_replay.replay_ports`,
tests/unit/test_dag_ports.py; one caveat: transfers ready at the same instant are ordered by edge
index here, by the engine's heap, which agrees unless zero-duration tasks chain up to that instant);
`stats["port_inversions"]` counts them otherwise. Inversions come mostly from
training graphs' saved activations: a backward node placed late needs a tensor that became ready
in the forward pass, on ports booked in between.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right

from paraplan.planners.fddps.problem import DagProblem

INF = math.inf


class PortLedger:
    """The booked transfers of a partial schedule on every device's send and receive port (see the
    module doc): per port its busy intervals [start, finish) sorted by time, and its transfers by
    FIFO key (ready time, edge index) with their starts and finishes. Port p is device p's send port
    for p < d and device p - d's receive port otherwise. A transfer carries one tensor to one device
    (`units`: (producer, destination device, bytes) -> [key, start, finish]); every edge from that
    producer to a consumer there with those bytes shares it, as in the simulator."""

    def __init__(self, problem: DagProblem):
        d, n_edges = problem.n_devices, problem.n_edges
        self.d = d
        self.starts: list[list[float]] = [[] for _ in range(2 * d)]
        self.finishes: list[list[float]] = [[] for _ in range(2 * d)]
        self.keys: list[list[tuple[float, int]]] = [[] for _ in range(2 * d)]
        self.key_starts: list[list[float]] = [[] for _ in range(2 * d)]
        self.key_finishes: list[list[float]] = [[] for _ in range(2 * d)]
        self.latest: list[float] = [0.0] * (2 * d)  # the last finish on each port
        self.in_edges: list[list[tuple[int, float, int]]] = [[] for _ in range(problem.n_nodes)]
        for e, (a, b, nb) in enumerate(zip(problem.edge_src.tolist(), problem.edge_dst.tolist(),
                                           problem.edge_bytes.tolist(), strict=True)):
            self.in_edges[b].append((a, nb, e))
        self.units: dict[tuple[int, int, float], list] = {}
        self.transfer_start = [math.nan] * n_edges
        self.transfer_finish = [math.nan] * n_edges
        self.wait_s = 0.0  # committed transfers: seconds spent waiting for a port after the data was ready
        self.inversions = 0  # committed transfers the simulator serves in another order than booked

    def served_before(self, port: int, key: tuple[float, int]) -> float:
        """The latest finish of the transfers booked on `port` that the simulator serves before one
        with FIFO key `key` (0 if none)."""
        keys = self.keys[port]
        if not keys or keys[-1] < key:
            return self.latest[port]
        pos = bisect_left(keys, key)
        return max(self.key_finishes[port][:pos], default=0.0)

    def served_after(self, port: int, key: tuple[float, int]) -> float:
        """The earliest start of the transfers booked on `port` that the simulator serves after one
        with FIFO key `key` (inf if none): a transfer finishing later would delay them there."""
        keys = self.keys[port]
        if not keys or keys[-1] < key:
            return INF
        pos = bisect_right(keys, key)
        return min(self.key_starts[port][pos:], default=INF)

    def earliest(self, send: int, recv: int, t: float, w: float) -> float:
        """The earliest t' >= t with [t', t' + w) clear of both ports' booked intervals (a booked
        [s, f) blocks it iff s < t' + w and t' < f: a zero-length transfer may sit at an interval's
        end or start, never inside it)."""
        s1, f1, s2, f2 = self.starts[send], self.finishes[send], self.starts[recv], self.finishes[recv]
        while True:
            j = bisect_right(f1, t)  # the first interval finishing after t; the ones before never block
            if j < len(s1) and s1[j] < t + w:
                t = f1[j]
                continue
            j = bisect_right(f2, t)
            if j < len(s2) and s2[j] < t + w:
                t = f2[j]
                continue
            return t

    def book(self, unit: tuple[int, int, float], e: int, ready: float, send: int, recv: int, start: float,
             finish: float) -> None:
        key = (ready, e)
        for port in (send, recv):
            j = bisect_right(self.finishes[port], start)
            self.starts[port].insert(j, start)
            self.finishes[port].insert(j, finish)
            self._insert_key(port, key, start, finish)
            if finish > self.latest[port]:
                self.latest[port] = finish
        self.units[unit] = [key, start, finish, send, recv]
        self.transfer_start[e], self.transfer_finish[e] = start, finish
        self.wait_s += start - ready

    def share(self, unit: tuple[int, int, float], e: int) -> None:
        """Edge e rides on the booked transfer `unit`. The simulator numbers a shared transfer by its
        first edge, so a lower e moves it ahead in the FIFO order among transfers ready at the same
        instant; if one on its ports lies in between, the simulator serves them in the other order:
        counted as an inversion."""
        entry = self.units[unit]
        key, start, finish, send, recv = entry
        self.transfer_start[e], self.transfer_finish[e] = start, finish
        if e >= key[1]:
            return
        new = (key[0], e)
        for port in (send, recv):
            keys = self.keys[port]
            j = bisect_left(keys, key)
            del keys[j], self.key_starts[port][j], self.key_finishes[port][j]
            if bisect_left(keys, new) != j:  # a transfer ready at the same instant now comes after it
                self.inversions += 1
            self._insert_key(port, new, start, finish)
        entry[0] = new

    def tentative_arrivals(self, i: int, lists, device: list[int], finish: list[float]):
        """EST(o_i, v_k) with link contention (list_scheduling.ScheduleBuilder.port_arrivals): for
        every k, o_i's incoming transfers from other devices booked tentatively in FIFO order (parent
        finish, edge index) where the simulator's first-come-first-served ports would start them (or,
        for an inversion, in the earliest interval both ports are free); a tensor already sent to v_k
        is not sent again. Returns the arrivals and, per device, the bookings, how many of them
        invert FIFO and their seconds (for `commit`)."""
        d = self.d
        alpha, beta, units = lists.alpha, lists.beta, self.units
        incoming = sorted((finish[p], e, p, nb) for p, nb, e in self.in_edges[i])
        # the send-port bounds are the same for every k: the transfers its port serves before and after
        sent_before = [self.served_before(device[p], (fp, e)) for fp, e, p, _ in incoming]
        sent_after = [self.served_after(device[p], (fp, e)) for fp, e, p, _ in incoming]
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
                    got = self.served_before(recv, (fp, e))
                    if got > t:
                        t = got
                    for port in (kp, recv):
                        if tentative.get(port, 0.0) > t:
                            t = tentative[port]
                    # t: where the simulator's first-come-first-served ports start it. Exact iff it
                    # finishes before every booked transfer those ports serve after it starts.
                    got = self.served_after(recv, (fp, e))
                    if got < later:
                        later = got
                    if t + w > later:  # it would delay them: an inversion (see the module doc)
                        inverted[k] += 1
                        penalty[k] += w
                        t = self.earliest(kp, recv, t, w)
                    a = t + w
                    tentative[kp] = tentative[recv] = fresh[unit] = a
                    booked.append((unit, e, fp, kp, recv, t, a))
                if a > best:
                    best = a
            est[k] = best
        return est, (i, plans, inverted, penalty)

    def _insert_key(self, port: int, key: tuple[float, int], start: float, finish: float) -> None:
        j = bisect_left(self.keys[port], key)
        self.keys[port].insert(j, key)
        self.key_starts[port].insert(j, start)
        self.key_finishes[port].insert(j, finish)
