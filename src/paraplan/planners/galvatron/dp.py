"""Galvatron-BMW's dynamic program (§IV-A, eq. (4), Algorithm 3) and pipeline cost (§V, eq. (8)).

Pure numpy on [layer, strategy] arrays; nothing here knows models or clusters.

`dp_table` is eq. (4) on a discretised memory axis: C(l, E, j) = the least cost of layers 0..l with
layer l under strategy j and forward memory (model states + kept activations) at most E units,

    C(l, E, j) = min_i C(l-1, E - O_f(l, j), i) + R(l, i, j) + c(l, j),

R the transformation (Slice-Gather) cost from layer l-1 under i to layer l under j. The state
carries the previous strategy because R depends on it: O(L E |S|^2) time, O(L E |S|) memory for
the back-pointers. C is non-increasing in E, so one table answers every forward budget at once.

`search_stage` is Algorithm 3. The paper sweeps the forward budget E_fwd upwards and checks the
whole memory E_all (eq. (2)) of each solution. Our memory model (costs/memory.py) counts a stage's
whole memory as forward memory + the largest backward memory O_b of any layer (a checkpointed
layer's recomputation), so we sweep the backward budget b over the distinct O_b values instead:
strategies with O_b > b are masked out and the forward budget is E - b. Every b gives the optimum
whose backward peak is at most b, so the minimum over b is the optimum under the whole-memory
constraint itself, not a heuristic: a restricted search can never beat the full one. Each
solution is then checked in exact bytes (rounding to the memory granularity may hide a little);
when the exact check fails the forward budget steps down one unit at a time (Algorithm 3's check).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

INF = float("inf")


@dataclass(frozen=True)
class StageSolution:
    cost: float  # the DP objective of the chosen strategies (inf: nothing fits)
    choice: tuple[int, ...]  # strategy index per layer
    forward_bytes: float  # exact: sum of O_f
    backward_bytes: float  # exact: max of O_b

    @property
    def memory_bytes(self) -> float:
        return self.forward_bytes + self.backward_bytes


@dataclass(frozen=True)
class Table:
    """Eq. (4)'s tables, strategy-major: C(l, E, j) is row j of layer l's table (each layer's per-class
    minimum then reads whole contiguous rows). Only the first and last layers' tables are kept whole;
    every layer in between keeps the [K, E] minima eq. (4) reads: its per-class minima `lows[l]` (the
    cheapest of each class within E units) and, after the transformation costs, `reads[l + 1]` (what
    layer l + 1's rows read), from which `backtrack` rebuilds a class's rows as `dp_table` summed them.
    K is a sixth of S at 1,024 H100s: the tables take a third of the memory, and writing S x E fresh
    floats per layer (page faults, a sixth of a Galvatron search) is gone."""

    first: np.ndarray  # [S, E]: C(0, E, j)
    last: np.ndarray  # [S, E]: C(L-1, E, j)
    lows: list  # lows[l] ([K, E], l < L-1): min over class k's rows of C(l, E, j)
    reads: list  # reads[l] (flat [K * E] + one inf, l >= 1): layer l's predecessor minima after R
    cost: np.ndarray  # [L, S], rows sorted by class
    classes: np.ndarray  # [S]: each row's layout class as 0..K-1, sorted
    starts: np.ndarray  # [K]: the first row of each class
    trans: np.ndarray | None  # [L, K, K] (None: one class, no transformation cost)
    mem_units: np.ndarray
    perm: np.ndarray  # row j of the tables is strategy perm[j] (rows sorted by class)


def dp_table(cost: np.ndarray, mem_units: np.ndarray, trans: np.ndarray | None, budget: int,
             classes: np.ndarray | None = None) -> Table:
    """Eq. (4) for budgets 0..budget units. cost [L, S] (inf: not allowed), mem_units [L, S] ints
    >= 0. Strategies fall into layout classes (`classes` [S], default one class each): the
    transformation cost depends only on the classes, trans [L, K, K] (trans[l, a, b]: from layer
    l-1 in class a to layer l in class b; row 0 unused), or None for no transformation cost (then
    all strategies form one class). This loop is most of a Galvatron search: strategy-major rows,
    the min-plus step over classes reduced along its first axis, and each layer's read of the
    previous minima one gather through an index shared by layers of the same memory (the layers
    of a transformer) take half the time of the [E, S] form with back pointers (same tables); one
    [S, E] table rewritten in place, the [K, E] minima alone kept (`Table`), saves a fifth more."""
    n_layers, n_strat = cost.shape
    if trans is None:
        classes = np.zeros(n_strat, dtype=np.int64)
    classes = np.arange(n_strat) if classes is None else np.asarray(classes)
    perm = np.argsort(classes, kind="stable")
    cost, mem_units, classes = cost[:, perm], mem_units[:, perm], classes[perm]
    starts = np.flatnonzero(np.r_[True, np.diff(classes) != 0])
    column_class = np.searchsorted(classes[starts], classes)  # each row's class as 0..K-1
    n_class, width = len(starts), budget + 1
    energies = np.arange(width)[None, :]
    first = np.where(energies >= mem_units[0][:, None], cost[0][:, None], INF)  # [S, E]
    table = first.copy() if n_layers > 1 else first
    lows: list = []
    reads: list = [None]
    gathers: dict[bytes, np.ndarray] = {}
    # each class's rows: a min over each slice is 4-5x faster than np.minimum.reduceat along axis 0
    # (measured at 52-121 strategies in 8-20 classes), the same minima
    members = [slice(int(a), int(b)) for a, b in zip(starts, np.r_[starts[1:], n_strat], strict=True)]
    for layer in range(1, n_layers):
        class_low = np.empty((n_class, width))
        for k, rows in enumerate(members):  # [K, E]: the cheapest of each class
            table[rows].min(axis=0, out=class_low[k])
        low = np.empty(n_class * width + 1)  # the minima per class and budget, then one inf to read past the start
        low[-1] = INF
        view = low[:-1].reshape(n_class, width)
        if trans is None:  # one class: the cheapest predecessor of any strategy
            view[:] = class_low
        else:  # [to class, E] = min over from class of C + R
            np.min(class_low[:, None, :] + trans[layer][:, :, None], axis=0, out=view)
        key = mem_units[layer].tobytes()
        if key not in gathers:  # row j at E reads its class at E - O(l, j); below 0, the inf
            index = energies - mem_units[layer][:, None]
            gathers[key] = np.where(index >= 0, column_class[:, None] * width + index, n_class * width)
        np.take(low, gathers[key], out=table)  # take: a third faster than indexing, the same values
        table += cost[layer][:, None]
        lows.append(class_low)
        reads.append(low)
    return Table(first, table, lows, reads, cost, column_class, starts, None if trans is None else np.asarray(trans),
                 mem_units, perm)


def backtrack(t: Table, energy: int) -> tuple[float, tuple[int, ...]]:
    """The cheapest strategies within `energy` units (cost inf: none). Each layer's predecessor class
    is the argmin eq. (4) took (from the previous layer's class minima), then the cheapest of its
    strategies there (the first of the least, as numpy's argmin), rebuilt one by one as `dp_table`
    summed them."""
    last = t.last[:, energy]
    j = int(last.argmin())
    cost = float(last[j])
    if not np.isfinite(cost):
        return INF, ()
    choice = [j]
    # plain lists and scalars: a walk back is thousands of tiny steps (Python's per-call costs were
    # most of it), a class a handful of rows
    mem_units, classes, starts = t.mem_units.tolist(), t.classes.tolist(), t.starts.tolist()
    stops = starts[1:] + [len(t.perm)]
    width = t.first.shape[1]
    for layer in range(len(t.reads) - 1, 0, -1):
        energy -= mem_units[layer][j]
        k = 0 if t.trans is None else int((t.lows[layer - 1][:, energy] + t.trans[layer][:, classes[j]]).argmin())
        if layer == 1:
            j = starts[k] + int(t.first[starts[k]:stops[k], energy].argmin())
        else:
            reads, row_cost, row_units, base = t.reads[layer - 1], t.cost[layer - 1], mem_units[layer - 1], k * width
            best = INF
            j = starts[k]
            for r in range(starts[k], stops[k]):
                read = energy - row_units[r]
                value = (reads[base + read] if read >= 0 else INF) + row_cost[r]
                if value < best:
                    best, j = value, r
        choice.append(j)
    return cost, tuple(int(t.perm[j]) for j in reversed(choice))


def search_stage(cost: np.ndarray, forward_bytes: np.ndarray, backward_bytes: np.ndarray, trans: np.ndarray | None,
                 capacity: float, unit: float, classes: np.ndarray | None = None,
                 pruned: bool = False) -> StageSolution:
    """Algorithm 3 (see the module docstring): the least-cost strategies of one stage whose exact
    whole memory sum(O_f) + max(O_b) is at most `capacity` bytes, at a granularity of `unit` bytes.
    `pruned`: the dominated strategies are out already (`undominated`, which keeps every strategy
    of what it returns)."""
    n_layers = cost.shape[0]
    first, layers = distinct_rows(cost, forward_bytes, backward_bytes)
    keep = np.ones(cost.shape[1], dtype=bool) if pruned else undominated(cost[first], forward_bytes[first],
                                                                         backward_bytes[first], classes)
    if not keep.all():
        solution = search_stage(cost[:, keep], forward_bytes[:, keep], backward_bytes[:, keep],
                                trans, capacity, unit, None if classes is None else np.asarray(classes)[keep]
                                if trans is not None else None, pruned=True)
        index = np.flatnonzero(keep)
        return replace(solution, choice=tuple(int(index[k]) for k in solution.choice))
    rows = np.arange(n_layers)
    mem_units = np.rint(forward_bytes / unit).astype(np.int64)
    levels = np.unique(np.ceil(backward_bytes[np.isfinite(cost)] / unit))  # backward budgets, in units
    # each level's least cost with memory ignored (every layer's cheapest strategy within it) is a
    # lower bound on its dynamic program's answer: levels are tried from the most promising, and one
    # whose bound is no better than the best found is skipped (exact: it cannot win; issue 31 item 5,
    # a third of a search's dynamic programs at 64 GPUs and more)
    distinct = cost[first], forward_bytes[first], backward_bytes[first]
    allowed_at = [np.where(distinct[2] <= level * unit, distinct[0], INF) for level in levels]  # each level's costs
    floors = np.array([memory_floor(c, distinct[1], distinct[2], capacity, layers=layers) for c in allowed_at])
    best = StageSolution(INF, (), INF, INF)
    covered = []  # levels whose every choice is no better than the best: searched, or shown so
    for k in np.argsort(floors, kind="stable"):
        level = levels[k]
        if floors[k] >= best.cost:
            break  # sorted: no later level can do better either
        b = level * unit
        below = [c for c in covered if c < level]
        covered.append(level)
        # a level above one covered already holds that one's choices (on less forward memory: none
        # better) and those that take a strategy of O_b between the two; when the floor of these
        # alone is no better than the best, the level is skipped (not in the paper; half of the
        # dynamic programs at 1,024 H100s). Exact for eq. (4)'s optimum; Algorithm 3's walk in exact
        # bytes could in principle pass over, below, a tie this level would take: the same solutions
        # in all 12,315 searches compared (64 / 1,024 / 16,384 H100s, GPT-2 XL on 8 TITANs, Llama 2
        # 7B-70B on 64-1,024 A100s)
        if below and memory_floor(allowed_at[k], distinct[1], distinct[2], capacity, layers=layers,
                                  fresh=distinct[2] > max(below) * unit) >= best.cost:
            continue
        masked = np.where(backward_bytes <= b, cost, INF)
        budget = int(np.floor((capacity - b) / unit)) + n_layers // 2 + 1  # rounding may hide up to L/2 units
        if budget < 0 or not np.isfinite(masked.min(axis=1)).all():
            continue
        # every layer at its least forward memory allowed here already over the budget: the dynamic
        # program would find nothing (exact; at thousands of GPUs most stages of the variants without
        # CKPT are such, and their tables were most of those searches)
        allowed = np.isfinite(masked)
        least = np.where(allowed, mem_units, np.iinfo(np.int64).max).min(axis=1)
        if int(least.sum()) > budget:
            continue
        # every layer's units counted above its least: the tables shift by a constant per layer, and
        # energies below what the layers so far must hold (inf) or above what the later ones leave
        # (never read) are not computed: the same tables on the budget less the least sum, a third of
        # their width at 1,024 H100s (not in the paper; exact)
        table = dp_table(masked, np.where(allowed, mem_units - least[:, None], 0), trans, budget - int(least.sum()),
                         classes)
        for energy in range(budget - int(least.sum()), -1, -1):  # Algorithm 3's whole-memory check, in exact bytes
            if not table.last[:, energy].min() < best.cost:  # (inf or no better: the table says so, no walk back)
                break
            value, choice = backtrack(table, energy)
            idx = np.array(choice)
            fwd = float(forward_bytes[rows, idx].sum())
            bwd = float(backward_bytes[rows, idx].max())
            if fwd + bwd <= capacity:
                best = StageSolution(value, choice, fwd, bwd)
                break
    return best


def distinct_rows(*arrays: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The layers' distinct rows across `arrays` ([L, S] each): the first layer of each, and each
    layer's. A stage of a transformer's blocks has two or three, so the dominance test and the levels'
    floors read those alone, with the same answers (np.unique over rows took longer than it saved)."""
    seen: dict[bytes, int] = {}
    first, layers = [], []
    for i in range(arrays[0].shape[0]):
        key = b"".join(a[i].tobytes() for a in arrays)
        if key not in seen:
            seen[key] = len(first)
            first.append(i)
        layers.append(seen[key])
    return np.array(first, dtype=np.int64), np.array(layers, dtype=np.int64)


def memory_floor(cost: np.ndarray, forward_bytes: np.ndarray, backward_bytes: np.ndarray, capacity: float,
                 steps: int = 49, layers: np.ndarray | None = None, fresh: np.ndarray | None = None) -> float:
    """A lower bound on the least cost of one stage within `capacity` bytes (cost [L, S], inf where a
    strategy is not allowed), its memory counted: the Lagrangian relaxation of the whole-memory
    constraint, max over lambda >= 0 of sum_l min_j (c[l, j] + lambda O_f[l, j]) - lambda E_f, where
    E_f = capacity - the least backward peak any choice has (sum O_f + max O_b <= capacity). Any
    lambda gives a bound (a choice within memory pays at most lambda E_f for its forward memory), so
    a grid of them does; lambda = 0 is the cheapest strategy per layer with memory ignored. The
    transformation costs R >= 0 are left out. Not in the paper: it lets `search_stage` skip backward
    levels whose dynamic program cannot beat the best found (exact: the same optimum). `layers`: the
    arrays hold distinct rows, layers[l] the row of layer l (summed over the layers as without it).
    `fresh` ([L, S] bool): the bound on the choices that take at least one of these strategies (in
    the layer where that costs the least above its cheapest; the other layers at their cheapest)."""
    allowed = np.isfinite(cost)
    if not allowed.any(axis=1).all() or (fresh is not None and not (fresh & allowed).any()):
        return INF

    def least(values):  # [..., rows, S] -> [...]: the cheapest per layer, summed (with a fresh one)
        cheapest = values.min(axis=-1)
        cheapest = cheapest if layers is None else cheapest[..., layers]
        if fresh is None:
            return cheapest.sum(axis=-1)
        taken = np.where(fresh, values, INF).min(axis=-1)
        taken = taken if layers is None else taken[..., layers]
        return cheapest.sum(axis=-1) + (taken - cheapest).min(axis=-1)

    free = float(least(cost))  # lambda = 0
    least_peak = float(np.where(allowed, backward_bytes, INF).min(axis=1).max())
    budget = capacity - least_peak
    if budget <= 0:
        return INF
    fwd = np.where(allowed, forward_bytes, 0.0)
    scale = max(free, 1e-30) / budget  # cost per byte, were the floor spread over the budget
    lambdas = scale * np.logspace(-3, 3, steps)
    values = least(cost[None, :, :] + lambdas[:, None, None] * fwd[None, :, :]) - lambdas * budget
    return max(free, float(values.max()))


def undominated(cost: np.ndarray, forward_bytes: np.ndarray, backward_bytes: np.ndarray,
                classes: np.ndarray | None) -> np.ndarray:
    """Strategies worth keeping: j is dropped when another strategy k of the same layout class
    (the same transformation costs) is no worse on every layer in cost, forward and backward memory
    (ties: the lower index stays). Dropping j cannot change the optimum: k is allowed wherever j is."""
    n_strat = cost.shape[1]
    classes = np.arange(n_strat) if classes is None else np.asarray(classes)
    c, f, b = cost.T, forward_bytes.T, backward_bytes.T  # [S, L]
    no_worse = ((c[:, None, :] <= c[None, :, :]) & (f[:, None, :] <= f[None, :, :])
                & (b[:, None, :] <= b[None, :, :])).all(axis=2)  # [k, j]: k no worse than j
    same = classes[:, None] == classes[None, :]
    equal = ((c[:, None, :] == c[None, :, :]) & (f[:, None, :] == f[None, :, :])
             & (b[:, None, :] == b[None, :, :])).all(axis=2)
    lower = np.arange(n_strat)[:, None] < np.arange(n_strat)[None, :]
    beats = same & no_worse & (~equal | lower)
    np.fill_diagonal(beats, False)
    return ~beats.any(axis=0)


def pipeline_cost(stage_s, sync_s, sends_s, n_micro: int) -> float:
    """Eq. (8): (m - 1) x max_i (C(M_i, B_m) - C(M_i, 0)) + sum_i C(M_i, B_m), where C(M_i, B_m) is
    stage i's forward + backward of one micro-batch plus, on the last micro-batch, its gradient
    synchronisation C(M_i, 0) (`sync_s`: what the sync adds beyond the overlapped backward);
    `sends_s` (the activations and gradients crossing stage boundaries) lie on the path of the
    first and last micro-batch only."""
    stage_s = np.asarray(stage_s, float)
    return float((n_micro - 1) * stage_s.max() + stage_s.sum() + np.sum(sync_s) + np.sum(sends_s))


def partition_min_max(weights: np.ndarray, n_stages: int) -> tuple[int, ...]:
    """Layer counts of the contiguous partition into `n_stages` non-empty stages that minimises the
    largest stage sum, where weights[s, l] is layer l's weight on stage s (stage-dependent: 1F1B
    keeps more micro-batches in flight on early stages)."""
    n_stages_w, n_layers = weights.shape
    prefix = np.concatenate((np.zeros((n_stages_w, 1)), np.cumsum(weights, axis=1)), axis=1)
    best = np.full((n_stages + 1, n_layers + 1), INF)
    arg = np.zeros((n_stages + 1, n_layers + 1), dtype=np.int64)
    best[0, 0] = 0.0
    for s in range(1, n_stages + 1):
        for stop in range(s, n_layers - (n_stages - s) + 1):
            starts = np.arange(s - 1, stop)
            values = np.maximum(best[s - 1, starts], prefix[s - 1, stop] - prefix[s - 1, starts])
            k = int(np.argmin(values))
            best[s, stop], arg[s, stop] = values[k], starts[k]
    sizes, stop = [], n_layers
    for s in range(n_stages, 0, -1):
        start = int(arg[s, stop])
        sizes.append(stop - start)
        stop = start
    return tuple(reversed(sizes))
