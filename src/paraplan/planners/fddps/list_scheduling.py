"""Machinery shared by the DAG schedulers (FD-DPS and its baselines): a builder that commits
placements with exactly `replay`'s arithmetic (`ScheduleBuilder`), on the devices' timelines and
memory ledger (planners/fddps/device_state.py) and, with links="ports", their send and receive ports
(planners/fddps/ports.py). The critical-path numbers (mean costs, static levels, the full EST/LST
pass of eqs. (6)-(10)) are planners/fddps/critical_path.py.

Link contention (links="ports", ours, beyond the FD-DPS paper): the transfers of a partial schedule
booked on every device's send and receive port, planners/fddps/ports.py (`PortLedger`; its module doc has
the port model, the booking rule and why).
"""

from __future__ import annotations

import math

from paraplan.planners.fddps.device_state import DeviceTimeline, MemoryLedger
from paraplan.planners.fddps.ports import PortLedger
from paraplan.planners.fddps.problem import DagProblem, DagSchedule, format_bytes, make_schedule

INF = math.inf
LINKS = ("free", "ports")  # the paper's contention-free links | one send and one receive port per device (ours)


def check_links(links: str) -> None:
    if links not in LINKS:
        raise ValueError(f"links must be one of {LINKS}, got {links!r}")


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
        """EST(o_i, v_k) with link contention: o_i's incoming transfers booked tentatively on the
        ports (PortLedger.tentative_arrivals), kept for `commit`."""
        est, self._pending = self.ports.tentative_arrivals(i, self.lists, self.device, self.finish)
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
