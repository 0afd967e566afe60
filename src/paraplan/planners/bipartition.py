"""Bi-Partition as a planner: the dynamic program of planners/bipartition_dp.py over a cost
model, every micro-batch count tried, each candidate judged by the simulator."""

from __future__ import annotations

from paraplan.planners.bipartition_dp import bipartition


def plan_bipartition(cm, model_name: str, cluster_name: str, batch: int, n_workers: int | None = None,
                     n_micro: int | None = None, layerwise: bool = False, memory=None, check_memory: bool = True):
    """The Bi-Partition Plan (or, layerwise=True, the traditional PipeDream-style one) for a model.

    Per-layer times are taken at the micro-batch size; every micro-batch count p that divides the
    batch and keeps 1F1B valid (p >= workers) is tried, and the simulator picks the fastest.
    Memory per worker follows costs/memory.py: model states of every layer it touches, the saved
    activations of its forward range for the micro-batches 1F1B keeps in flight, and the reserve.
    """
    import time

    from paraplan.costs.memory import MemoryConfig
    from paraplan.errors import ParaplanError
    from paraplan.plan.plan import LayerRange, Plan, SearchInfo, Stage
    from paraplan.simulate.predict import simulate_plan

    memory = memory or cm.memory or MemoryConfig()
    k = cm.model.n_layers
    n_workers = min(n_workers or cm.cluster.n_devices, k, cm.cluster.n_devices)
    if n_workers < 1:
        raise ParaplanError(f"--stages must be positive, got {n_workers}")
    candidates = [p for p in range(n_workers, batch + 1) if batch % p == 0]
    if n_micro is not None:
        if batch % n_micro:
            raise ParaplanError(f"--micro-batches: {n_micro} does not divide the batch {batch}")
        candidates = [n_micro]
    if not candidates:
        raise ParaplanError(f"1F1B needs at least {n_workers} micro-batches: use a batch of at least {n_workers}")
    layers = cm.model.layers
    link = cm.cluster.link(0, 1) if cm.cluster.n_devices > 1 else cm.cluster.nodes[0].intra_link
    t0 = time.perf_counter()
    best = None
    for p in candidates:
        micro = batch / p
        fwd, bwd, _, _ = cm.compute(0).arrays(micro)

        def cut_s(s1: int, s2: int, micro: float = micro) -> float:
            return link.transfer_s(layers[s1].output_bytes.at(micro)) + link.transfer_s(
                layers[s2].output_grad_bytes.at(micro))

        def fits(w: int, fr: tuple[int, int], br: tuple[int, int], micro: float = micro, p: int = p) -> bool:
            touched = range(min(fr[0], br[0]), max(fr[1], br[1]))
            states = sum(layers[i].param_bytes for i in touched) / cm.model.dtype_bytes * memory.state_bytes_per_param
            in_flight = min(n_workers - w, p)
            acts = sum(layers[i].saved_bytes.at(micro) for i in range(*fr)) * memory.activation_scale
            return states + in_flight * acts + memory.reserve_bytes <= cm.cluster.device(w).memory_bytes

        try:
            division = bipartition(fwd, bwd, cut_s, n_workers, fits=fits if check_memory else None,
                                   layerwise=layerwise)
        except ValueError:
            continue
        stages = tuple(Stage(LayerRange(*w.forward), (i,), backward_layers=None if layerwise else LayerRange(*w.backward))
                       for i, w in enumerate(division.workers))
        plan = Plan(model=model_name, cluster=cluster_name, n_layers=k, global_batch=batch, n_micro=p,
                    schedule="1f1b", grad_sync="none", stages=stages)
        sim = simulate_plan(plan, cm)
        if best is None or sim.prediction.iteration_s < best[0].prediction.iteration_s:
            best = (sim, division.bottleneck_s)
    if best is None:
        raise ParaplanError(f"no division of {model_name} over {n_workers} workers fits their memory")
    sim, bottleneck = best
    from dataclasses import replace

    name = "pipedream-layerwise" if layerwise else "bipartition"
    return replace(sim.plan, search=SearchInfo(planner=name, search_s=time.perf_counter() - t0, options=(
        ("bottleneck_s", bottleneck), ("costs", cm.source), ("workers", n_workers))))
