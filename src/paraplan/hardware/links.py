"""Links, and what a collective over a group of devices may run on: pure frozen data, no I/O.

A ring over the group's bottleneck link is every library's algorithm. NCCL, which the GPU runs use,
also has others and picks, per call, the one its own tuning model predicts fastest (NCCL
src/graph/tuning.cc, `ncclTopoTuneModel`; issue 48 item 3): a double binary tree for an all-reduce
across nodes, whose latency grows with log2 of the nodes instead of with the ranks, and on
NVSwitch nodes of Hopper and later NVLink SHARP ("NVLS"), where the switch reduces. A node says
which of them its library has (`NodeSpec.algorithms`); `GroupLink` carries what a group's
collectives need to price each, and costs/collectives.py picks the fastest.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from itertools import pairwise
from math import floor, log2

ALGORITHMS = ("ring", "tree", "nvls")


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
class GroupLink(LinkSpec):
    """A group's ring (its bottleneck bandwidth, the per-step latency) and the other algorithms the
    group's library may run its all-reduce with: None where it has not got them."""

    # NCCL's tree across the group's nodes (tuning.cc: 2 ((ppn - 1) intra + log2i(nodes) inter))
    tree_latency_s: float | None = None
    # NVLink SHARP inside the group's one node: alpha + 2 (n-1)/n M / beta, beta a bus bandwidth
    nvls: LinkSpec | None = None


UNBOUNDED = GroupLink(bandwidth_bytes_per_s=float("inf"), latency_s=0.0)


def algorithms_problem(algorithms, has_nvls_link: bool) -> str | None:
    """Why a node's list of collective algorithms is wrong, or None."""
    if not isinstance(algorithms, (list, tuple)) or "ring" not in algorithms \
            or any(a not in ALGORITHMS for a in algorithms) or len(set(algorithms)) != len(algorithms):
        return f"expected a list of {', '.join(ALGORITHMS)} with ring in it, got {algorithms!r}"
    if ("nvls" in algorithms) != has_nvls_link:
        return "nvls in algorithms needs the node's nvls = { bandwidth_bytes_per_s, latency_s }, and the reverse"
    return None


def group_link(cluster, group: tuple[int, ...]) -> GroupLink:
    """What a collective over `group` (device ids of `cluster`) runs on (Cluster.slowest_link)."""
    if len(group) < 2:
        return UNBOUNDED
    ring = list(group) + [group[0]]
    links = [cluster.link(x, y) for x, y in pairwise(ring)]
    bandwidth = min(lk.bandwidth_bytes_per_s for lk in links)
    latency = max(lk.latency_s for lk in links)
    per_node = Counter(cluster.devices[d].node for d in group)
    nodes = [cluster.nodes[n] for n in per_node]
    if len(per_node) == 1:
        node = nodes[0]
        return GroupLink(bandwidth, latency, nvls=node.nvls if "nvls" in node.algorithms else None)
    # across nodes: each node's traffic leaves over as many rails as it has group members (NCCL's
    # channels, one per rail; 2 (n-1)/n M bytes leave each node in all), so the ring's inter-node
    # hops carry min(k, rails) ports' bandwidth; the nodes' own links (a ring's intra-node hops)
    # still bound it
    inter = min(cluster.nodes[n].network.bandwidth_bytes_per_s * min(k, cluster.nodes[n].rails)
                for n, k in per_node.items())
    intra = [cluster.nodes[n].intra_link.bandwidth_bytes_per_s for n, k in per_node.items() if k > 1]
    tree = None
    if all("tree" in node.algorithms for node in nodes):
        # tuning.cc, NCCL_ALGO_TREE, ncclFuncAllReduce: a chain over the node's ppn ranks, then a
        # double binary tree over the nodes, up and down (log2i: the floor)
        ppn = max(per_node.values())
        intra_latency = max(node.intra_link.latency_s for node in nodes)
        inter_latency = max(node.network.latency_s for node in nodes)
        tree = 2 * ((ppn - 1) * intra_latency + floor(log2(len(per_node))) * inter_latency)
    return GroupLink(min([inter, *intra]), latency, tree_latency_s=tree)
