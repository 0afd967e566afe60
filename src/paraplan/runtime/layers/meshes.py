"""The device meshes of a plan with per-layer strategies, built once per rank from the axis table.

Every distinct layout of the plan (`LayerStrategy.dims`: (axis, degree) pairs, inner-most first;
costs/strategy.py's layout, shared with the simulator) becomes one `DeviceMesh` over all stages,
shape (pp, outer..., inner): reshaping a stage's device list row-major makes the last (inner-most)
mesh dimension vary fastest, which is `strategy_groups`'s layout. The mesh's dimensions are named
by the axes (plans/axes.py: PIPELINE, then LAYER_AXES outer-most first); each apply step
(layers/parallelize.py) asks for the sub-mesh of its own axes. A mixture-of-experts layer's expert
view (plans/axes.py: `view="expert"`) has a mesh of its own per (layout, ep): (pp, edp, ep), ep
inner-most (costs/expert_costs.py: `expert_groups`, etp 1).
"""

from __future__ import annotations

import torch

from paraplan.plans.axes import DATA, EXPERT, EXPERT_DATA, LAYER_AXES, PIPELINE, SHARDED_DATA, Axis
from paraplan.plans.plan import LayerStrategy, Plan, Stage

Layout = tuple[tuple[Axis, int], ...]  # LayerStrategy.dims: (axis, degree), inner-most first


def stage_strategies(stage: Stage) -> tuple[LayerStrategy, ...]:
    """One strategy per layer of the stage; a stage without strategies is pure data parallel."""
    return tuple(stage.strategy(i) for i in stage.layers)


class Meshes:
    """One DeviceMesh per distinct layout of the plan, created in the same order on every rank
    (mesh creation is collective)."""

    def __init__(self, plan: Plan, device_type: str):
        from torch.distributed.device_mesh import DeviceMesh

        layouts = sorted({st.dims for stage in plan.stages for st in stage_strategies(stage) if st.dims})
        self._meshes: dict[Layout, DeviceMesh] = {}
        for layout in layouts:
            outer_first = list(reversed(layout))
            # one row per pipeline rank (the chunks of an interleaved rank share its devices)
            groups = list(dict.fromkeys(tuple(s.devices) for s in plan.stages))
            shape = [len(groups)] + [k for _, k in outer_first]
            ranks = torch.tensor([list(g) for g in groups]).reshape(shape)
            # the groups are fixed by which ranks share a row, not by the order of the mesh's
            # dimensions: put them in one canonical order (the axis table's, outer-most first: dp,
            # sdp, cp, tp), so that HSDP's (replicate, shard) = (dp, sdp) slice is in ascending order
            # for any layout
            names = [PIPELINE.name] + [a.name for a, _ in outer_first]
            canonical = [PIPELINE.name] + [a.name for a in reversed(LAYER_AXES) if a.name in names]
            ranks = ranks.permute([names.index(d) for d in canonical])
            self._meshes[layout] = DeviceMesh(device_type, ranks, mesh_dim_names=tuple(canonical))
        self._expert_meshes: dict[tuple[Layout, int], DeviceMesh] = {}
        for layout, ep in sorted({(st.dims, st.ep) for stage in plan.stages for st in stage_strategies(stage)
                                  if st.ep > 1}):
            groups = list(dict.fromkeys(tuple(s.devices) for s in plan.stages))
            ranks = torch.tensor([list(g) for g in groups]).reshape(len(groups), -1, ep)
            self._expert_meshes[layout, ep] = DeviceMesh(device_type, ranks, mesh_dim_names=(
                PIPELINE.name, EXPERT_DATA.name, EXPERT.name))

    def sub(self, strategy: LayerStrategy, *axes: Axis):
        """The sub-mesh of `strategy`'s layout over `axes` (outer first), for this rank."""
        names = tuple(a.name for a in axes)
        return self._meshes[strategy.dims][names if len(names) > 1 else names[0]]

    def expert_sub(self, strategy: LayerStrategy, axis: Axis):
        """The sub-mesh of `strategy`'s expert view over `axis` (EXPERT or EXPERT_DATA), for this rank."""
        return self._expert_meshes[strategy.dims, strategy.ep][axis.name]

    def sharding(self, strategy: LayerStrategy):
        """The mesh FSDP2 shards `strategy`'s layers over: the 2-D (dp, sdp) mesh (HSDP) with dp
        replicas, else the sdp dimension."""
        return self.sub(strategy, DATA, SHARDED_DATA) if strategy.dp > 1 else self.sub(strategy, SHARDED_DATA)
