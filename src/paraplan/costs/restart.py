"""What switching to a plan from the last checkpoint costs (issue 53 item 3): after a failure the
remaining devices load the checkpoint into the next plan of the fallback ladder (planners/ladder.py),
then train on.

A checkpoint is keyed by parameter name (runtime/state/layout_state.py), so each device reads the
parameters and optimizer state it holds under the new plan, whatever plan wrote them: the memory
model's count of them (costs/memory.py: param_state_bytes + optimizer_bytes; its states per parameter,
fp32 weights and Adam's two moments in both fp32 and mixed precision). torch.distributed.checkpoint
reads every saved piece that overlaps what a device holds, whole (FileSystemReader reads a piece's
bytes, then narrows them), so what a device reads depends on both layouts: a layer saved whole (a
pipeline stage, DP, ZeRO's gathered moments) is read whole by each of its new TP / FSDP shards; a
layer saved in shards of 1/k is read in shards of at least 1/k (`saved_under`: the plan the
checkpoint was written under; shards assumed nested along one dimension, as FSDP's dim-0 shards
and a column-parallel weight's are, so a row-parallel weight read from FSDP shards is undercounted;
ZeRO's moments, saved whole and handed back as ranges, are counted as held). The reads go to the shared storage (a failed node's own disk
is gone): at most its aggregate bandwidth in all, and each node's reads through its network port.
Then the first iteration: priced as one predicted iteration (the processes' start and the model's
build are not counted).
"""

from __future__ import annotations

from dataclasses import dataclass

from paraplan.costs.memory import plan_memory
from paraplan.costs.model import CostModel
from paraplan.hardware.cluster import DEFAULT_STORAGE
from paraplan.plans.plan import Plan


@dataclass(frozen=True)
class SwitchCost:
    read_bytes: dict  # device -> bytes it reads from the checkpoint
    reload_s: float  # the reads, at the storage's and the nodes' bandwidths
    warmup_s: float  # the first iteration under the new plan
    storage_source: str

    @property
    def restart_s(self) -> float:
        return self.reload_s + self.warmup_s


def switch_cost(plan: Plan, cm: CostModel, iteration_s: float, saved_under: Plan | None = None) -> SwitchCost:
    """Loading the last checkpoint, written under `saved_under` (None: as `plan` holds it), into
    `plan` on `cm`'s cluster, then its first iteration."""
    capacities = {slot.id: slot.spec.memory_bytes for slot in cm.cluster.devices}
    _, breakdown = plan_memory(plan, cm.model, capacities, cm.memory)  # one a pipeline rank, in rank order
    ranks = plan.rank_of_stage
    read = {}
    for rank, b in enumerate(breakdown):  # every device of a rank holds the same
        stages = [s for s in range(plan.n_stages) if ranks[s] == rank]
        factor = _saved_pieces_factor(plan, stages, saved_under, cm.model)
        read.update({d: (b.param_state_bytes + b.optimizer_bytes) * factor for d in plan.stages[stages[0]].devices})
    storage = cm.cluster.storage or DEFAULT_STORAGE
    per_node: dict[int, float] = {}
    for device, nbytes in read.items():
        node = cm.cluster.devices[device].node
        per_node[node] = per_node.get(node, 0.0) + nbytes
    through_ports = max((nbytes / cm.cluster.nodes[n].network.bandwidth_bytes_per_s for n, nbytes in per_node.items()),
                        default=0.0)
    reload = max(sum(read.values()) / storage.shared_read_bytes_per_s, through_ports)
    return SwitchCost(read_bytes=read, reload_s=reload, warmup_s=iteration_s, storage_source=storage.source)


def _shard(plan: Plan, layer: int) -> float:
    """The share of layer `layer`'s states one device of `plan` holds in TP and FSDP shards."""
    stage = next(st for st in plan.stages if st.layers.start <= layer < st.layers.stop)
    strategy = stage.strategy(layer)
    return 1.0 / (strategy.tp * strategy.fsdp_degree)


def _saved_pieces_factor(plan: Plan, stages: list[int], saved_under: Plan | None, model) -> float:
    """What a rank of `plan` holding `stages` reads over what it holds: per layer, the larger of its
    shard and the saved piece (module docstring), weighted by the layer's parameters."""
    if saved_under is None:
        return 1.0
    held = read = 0.0
    for s in stages:
        for layer in range(plan.stages[s].layers.start, plan.stages[s].layers.stop):
            params = model.layers[layer].param_count
            mine = _shard(plan, layer)
            held += params * mine
            read += params * max(mine, _shard(saved_under, layer))
    return read / held if held else 1.0
