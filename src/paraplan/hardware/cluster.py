"""Device, link, node and cluster descriptions: pure frozen data, no I/O.

Nothing here assumes identical devices: every node lists its own devices (any mix of types) and
its own links, so heterogeneous clusters (CSIMD's cost model allows them) are ordinary data.
Links are full duplex: a device can send and receive at full bandwidth at once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from itertools import pairwise


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator (or CPU core) type, for the analytic compute model in costs/analytic.py."""

    name: str
    peak_flops: float  # FLOP/s at the training precision (fp32 unless the preset says otherwise)
    memory_bandwidth_bytes_per_s: float
    memory_bytes: int
    kernel_overhead_s: float  # launch + framework dispatch per aten kernel
    max_efficiency: float  # fraction of peak large kernels reach
    # Work per kernel (FLOPs) at which a kernel reaches half of max_efficiency: small micro-batches
    # leave the device under-filled, so time is not proportional to batch (CSIMD Fig. 1).
    half_efficiency_flops: float
    source: str = ""


@dataclass(frozen=True)
class LinkSpec:
    """alpha + bytes / beta (FD-DPS Definition 4; Hockney's model)."""

    bandwidth_bytes_per_s: float  # beta
    latency_s: float  # alpha

    def transfer_s(self, nbytes: float) -> float:
        if nbytes <= 0:
            return 0.0
        return self.latency_s + nbytes / self.bandwidth_bytes_per_s


@dataclass(frozen=True)
class NodeSpec:
    name: str
    devices: tuple[DeviceSpec, ...]
    intra_link: LinkSpec  # between two devices of this node (PCIe, NVLink, shared memory)
    network: LinkSpec  # this node's port to the inter-node network (Ethernet, InfiniBand)


@dataclass(frozen=True)
class DeviceSlot:
    """A device's place in the cluster: global id, node, index within the node, and its type."""

    id: int
    node: int
    local_index: int
    spec: DeviceSpec


@dataclass(frozen=True)
class Cluster:
    name: str
    nodes: tuple[NodeSpec, ...]
    description: str = ""

    @cached_property
    def devices(self) -> tuple[DeviceSlot, ...]:
        slots = []
        for n, node in enumerate(self.nodes):
            for i, spec in enumerate(node.devices):
                slots.append(DeviceSlot(id=len(slots), node=n, local_index=i, spec=spec))
        return tuple(slots)

    @property
    def n_devices(self) -> int:
        return len(self.devices)

    def device(self, device_id: int) -> DeviceSpec:
        return self.devices[device_id].spec

    def link(self, a: int, b: int) -> LinkSpec:
        """The link a transfer from device a to device b uses.

        Inside a node: the node's intra link. Across nodes: the slower of the two network ports
        (bandwidth of the narrower one, latency of the slower one).
        """
        da, db = self.devices[a], self.devices[b]
        if da.node == db.node:
            return self.nodes[da.node].intra_link
        na, nb = self.nodes[da.node].network, self.nodes[db.node].network
        return LinkSpec(bandwidth_bytes_per_s=min(na.bandwidth_bytes_per_s, nb.bandwidth_bytes_per_s),
                        latency_s=max(na.latency_s, nb.latency_s))

    def slowest_link(self, group: tuple[int, ...]) -> LinkSpec:
        """The bottleneck link of a ring over `group` (what bounds a ring collective)."""
        if len(group) < 2:
            return LinkSpec(bandwidth_bytes_per_s=float("inf"), latency_s=0.0)
        ring = list(group) + [group[0]]
        links = [self.link(x, y) for x, y in pairwise(ring)]
        return LinkSpec(bandwidth_bytes_per_s=min(lk.bandwidth_bytes_per_s for lk in links),
                        latency_s=max(lk.latency_s for lk in links))

    def with_memory(self, memory_bytes: int) -> Cluster:
        """The same cluster with every device's memory set to a budget (a user's limit)."""
        return Cluster(name=self.name, description=self.description, nodes=tuple(
            NodeSpec(n.name, tuple(replace(d, memory_bytes=memory_bytes) for d in n.devices), n.intra_link, n.network)
            for n in self.nodes))

    def device_types(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for slot in self.devices:
            counts[slot.spec.name] = counts.get(slot.spec.name, 0) + 1
        return counts
