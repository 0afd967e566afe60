"""Does a contiguous pipeline stage fit its device? The simulator's memory count, O(1) a candidate.

The searches of csimd, the partition baselines and gropipe compare up to millions of stages; the
judge (the simulator, costs/memory.py `plan_memory`) is far too slow for that. `StageMemory`
counts exactly what `costs.memory.stage_memory` counts for a stage of consecutive layers run data
parallel over its devices (no per-layer strategies, no separate backward range), from prefix sums
over layers of costs/strategy.py `layer_memory`:

    peak(first..stop-1 on stage s of N) = reserve + states + in_flight(s, N) x saved
                                          + stash_versions(s, N) x weights + tied copies

with in_flight from `costs.memory.micro_batches_in_flight` (GPipe: every micro-batch; 1F1B:
min(N - s, p)), a weight stash only under async 1F1B (N - s - 1 versions), and the few tied
weights (GPT-2's head) looked at one by one. LayerStrategy() never checkpoints, so no layer
recomputes. tests/unit/test_planner_fit.py holds it equal to the simulator's count.

CSIMD eq. (8) knows no memory; the paper adds that "the peak memory of the workload in each GPU
cannot exceed that of the corresponding GPU" (§V) without putting it in the search. Here it is a
constraint of the search: `SplitMemory` gives the branch and bound a per-stage mask, a dividing
heuristic that always fits when anything does (`fitting_cuts`), and the division closest to
fitting when nothing does (`least_overflow_cuts`).
"""

from __future__ import annotations

import numpy as np

from paraplan.costs.memory import loss_gradient_bytes, micro_batches_in_flight
from paraplan.costs.memory_config import MemoryConfig
from paraplan.costs.model import CostModel
from paraplan.costs.strategy import layer_memory
from paraplan.planners.stage_division import bounds_of
from paraplan.plans.plan import LayerStrategy

_SLACK = 1 + 1e-12  # a sum equal to a limit is not lost to rounding


def _prefix(values) -> np.ndarray:
    return np.concatenate(([0.0], np.cumsum(np.asarray(values, float))))


class StageMemory:
    """Peak bytes of contiguous stages at one micro-batch size (see the module docstring).

    `micro` is the plan's micro-batch (global batch / n_micro) entering a stage; `dp` the number of
    devices of every stage (GroPipe's groups), which each take micro / dp samples."""

    def __init__(self, cm: CostModel, micro: float, n_micro: int, schedule: str, dp: int = 1):
        model, config = cm.model, cm.memory or MemoryConfig()
        strategy = LayerStrategy(dp=dp)
        per_layer = [layer_memory(model, i, strategy, micro, config) for i in range(model.n_layers)]
        assert not any(m.recompute_bytes for m in per_layer)  # no checkpointing (costs/strategy.py)
        self.n_layers = model.n_layers
        self.n_micro = n_micro
        self.schedule = str(schedule)
        self.reserve = float(config.reserve_bytes)
        # mixed precision: autocast's 16-bit weight copies count with the states (costs/memory.py)
        self.states = _prefix([m.states_bytes + m.copy_bytes for m in per_layer])
        self.saved = _prefix([m.saved_bytes for m in per_layer])
        self.weights = _prefix([m.weights_bytes for m in per_layer])
        # the stage holding the loss peaks at its backward with the loss's gradients (costs/memory.py)
        self.loss_gradients = loss_gradient_bytes(model, strategy, micro)
        # (layer, owners, extra states, extra weights) of a tied weight held without its owner
        self.tied = []
        for i, layer in enumerate(model.layers):
            if layer.shared_param_bytes:
                copy = layer_memory(model, i, strategy, micro, config, tied_copy=True)
                self.tied.append((i, tuple(layer.shared_owners), (copy.states_bytes + copy.copy_bytes)
                                  - (per_layer[i].states_bytes + per_layer[i].copy_bytes),
                                  copy.weights_bytes - per_layer[i].weights_bytes))
        self._counts: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._running: dict[tuple[float, float], np.ndarray] = {}

    def counts(self, n_stages: int) -> tuple[np.ndarray, np.ndarray]:
        """Per stage index of an n_stages pipeline: micro-batches in flight, weight versions stashed."""
        if n_stages not in self._counts:
            flight = np.array([micro_batches_in_flight(self.schedule, n_stages, s, self.n_micro)
                               for s in range(n_stages)], float)
            stash = np.array([n_stages - s - 1 if self.schedule == "async-1f1b" else 0
                              for s in range(n_stages)], float)
            self._counts[n_stages] = (flight, stash)
        return self._counts[n_stages]

    def running(self, in_flight: float, stash: float) -> np.ndarray:
        """Prefix sums over layers of a stage's bytes at these counts, less reserve and tied copies."""
        key = (in_flight, stash)
        if key not in self._running:
            self._running[key] = self.states + in_flight * self.saved + stash * self.weights
        return self._running[key]

    def peak(self, first, stop, stage, n_stages: int) -> np.ndarray:
        """Peak bytes of stages holding layers first..stop-1 at index `stage` of n_stages (arrays
        broadcast together)."""
        first, stop, stage = np.asarray(first), np.asarray(stop), np.asarray(stage)
        flight, stash = self.counts(n_stages)
        total = (self.reserve + self.states[stop] - self.states[first]
                 + flight[stage] * (self.saved[stop] - self.saved[first])
                 + stash[stage] * (self.weights[stop] - self.weights[first])
                 + (stop == self.n_layers) * self.loss_gradients)
        for i, owners, extra_states, extra_weights in self.tied:
            held = (first <= i) & (i < stop)
            alone = np.zeros(np.broadcast(first, stop).shape, dtype=bool)
            for o in owners:
                alone |= (o < first) | (o >= stop)
            total = total + (held & alone) * (extra_states + stash[stage] * extra_weights)
        return total

    def division_peaks(self, cuts) -> np.ndarray:
        b = bounds_of(cuts, self.n_layers)
        n = len(b) - 1
        return self.peak(np.array(b[:-1]), np.array(b[1:]), np.arange(n), n)


def overflow(prediction) -> float:
    """The largest peak / capacity over a predicted plan's devices: at most 1 when it fits."""
    return max((m.peak_bytes / max(m.capacity_bytes, 1) for m in prediction.memory), default=0.0)


def misfit(overflow: float) -> float:
    """A sort key for plans by how far they are from fitting: 0 when they fit (overflow, the
    largest peak / capacity, at most 1), else the overflow to 6 digits, so that a few bytes do not
    make a much slower plan the closest."""
    return 0.0 if overflow <= 1.0 else round(overflow, 6)


def fits_bytes(peak, capacity) -> np.ndarray:
    """The simulator's verdict: peak bytes rounded to whole bytes, at most the capacity."""
    return np.round(peak) <= capacity


class SplitMemory:
    """Memory of a split search's candidates: one `StageMemory` per row (CSIMD: per candidate
    micro-batch count, the rows of pipeline_split.SplitProblem), stage s on a device (group) of
    capacities[s] bytes."""

    def __init__(self, rows, capacities):
        self.rows = list(rows)
        self.capacity = np.asarray(capacities, float)
        self.n_layers = self.rows[0].n_layers
        # where a stage's verdict depends on its place: unequal devices on its index from the first
        # stage; 1F1B's in-flight count and async's stash on its distance from the last (GPipe's on
        # neither)
        self.uneven = len(set(self.capacity.tolist())) > 1
        self.from_end = self.rows[0].schedule != "gpipe"

    @classmethod
    def for_micro_counts(cls, cm: CostModel, batch: int, n_micro_values, schedule: str, capacities) -> SplitMemory:
        """One row per candidate micro-batch count p, at the micro-batch batch / p."""
        return cls([StageMemory(cm, batch / p, p, schedule) for p in n_micro_values], capacities)

    def subset(self, rows) -> SplitMemory:
        """The same check for some of the rows only (a fixed micro-batch count)."""
        return SplitMemory([self.rows[r] for r in rows], self.capacity)

    def stage_fits(self, row: int, n_stages: int):
        """fits(stage indices, first layers, stop) -> mask, for the branch and bound; n_stages is
        the division's stage count (any count under GPipe, whose counts do not depend on it)."""
        memory = self.rows[row]

        def fits(stage, first, stop):
            return fits_bytes(memory.peak(first, stop, stage, n_stages), self.capacity[stage])

        return fits

    def stage_fits_from_end(self, row: int, n_max: int):
        """fits(stages after this one, first layers, stop) -> mask on equal devices, for a search
        that runs from the last layer (1F1B counts by the distance from the last stage, which such
        a search knows: stage s of N has N - 1 - s stages after it, whatever N is)."""
        memory = self.rows[row]
        capacity = float(self.capacity[0])

        def fits(after, first, stop):
            return fits_bytes(memory.peak(first, stop, n_max - 1 - np.asarray(after), n_max), capacity)

        return fits

    def can_fit(self, row: int, n_stages: int) -> bool:
        """False only when no division into at most n_stages stages fits (tied copies, which only
        add bytes, left out: a proof, not a guess); the searches skip such rows."""
        none = np.zeros(self.n_layers + 1)
        return self._greedy(row, n_stages, none, np.inf, 1.0, tied=False) is not None

    def overflow(self, row: int, cuts) -> float:
        """The largest peak / capacity over the division's devices: at most 1 when it fits."""
        peaks = np.round(self.rows[row].division_peaks(cuts))
        return float(np.max(peaks / np.maximum(self.capacity[:len(peaks)], 1.0)))

    def division_fits(self, row: int, cuts) -> bool:
        return self.overflow(row, cuts) <= 1.0

    def _greedy(self, row: int, n_stages: int, time_prefix: np.ndarray, time_limit: float, scale: float,
                tied: bool = True):
        """Fewest stages (at most n_stages) whose compute is at most time_limit and whose memory is
        at most scale x capacity; None when it needs more. Each stage takes as many layers as both
        limits allow: with two sums that grow with the stage, no packing's k-th stage ends later
        (an exchange argument, as for MASP), so the greedy fails only when every packing does.
        GPipe's counts do not depend on a stage's place: stages are packed from the first, each
        against its own device. 1F1B's in-flight count (and async's stash) depends on the distance
        from the last stage: on equal devices they are packed from the last; on unequal ones from
        the first, once for every stage count (a packing into fewer stages than counted keeps
        fewer in flight, so it fits too). A tied copy (GPT-2's head without the embedding) is
        counted by stepping a stage's end back until the exact count fits; that the stage could
        fit again by reaching the owner is not tried (tied=False leaves tied copies out)."""
        memory = self.rows[row]
        limits = (time_prefix, time_limit, scale, tied)
        if memory.schedule == "gpipe":
            return self._from_first(memory, n_stages, n_stages, *limits)
        if len(set(self.capacity[:n_stages].tolist())) <= 1:
            return self._from_last(memory, n_stages, *limits)
        for n in range(1, n_stages + 1):
            cuts = self._from_first(memory, n, n, *limits)
            if cuts is not None:
                return cuts
        return None

    def _from_first(self, memory: StageMemory, n_stages: int, counted: int, time_prefix, time_limit, scale, tied):
        flight, stash = memory.counts(counted)
        capacity = np.maximum(self.capacity, 1.0)
        start, cuts, k = 0, [], self.n_layers
        for s in range(n_stages):
            used = memory.running(float(flight[s]), float(stash[s]))
            room = scale * capacity[s] - memory.reserve
            stop = min(int(np.searchsorted(used, used[start] + room * _SLACK, side="right")) - 1,
                       int(np.searchsorted(time_prefix, time_prefix[start] + time_limit * _SLACK, side="right")) - 1,
                       k)
            while stop > start and tied and memory.tied and memory.peak(start, stop, s, counted) > scale * capacity[s]:
                stop -= 1
            if stop <= start:
                return None
            if stop == k:
                return tuple(cuts)
            cuts.append(stop - 1)
            start = stop
        return None

    def _from_last(self, memory: StageMemory, n_stages: int, time_prefix, time_limit, scale, tied):
        flight, stash = memory.counts(n_stages)  # stage n_stages - 1 - t has t stages after it
        room_bytes = scale * max(float(self.capacity[0]), 1.0)
        stop, cuts = self.n_layers, []
        for t in range(n_stages):
            s = n_stages - 1 - t
            used = memory.running(float(flight[s]), float(stash[s]))
            start = max(int(np.searchsorted(used, used[stop] - (room_bytes - memory.reserve) * _SLACK, side="left")),
                        int(np.searchsorted(time_prefix, time_prefix[stop] - time_limit * _SLACK, side="left")))
            while start < stop and tied and memory.tied and memory.peak(start, stop, s, n_stages) > room_bytes:
                start += 1
            if start >= stop:
                return None
            if start == 0:
                return tuple(sorted(cuts))
            cuts.append(start - 1)
            stop = start
        return None

    def fitting_cuts(self, row: int, n_stages: int, layer_times) -> tuple[int, ...] | None:
        """A division into at most n_stages stages that fits, balancing `layer_times` (forward +
        backward compute) as well as memory allows: the least compute limit the greedy packs, by
        bisection. None when no division fits (up to tied copies, which the caller checks)."""
        t = _prefix(layer_times)
        hi = float(t[-1]) * (1 + 1e-9) + 1e-300
        best = self._greedy(row, n_stages, t, np.inf, 1.0)
        if best is None:
            return None
        lo = float(np.max(layer_times)) if len(layer_times) else 0.0
        for _ in range(100):
            if hi - lo <= 1e-9 * hi:
                break
            mid = (lo + hi) / 2
            cuts = self._greedy(row, n_stages, t, mid, 1.0)
            if cuts is None:
                lo = mid
            else:
                hi, best = mid, cuts
        return best

    def least_overflow_cuts(self, row: int, n_stages: int) -> tuple[int, ...]:
        """The division into at most n_stages stages with the smallest largest peak / capacity (up
        to tied copies): the one closest to fitting, by bisection on that ratio."""
        t = np.zeros(self.n_layers + 1)
        lo, hi = 0.0, 1.0
        best = self._greedy(row, n_stages, t, np.inf, hi)
        while best is None:  # one stage of everything fits some finite scale
            lo, hi = hi, hi * 2
            best = self._greedy(row, n_stages, t, np.inf, hi)
        for _ in range(100):
            if hi - lo <= 1e-9 * hi:
                break
            mid = (lo + hi) / 2
            cuts = self._greedy(row, n_stages, t, np.inf, mid)
            if cuts is None:
                lo = mid
            else:
                hi, best = mid, cuts
        return best
