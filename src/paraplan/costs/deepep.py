"""DeepEP's de-duplicated, node-limited token dispatch (issue 50 item 2: "group-limited routing
capping the nodes a token reaches"), as a plan's `expert_dispatcher = "deepep"` prices it.

Megatron's alltoall dispatcher (costs/expert_costs.py: `dispatch_s`) sends every routed copy of a
token to the rank of its expert: k copies, of which those for experts on other nodes cross the
network. DeepEP's internode kernels (deepseek-ai/DeepEP, "normal" kernels; megatron-core 0.16.1's
flex dispatcher with `moe_flex_dispatcher_backend = "deepep"`; torchtitan 0.3.0's
`moe_comm_backend = "deepep"`) send a token once to each other node that holds one of its experts,
over RDMA to the GPU of the same local index, which forwards it over NVLink to the GPUs holding
its experts there; the combine runs the same way back. DeepSeek-V3's group-limited routing (8
groups, a token's experts in at most 4 of them; DeepSeek-V3 report §2.1.2 "node-limited routing"
with one group per node at EP64 over 8 nodes) caps the nodes a token reaches, so at most M copies
of it cross the network instead of up to k. With the alltoall dispatcher, group limiting changes
nothing on average: each copy still crosses on its own, and the share of copies leaving the node is
the same.

Per all-to-all on one device of an EP group spanning N nodes of g devices each, for T tokens of h
elements of b bytes:
  network   T x R x h x b, R the expected number of other nodes a token's experts are on
            (`remote_nodes`: routing taken uniform, real routing's expectation and Megatron's forced
            balance by random logits, with group-limited routing M of G groups drawn uniformly, then
            k experts among them; or round-robin, NeMo Automodel's forced balance, the model
            reference's `expert_routing`),
            over the device's own network port (a DGX: one rail per GPU);
  NVLink    T x Q x h x b x (g - 1) / g, Q the expected number of ranks holding a token's experts:
            DeepEP sends a token once to each such rank, which expands it to its experts, and every
            one not on the GPU it arrives at moves once inside its node (those arriving over RDMA
            included);
both at once, the slower bounds it, plus one latency. One node (N = 1): the alltoall dispatcher's
NVLink all-to-all, unchanged. Not modelled: DeepEP's SM budget (`moe_deepep_num_sms`, 20 of 132 on
an H100 by default) slowing the compute beside it, its FP8 dispatch (bf16 here), and its
low-latency (inference) kernels.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations
from math import comb

from paraplan.hardware.cluster import Cluster, LinkSpec
from paraplan.models.spec import LayerExperts

# the group choices averaged exactly; above this many (C(G, M)), group limiting is left out, which
# prices more nodes reached than the routing allows (an upper bound)
MAX_GROUP_CHOICES = 20_000


@dataclass(frozen=True)
class NodeLimitedLink(LinkSpec):
    """The EP group's links as DeepEP uses them. As a LinkSpec it is the alltoall dispatcher's
    effective link (costs/expert_costs.py: all_to_all_link), so anything pricing the all-to-all the
    plain way still can; `dispatch_s` reads the node structure below instead."""

    nodes: int = 1  # N: nodes the EP group spans
    per_node: int = 1  # g: its devices on each (the fewest where they differ)
    intra_bandwidth: float = math.inf  # bytes/s between two devices of a node (NVLink)
    network_bandwidth: float = math.inf  # bytes/s of one device's share of its node's network ports


def node_limited_link(cluster: Cluster, group: tuple[int, ...], plain: LinkSpec) -> NodeLimitedLink:
    """The EP group's node structure beside `plain` (its alltoall effective link)."""
    per_node = Counter(cluster.devices[d].node for d in group)
    specs = [cluster.nodes[node] for node in per_node]
    g = min(per_node.values())
    return NodeLimitedLink(
        bandwidth_bytes_per_s=plain.bandwidth_bytes_per_s, latency_s=plain.latency_s, nodes=len(per_node), per_node=g,
        intra_bandwidth=min(s.intra_link.bandwidth_bytes_per_s for s in specs),
        network_bandwidth=min(s.network.bandwidth_bytes_per_s * min(k, s.rails) / k
                              for s, k in zip(specs, per_node.values(), strict=True)))


def _missed(pool: int, on_unit: int, k: int) -> float:
    """P(none of k experts drawn uniformly without replacement from `pool` is one of `on_unit`)."""
    if k > pool:
        return 0.0
    return comb(pool - on_unit, k) / comb(pool, k)


def reached(experts: LayerExperts, units: int) -> float:
    """The expected number of distinct units (nodes, or ranks) that a token's k experts are on, the
    E experts laid out contiguously over `units` (E / units each, as ranks hold E / ep each in rank
    order). Uniform routing: k distinct experts drawn alike, with group-limited routing first M of
    the G contiguous groups; round-robin (NeMo Automodel's FakeBalancedGate): token t's experts are
    t k ... t k + k - 1 mod E, averaged over one period of tokens."""
    return _reached(experts.experts, experts.top_k, experts.groups, experts.topk_groups, units, experts.routing)


@lru_cache(maxsize=512)
def _reached(e: int, k: int, g: int, m: int, units: int, routing: str) -> float:
    unit_of = [x * units // e for x in range(e)]
    if routing == "round-robin":
        period = e // math.gcd(e, k)
        return sum(len({unit_of[(t * k + j) % e] for j in range(k)}) for t in range(period)) / period
    if g > 1 and 0 < m < g and comb(g, m) <= MAX_GROUP_CHOICES:
        group_of = [x * g // e for x in range(e)]
        share = Counter(zip(unit_of, group_of, strict=True))  # (unit, group) -> its experts
        pool = sum(1 for x in group_of if x == 0) * m
        return sum(1.0 - _missed(pool, sum(share[j, q] for q in chosen), k)
                   for chosen in combinations(range(g), m) for j in range(units)) / comb(g, m)
    return sum(1.0 - _missed(e, unit_of.count(j), k) for j in range(units))


def remote_nodes(experts: LayerExperts, nodes: int) -> float:
    """R: the expected number of nodes other than its own that a token's experts are on. The token's
    own node is any of the N alike (the routing does not depend on where a token starts), so of the
    nodes reached, (N - 1) / N are others on average."""
    return reached(experts, nodes) * (nodes - 1) / nodes if nodes > 1 else 0.0


def node_limited_all_to_all_s(tokens: float, experts: LayerExperts, element_bytes: int, link: NodeLimitedLink) -> float:
    """One of DeepEP's dispatches (or combines) of `tokens` tokens on one device (module docstring)."""
    if tokens <= 0:
        return 0.0
    token_bytes = experts.hidden * element_bytes
    network = tokens * remote_nodes(experts, link.nodes) * token_bytes / link.network_bandwidth
    # a token once to each rank holding its experts (the rank expands it to them), (g - 1) / g of those
    # on another GPU of the node than the one it arrives at
    ranks = reached(experts, link.nodes * link.per_node)
    nvlink = tokens * ranks * token_bytes * (link.per_node - 1) / link.per_node / link.intra_bandwidth
    return max(network, nvlink) + link.latency_s
