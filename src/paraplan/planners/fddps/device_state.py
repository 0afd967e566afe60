"""What a partial schedule holds per device (planners/fddps/list_scheduling.py: ScheduleBuilder):
its run order with start and finish times and the idle gaps a node can be inserted into
(`DeviceTimeline`), and its memory, an upper bound of the finished schedule's peak (`MemoryLedger`).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort

from paraplan.planners.fddps.problem import DagProblem

INF = math.inf


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
