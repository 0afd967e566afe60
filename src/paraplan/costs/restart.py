"""What switching to a plan from the last checkpoint costs (issue 53 item 3): after a failure the
remaining devices load the checkpoint into the next plan of the fallback ladder (planners/ladder.py),
then train on.

A checkpoint is keyed by parameter name (runtime/state/layout_state.py), so each device reads the
parameters and optimizer state it holds under the new plan, whatever plan wrote them: the memory
model's count of them (costs/memory.py: param_state_bytes + optimizer_bytes; its states per parameter,
fp32 weights and Adam's two moments in both fp32 and mixed precision). torch.distributed.checkpoint
reads the saved pieces that overlap what a device holds; priced as exactly those bytes (the saved
chunks' own boundaries are not counted). The reads go to the shared storage (a failed node's own disk
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


def switch_cost(plan: Plan, cm: CostModel, iteration_s: float) -> SwitchCost:
    """Loading the last checkpoint into `plan` on `cm`'s cluster, then its first iteration."""
    capacities = {slot.id: slot.spec.memory_bytes for slot in cm.cluster.devices}
    _, breakdown = plan_memory(plan, cm.model, capacities, cm.memory)  # one a pipeline rank, in rank order
    ranks = plan.rank_of_stage
    read = {}
    for rank, b in enumerate(breakdown):  # every device of a rank holds the same
        stage = next(s for s in range(plan.n_stages) if ranks[s] == rank)
        read.update({d: b.param_state_bytes + b.optimizer_bytes for d in plan.stages[stage].devices})
    storage = cm.cluster.storage or DEFAULT_STORAGE
    per_node: dict[int, float] = {}
    for device, nbytes in read.items():
        node = cm.cluster.devices[device].node
        per_node[node] = per_node.get(node, 0.0) + nbytes
    through_ports = max((nbytes / cm.cluster.nodes[n].network.bandwidth_bytes_per_s for n, nbytes in per_node.items()),
                        default=0.0)
    reload = max(sum(read.values()) / storage.shared_read_bytes_per_s, through_ports)
    return SwitchCost(read_bytes=read, reload_s=reload, warmup_s=iteration_s, storage_source=storage.source)
