"""A lower bound on any plan's iteration time, to say how far the best plan found is from the best
possible (`paraplan plan --planner auto`). The largest of valid bounds; the report names the one
that binds.

Work: every layer must process the whole global batch B, forward and backward, once. A plan splits
it into pieces (micro-batches, data-parallel slices) of some size p dividing B, so layer i costs at
least min over p | B of t_i(p) B / p device-seconds on the fastest device, t_i the cost model's
forward + backward time. Tensor parallelism divides a piece's work among devices but never below
that total (ideal scaling, communication free). Spread perfectly over the n devices:

    T >= W / n,   W = sum_i min_{p | B} t_i(p) B / p

Memory (issue 31, item 4): a plan that runs B in m micro-batches holds, summed over its devices at
their peaks, at least one copy of the model states S and the saved activations of one micro-batch
b = B / m of every layer (each layer is in flight for at least one micro-batch; data-parallel
replicas' slices add up to b, tensor/sequence/context parallel shards add up to the whole): so

    S + sum_i saved_i(b, r_i) <= sum_d (capacity_d - reserve)

where r_i is layer i's recomputation (none, selective: the attention core, full: only its input
kept), which costs its forward (or the core's share) again. Its pieces are no larger than b.
Choosing r_i to minimise the work subject to that memory is a multiple-choice knapsack; its
Lagrangian dual is a lower bound on it (weak duality), exact when memory does not bind:

    T >= min_{b | B} max_{lambda >= 0} [ sum_i min_r (w_i(r, b) + lambda saved_i(b, r))
                                         - lambda (C - S) ] / n

with w_i(r, b) = min_{p | b} t_i(r, p) B / p. A micro-batch whose least memory (full recomputation
everywhere) does not fit is no plan's. This is what binds when memory forces small micro-batches
(GEMMs below their best efficiency) or recomputation (Llama-70B-like models at 64 GPUs).

Operator placements (FD-DPS and its baselines: one iteration, no micro-batches, no recomputation,
costs/op_memory.py's count) get their own family, priced as the simulator prices them (costs/
op_costs.py, not the layers' cost model: on small models their operators cost 2-5x less than the
layers' forward + backward): every operator of the whole batch once, each on its fastest device,

    T >= W_op / n,   W_op = sum_o min_v ET(o, v, B)

(an operator split into d parts costs at least as much in all: each part pays the kernel's fixed
costs again), where one copy of the states and the forward outputs the backward reads at the
whole batch fit the devices' total memory; where they do not, no placement fits and the family
drops out. The bound is the lesser of the two families' bounds.

Not bounded (each would need a proof for every planner's plans, not yet written): the pipeline
bubble (zero-bubble schedules make it near zero, and uneven device groups per stage break the
classic (m + P - 1) / m form), and communication (every layer could run on one group with no
gradient sync, paying activation traffic instead). Transfers, bubbles, synchronisation and
optimizer steps only add to it. It is a bound on the *cost model*: a plan judged by the simulator
with the same costs is never faster (tests/unit/test_bound.py checks every planner's feasible plans
on random small requests).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from paraplan.costs.model import CostModel
from paraplan.costs.strategy import layer_memory
from paraplan.planners.divisors import divisors
from paraplan.plans.plan import LayerStrategy, Recompute


@dataclass(frozen=True)
class LowerBound:
    iteration_s: float  # no plan is faster than this
    work_s: float  # the least device-seconds of forward + backward for one iteration
    one_device_s: float  # the whole batch's forward + backward on the fastest device, in one piece
    n_devices: int
    # which bound binds: "work" (W / n), "memory" (micro-batches no larger than `micro_batch`
    # and the recomputation memory forces) or "operators" (an operator placement's least work,
    # W_op / n); memory_s: the memory term (0: nothing fits by memory)
    binding: str = "work"
    memory_s: float = 0.0
    micro_batch: int = 0  # the memory term's micro-batch (0: the work bound binds)
    operator_work_s: float = 0.0  # W_op: the operators' least device-seconds (0: no placement fits)

    def describe(self) -> str:
        """The binding term in words, for the comparison's last lines."""
        if self.binding == "memory":
            return (f"memory binds: at best micro-batches of {self.micro_batch} samples with the recomputation "
                    f"their activations force ({_ms(self.memory_s)} ms against {_ms(self.work_s / self.n_devices)} "
                    f"ms of work spread over {self.n_devices} devices)")
        if self.binding == "operators":
            return (f"an operator placement's least work ({_ms(self.operator_work_s)} device-ms, every operator "
                    f"whole on its fastest device, as the simulator prices operators) spread over {self.n_devices} "
                    f"devices, below the layers' bound (their least work: {_ms(self.work_s)} device-ms)")
        return (f"the least forward + backward work ({_ms(self.work_s)} device-ms, every layer at its cheapest "
                f"piece size) spread over {self.n_devices} devices")


def _ms(s: float) -> str:
    """Milliseconds in four digits and never an exponent: '1.207e+04' beside '12.07 s' reads as another unit."""
    return f"{s * 1e3:.4g}" if abs(s) < 10 else f"{s * 1e3:,.0f}"


def lower_bound(cm: CostModel, batch: int) -> LowerBound:
    n = cm.cluster.n_devices
    kinds = list({id(c): c for c in (cm.compute(d) for d in range(n))}.values())  # one per device kind
    n_layers = cm.model.n_layers

    def t(costs, i: int, b: int) -> float:
        return float(costs.forward[i](b)) + float(costs.backward[i](b))

    one_device = min(sum(t(c, i, batch) for i in range(n_layers)) for c in kinds)
    # every piece size at once (time functions take arrays): a batch can have 10**5 divisors
    sizes = np.array(divisors(batch), dtype=float)
    times = _mode_times(cm, kinds, sizes)  # [mode, layer, size]: device-seconds per piece
    per_batch = times * batch / sizes  # the whole batch in pieces of that size
    work = float(per_batch[0].min(axis=1).sum())  # per layer, the cheapest device kind and piece size
    work_s = work / n
    memory_s, micro = _memory_bound(cm, batch, sizes, per_batch)
    # the layers' family: the work bound, or the memory term where it adds something worth naming
    # (a tenth of a percent)
    if np.isfinite(memory_s) and memory_s > work_s * (1 + 1e-3):
        layers = LowerBound(iteration_s=memory_s, work_s=work, one_device_s=one_device, n_devices=n,
                            binding="memory", memory_s=memory_s, micro_batch=micro)
    else:
        layers = LowerBound(iteration_s=max(work_s, memory_s) if np.isfinite(memory_s) else work_s, work_s=work,
                            one_device_s=one_device, n_devices=n, memory_s=memory_s if np.isfinite(memory_s) else 0.0)
    return with_operator_term(layers, cm, batch)


def with_operator_term(layers: LowerBound, cm: CostModel, batch: int) -> LowerBound:
    """The layers' bound with the operator placements' least work (none without an operator graph),
    binding where a placement could be faster than any layer plan."""
    operator_work = _operator_work(cm, batch)
    if np.isfinite(operator_work):
        layers = replace(layers, operator_work_s=operator_work)
        if operator_work / layers.n_devices < layers.iteration_s:
            return replace(layers, iteration_s=operator_work / layers.n_devices, binding="operators", micro_batch=0)
    return layers


def _operator_work(cm: CostModel, batch: int) -> float:
    """W_op (module docstring): every operator of the whole batch on its fastest device, priced as
    the simulator's operator placements are (costs/op_costs.py, the measured profile where the
    cost model has one); inf where no placement fits or none can be priced (a profile that lacks
    operators: the simulator refuses those placements too)."""
    from paraplan.costs.op_costs import op_seconds_per_device
    from paraplan.errors import ParaplanError

    if not _operators_fit(cm, batch):
        return np.inf
    try:
        seconds = op_seconds_per_device(cm.operators, cm.cluster, batch, getattr(cm, "operator_profile", None))
    except ParaplanError:
        return np.inf
    return float(seconds.min(axis=1).sum())


MODES = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)


def _mode_times(cm: CostModel, kinds, sizes: np.ndarray) -> np.ndarray:
    """[recompute mode, layer, piece size]: forward + backward seconds of one piece on the fastest
    device kind, with the forward (or, selective, the attention core's share of it) once more."""
    out = np.full((len(MODES), cm.model.n_layers, len(sizes)), np.inf)
    for i, layer in enumerate(cm.model.layers):
        flops = np.array([layer.forward_flops.at(s) for s in sizes])
        core = np.array([layer.attention_core_flops.at(s) for s in sizes])
        share = np.divide(core, flops, out=np.zeros_like(flops), where=flops > 0)  # the core's share of the forward
        for c in kinds:
            f = np.asarray(c.forward[i](sizes), dtype=float) * np.ones_like(sizes)
            b = np.asarray(c.backward[i](sizes), dtype=float) * np.ones_like(sizes)
            for k, extra in enumerate((0.0, f * share, f)):
                out[k, i] = np.minimum(out[k, i], f + b + extra)
    return out


def _memory_bound(cm: CostModel, batch: int, sizes: np.ndarray, per_batch: np.ndarray) -> tuple[float, int]:
    """The memory term (module docstring): its seconds over the best micro-batch, and that micro-batch
    (inf, 0: none fits)."""
    model, config, n = cm.model, cm.memory, cm.cluster.n_devices
    capacity = _usable_memory(cm)
    states = sum(layer_memory(model, i, LayerStrategy(), 1.0, config).states_bytes for i in range(model.n_layers))
    room = capacity - states
    best, best_b = np.inf, 0
    for b in sizes:
        saved = np.array([[layer_memory(model, i, LayerStrategy(recompute=r), float(b), config).saved_bytes
                           for i in range(model.n_layers)] for r in MODES])  # [mode, layer]
        if saved.min(axis=0).sum() > room:
            continue  # not even with every layer recomputed
        fits_pieces = np.array([b % p == 0 for p in sizes])  # pieces no larger than (and dividing) b
        work = per_batch[:, :, fits_pieces].min(axis=2)  # [mode, layer]
        value = _dual(work, saved, room)
        if value < best:
            best, best_b = value, int(b)
    return best / n, best_b


def _dual(work: np.ndarray, saved: np.ndarray, room: float) -> float:
    """max over lambda >= 0 of sum_i min_r (work[r, i] + lambda saved[r, i]) - lambda room: the
    Lagrangian dual of choosing one recomputation mode per layer within `room` bytes, a lower bound
    on that choice's least work (exact at lambda = 0 when the cheapest modes fit). The dual is
    concave and piecewise linear: its maximum lies at 0 or where two modes of a layer tie."""
    cheapest = work.argmin(axis=0)
    if saved[cheapest, np.arange(work.shape[1])].sum() <= room:
        return float(work.min(axis=0).sum())
    lambdas = [0.0]
    for a in range(len(work)):
        for c in range(len(work)):
            more_work, less_memory = work[a] - work[c], saved[c] - saved[a]
            ok = (more_work > 0) & (less_memory > 0)
            lambdas.extend((more_work[ok] / less_memory[ok]).tolist())
    lam = np.unique(np.array(lambdas))[:, None, None]  # [lambda, 1, 1]
    values = (work[None] + lam * saved[None]).min(axis=1).sum(axis=1) - lam[:, 0, 0] * room
    return float(values.max())


def _operators_fit(cm: CostModel, batch: int) -> bool:
    """Whether an operator placement of the whole batch could fit the devices' total memory: one copy
    of the resident states (costs/op_memory.py) and the forward outputs a backward operator reads,
    all alive when the first backward operator starts. False without an operator graph."""
    graph = cm.operators
    if graph is None:
        return False
    from paraplan.costs.op_memory import resident_bytes

    params = np.array([node.param_bytes for node in graph.nodes], dtype=float)
    backward = np.array([node.phase == "backward" for node in graph.nodes])
    read_by_backward = {e.src for e in graph.edges if backward[e.dst] and not backward[e.src]}
    alive = sum(graph.nodes[i].output_bytes.at(batch) for i in read_by_backward)
    return float(resident_bytes(params, backward).sum()) + alive <= _usable_memory(cm)


def _usable_memory(cm: CostModel) -> float:
    """Bytes every device can hold beyond the fixed reserve, summed over the cluster."""
    return sum(max(0.0, float(d.spec.memory_bytes) - cm.memory.reserve_bytes) for d in cm.cluster.devices)
