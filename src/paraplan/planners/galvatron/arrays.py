"""Galvatron-BMW's per-layer strategy arrays of one device group (../shared/papers/galvatron-bmw.md):
for every layer and every strategy of a variant, its time, memory and gradient sync
(costs/strategy.py: strategy_arrays), the memory costs/memory.py counts beyond them, where the
runtime allows each strategy, and the Slice-Gather transformation between layouts (R). Groups with
the same devices in the same places share one set. The search over them is
planners/galvatron/searcher.py's `Searcher`.
"""

from __future__ import annotations

import numpy as np

from paraplan.costs import memory as memory_model
from paraplan.costs.alike import first_alike
from paraplan.costs.expert_costs import common_expert_count, expert_problem, held_params
from paraplan.costs.memory_config import MemoryConfig
from paraplan.costs.slice_gather import layout_ranks, slice_gather_fraction
from paraplan.costs.strategy import param_count, strategy_arrays
from paraplan.planners.galvatron.space import Variant, variant_strategies
from paraplan.planners.request import PlanRequest
from paraplan.precision import is_mixed


class StrategyArrays:
    """The per-layer arrays of one request and variant, cached per group signature and micro-batch."""

    def __init__(self, request: PlanRequest, variant: Variant):
        self.request, self.variant = request, variant
        self.cm = request.costs
        self.model, self.cluster = self.cm.model, self.cm.cluster
        self.config = self.cm.memory or MemoryConfig()
        self.slow = self.cm.overlap_slowdown
        self._arrays: dict = {}
        # per group, its signature's number: hashing a signature of 1,024 device specs at every look-up
        # had been a tenth of BMW's partition adjustment at 1,024 GPUs
        self._signatures: dict = {}
        self._signature_ids: dict = {}

    def signature(self, devices: tuple[int, ...]) -> int:
        """What a group's arrays depend on: its device types and where its devices sit in which
        nodes (groups of a homogeneous cluster share one set of arrays)."""
        if devices not in self._signatures:  # one number per distinct signature, cheap to hash
            self._signatures[devices] = self._signature_ids.setdefault(self._signature(devices), len(self._signature_ids))
        return self._signatures[devices]

    def _signature(self, devices: tuple[int, ...]) -> tuple:
        slots = [self.cluster.devices[d] for d in devices]
        first = slots[0].node
        nodes = sorted({x.node for x in slots})
        return (tuple((x.node - first, x.spec) for x in slots),
                tuple((self.cluster.nodes[n].intra_link, self.cluster.nodes[n].network) for n in nodes))

    def _slowest(self, devices: tuple[int, ...], micro: float):
        """The compute times of the group's slowest kind (a group over several kinds moves at its
        slowest device's pace, as the simulator prices it: simulator/plan_work.py; it was priced at
        its first device's, the fastest, since devices are numbered fastest node first)."""
        kinds = {id(c): c for c in (self.cm.compute(d) for d in devices)}
        if len(kinds) == 1:
            return next(iter(kinds.values()))
        return max(kinds.values(), key=lambda c: sum(float(x.sum()) for x in c.arrays(micro)[:2]))

    def __call__(self, devices: tuple[int, ...], micro: float) -> dict:
        key = (self.signature(devices), micro)
        if key not in self._arrays:
            sp = self.request.sequence_parallel
            strategies = variant_strategies(self.variant, len(devices), today=is_mixed(self.cm.precision),
                                            selective=any(layer.attention_core_bytes.per_sample > 0
                                                          for layer in self.model.layers),
                                            sequence_parallel=bool(sp),
                                            context_parallel=int(self.request.options.get("context_parallel", 1)),
                                            experts=common_expert_count(self.model))
            # the measured runtime figures of a calibrated cluster, as the simulator charges them
            costs = self._slowest(devices, micro)
            a = strategy_arrays(costs, self.model, strategies, micro, self.cluster, devices,
                                self.config, self.slow, runtime=self.cm.overheads,
                                compute_scale=self.cm.overheads.scale_for(self.cluster.n_devices))
            a["strategies"] = strategies
            first = np.asarray(first_alike(costs, self.model, range(self.model.n_layers)))
            a["extra_forward"], a["extra_backward"] = self.extra_memory(strategies, micro, first)
            # mixed precision: autocast's 16-bit weight copies stay with the states (costs/memory.py)
            a["states_bytes"] = a["states_bytes"] + a["copy_bytes"]
            # [layer, strategy]: the micro-batch splits into the strategy's data slices, and TP and
            # SP only where the runtime runs them (PlanRequest.tensor_parallel, .sequence_parallel)
            tp_ok = self.request.tensor_parallel  # None: TP anywhere (fp32, the paper's setting)
            a["allowed"] = np.array([[micro == int(micro) and int(micro) % s.data_degree == 0
                                      and expert_problem(self.model.layers[i], s) is None
                                      and (not s.sequence_parallel or (i, s.tp) in sp)
                                      and (s.tp == 1 or tp_ok is None or (i, s.tp) in tp_ok) for s in strategies]
                                     for i in range(self.model.n_layers)])
            layouts: dict = {}
            classes = [layouts.setdefault((s.data_degree, s.cp, *(x.tobytes() for x in layout_ranks(s))),
                                          len(layouts)) for s in strategies]
            reps = {k: strategies[classes.index(k)] for k in range(len(layouts))}
            a["classes"] = np.array(classes)
            a["frac"] = np.array([[slice_gather_fraction(reps[i], reps[j]) for j in reps] for i in reps])
            self._arrays[key] = a
        return self._arrays[key]

    def extra_memory(self, strategies, micro: float, first: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[layer, strategy] bytes costs/memory.py counts beyond `layer_memory`: Megatron's activations
        held whole on every tp rank (per micro-batch in flight: forward memory) and FSDP's gathered
        weights and unsharded gradient (counted as backward memory, a per-layer upper bound of the
        stage's largest: the memory model keeps the largest `sdp_gathered_layers` layers). Both read
        the layer's spec alone: a layer like an earlier one (`first`: costs/alike.py) copies its row."""
        n = self.model.n_layers
        forward, backward = np.zeros((n, len(strategies))), np.zeros((n, len(strategies)))
        replicated = getattr(memory_model, "tp_replicated_bytes", None)
        gathered_weight = getattr(self.config, "compute_copy_bytes_per_param", 0.0) or \
            getattr(self.config, "param_bytes_per_param", 0)  # 16-bit in mixed precision, as costs/memory.py
        gathered = getattr(self.config, "sdp_gathered_layers", 0) * gathered_weight \
            + getattr(self.config, "grad_bytes_per_param", 0)
        for j, st in enumerate(strategies):
            for i in np.unique(first):
                if replicated is not None and st.tp > 1:
                    forward[i, j] = replicated(self.model, int(i), st, micro, self.config)
                if st.sdp > 1:
                    backward[i, j] = held_params(self.model.layers[i], param_count(self.model, int(i), False), st) * gathered
        return forward[first], backward[first]

    def transformation(self, a: dict, layers: range, micro: float, devices: tuple[int, ...]) -> np.ndarray:
        """R per layer of the stage ([layer, from class, to class], per micro-batch): forward and backward."""
        link = self.cluster.slowest_link(devices)
        frac = a["frac"]
        out = np.zeros((len(layers), *frac.shape))
        if not frac.any():
            return out
        made: dict = {}  # per (output, gradient) bytes: a stage of blocks moves the same between each pair
        for row, i in enumerate(layers):
            if row == 0:
                continue
            prev = self.model.layers[i - 1]
            sizes = (prev.output_bytes.at(micro), prev.output_grad_bytes.at(micro))
            if sizes not in made:
                made[sizes] = np.zeros(frac.shape)
                for f, nbytes in zip((frac, frac.T), sizes, strict=True):
                    made[sizes] += np.where(f > 0, link.latency_s + f * nbytes / link.bandwidth_bytes_per_s, 0.0)
            out[row] = made[sizes]
        return out
