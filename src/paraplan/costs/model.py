"""The cost model a simulation uses: a model, a cluster and where compute times come from."""

from __future__ import annotations

from collections.abc import Callable

from paraplan.costs.analytic import analytic_costs
from paraplan.costs.memory import MemoryConfig
from paraplan.costs.profile import Profile, profile_costs
from paraplan.costs.timefn import LayerCosts
from paraplan.errors import ParaplanError
from paraplan.hardware.cluster import Cluster, DeviceSpec
from paraplan.models.spec import ModelSpec


class CostModel:
    """Compute time functions per device type (analytic or measured), links from the cluster.

    `compute_costs(device_spec)` returns the LayerCosts of that device type; only its forward and
    backward functions are used here, transfers are priced from bytes and the actual link.
    """

    def __init__(self, model: ModelSpec, cluster: Cluster, compute_costs: Callable[[DeviceSpec], LayerCosts],
                 memory: MemoryConfig | None = None, overlap_slowdown: float = 1.0, source: str = "analytic",
                 rendezvous: bool = False, action_overhead_s: float = 0.0, step_overhead_s: float = 0.0):
        self.model = model
        self.cluster = cluster
        self._compute_costs = compute_costs
        self._cache: dict[str, LayerCosts] = {}
        self.memory = memory or MemoryConfig()
        self.overlap_slowdown = overlap_slowdown
        self.source = source
        # how torch.distributed.pipelining runs on gloo: blocking transfers with a rendezvous
        # (simulate/pipeline.py) and a fixed cost per pipeline action (schedule bookkeeping,
        # the autograd engine starting, the p2p calls); the papers' models have neither
        self.rendezvous = rendezvous
        self.action_overhead_s = action_overhead_s
        self.step_overhead_s = step_overhead_s  # per iteration, outside the schedule (optimizer, ...)

    def compute(self, device_id: int) -> LayerCosts:
        spec = self.cluster.device(device_id)
        if spec.name not in self._cache:
            self._cache[spec.name] = self._compute_costs(spec)
        return self._cache[spec.name]


def analytic_cost_model(model: ModelSpec, cluster: Cluster, **kwargs) -> CostModel:
    link = cluster.nodes[0].intra_link  # unused for compute; transfers use cluster.link(a, b)
    return CostModel(model, cluster, lambda spec: analytic_costs(model, spec, link), **kwargs)


def profile_cost_model(model: ModelSpec, cluster: Cluster, profile: Profile, **kwargs) -> CostModel:
    """Measured compute times for every device of the cluster (the profile's device stands for
    all of them); transfers still priced from the cluster's links."""
    if len(profile.layers) != model.n_layers:
        raise ParaplanError(f"profile of {profile.model!r} has {len(profile.layers)} layers, "
                            f"model {model.name!r} has {model.n_layers}")
    for i, (measured, layer) in enumerate(zip(profile.layers, model.layers, strict=True)):
        if measured.name != layer.name:
            raise ParaplanError(f"profile layer {i} is {measured.name!r}, model layer {i} is {layer.name!r}")
    link = cluster.nodes[0].intra_link
    costs = profile_costs(profile, link)
    return CostModel(model, cluster, lambda spec: costs, source=f"profile:{profile.device_name}", **kwargs)
