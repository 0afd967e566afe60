"""Issue 48, item 3: collectives priced by the algorithm NCCL picks, not always a ring. NCCL runs,
per call, the algorithm its tuning model predicts fastest (src/graph/tuning.cc); the presets of DGX
nodes list what their NCCL has (ring and tree; NVLS on Hopper), the papers' testbeds a ring."""

import pytest

from paraplan.costs.axis_costs import tensor_s
from paraplan.costs.collectives import TREE_BUS_SHARE, allreduce_algorithm, allreduce_s, ring_allreduce_s
from paraplan.hardware import load_cluster
from paraplan.hardware.cluster_file import read_cluster_file
from paraplan.hardware.cluster_write import write_cluster_file


def test_a_tree_across_many_nodes_beats_the_ring_on_small_all_reduces_and_not_on_large_ones():
    """Tree: 2 ((ppn - 1) alpha_intra + floor(log2 nodes) alpha_net) + M / (0.5 x 0.92 beta), the
    ring 2 (n-1)/n M / beta + 2 (n-1) alpha: at 128 nodes the ring's 254 latencies lose to the tree
    on 100 MB; on 1 GB over 2 nodes the ring's bandwidth wins."""
    cluster = load_cluster("dgx-a100-80gb?nodes=128")
    node = cluster.nodes[0]
    group = tuple(range(0, 1024, 8))  # one GPU a node: a DP group under TP 8
    link = cluster.slowest_link(group)
    tree_latency = 2 * (0 * node.intra_link.latency_s + 7 * node.network.latency_s)
    assert link.tree_latency_s == pytest.approx(tree_latency)
    nbytes = 100e6
    tree = tree_latency + nbytes / (0.5 * TREE_BUS_SHARE * link.bandwidth_bytes_per_s)
    assert tree < ring_allreduce_s(nbytes, 128, link)
    assert allreduce_s(nbytes, 128, link) == pytest.approx(tree) and allreduce_algorithm(nbytes, 128, link) == "tree"
    # two nodes of 8: a chain of 7 NVLink hops each way, one tree level
    pair = cluster.slowest_link(tuple(range(16)))
    assert pair.tree_latency_s == pytest.approx(2 * (7 * node.intra_link.latency_s + 1 * node.network.latency_s))
    assert allreduce_s(1e9, 16, pair) == pytest.approx(ring_allreduce_s(1e9, 16, pair))
    assert allreduce_algorithm(1e9, 16, pair) == "ring"


def test_nvls_inside_a_hopper_node_and_not_on_an_a100_or_across_nodes():
    """NVLS: alpha_nvls + 2 (n-1)/n M / beta_nvls (the preset's fit to nccl-tests on an H200 node),
    where it beats the ring (64 MiB: 480 GB/s-class against the ring's 323); a pair's small
    all-reduce stays on the ring; the A100's NVSwitch has no SHARP; a group across nodes has no NVLS."""
    h100 = load_cluster("dgx-h100-80gb?nodes=2")
    link = h100.slowest_link(tuple(range(8)))
    nvls = h100.nodes[0].nvls
    nbytes = 64 * 2**20
    expected = nvls.latency_s + 2 * 7 / 8 * nbytes / nvls.bandwidth_bytes_per_s
    assert allreduce_s(nbytes, 8, link) == pytest.approx(expected)
    assert expected < ring_allreduce_s(nbytes, 8, link)
    assert allreduce_algorithm(nbytes, 8, link) == "nvls"
    pair = h100.slowest_link((0, 1))  # two GPUs: the ring's two steps beat NVLS's latency on 1 MiB
    assert allreduce_algorithm(2**20, 2, pair) == "ring"
    assert h100.slowest_link(tuple(range(16))).nvls is None
    a100 = load_cluster("dgx-a100-80gb")
    a_link = a100.slowest_link(tuple(range(8)))
    assert a_link.nvls is None and allreduce_s(nbytes, 8, a_link) == ring_allreduce_s(nbytes, 8, a_link)


def test_the_papers_testbeds_keep_their_ring():
    for preset in ("galvatron-16xa100", "csimd-v100-10gbe", "gropipe-8xt4"):
        cluster = load_cluster(preset)
        link = cluster.slowest_link(tuple(range(cluster.n_devices)))
        assert link.tree_latency_s is None and link.nvls is None, preset


def test_tensor_parallel_all_reduces_take_nvls_and_sequence_parallel_stays_a_ring():
    """Without SP a TP layer's two all-reduces a pass run on NVLS on an H100 node; with SP they are
    a reduce-scatter and an all-gather, which NCCL runs as rings (NVLS's all-gather bus bandwidth is
    half its all-reduce's), so the term is the ring all-reduce's."""
    from dataclasses import replace

    from paraplan.plans.plan import LayerStrategy
    from paraplan.workload import measured_model

    _, spec = measured_model("gpt2-tiny")
    layer = next(layer for layer in spec.layers if layer.output_bytes.at(1) > 0)
    link = load_cluster("dgx-h100-80gb").slowest_link(tuple(range(8)))
    local = 512.0  # large enough that NVLS wins
    plain = LayerStrategy(tp=8)
    with_sp = replace(plain, sequence_parallel=True)
    out = layer.output_bytes.at(local)
    assert tensor_s(layer, local, plain, link)[0] == pytest.approx(2 * allreduce_s(out, 8, link))
    assert tensor_s(layer, local, with_sp, link)[0] == pytest.approx(2 * ring_allreduce_s(out, 8, link))
    assert allreduce_algorithm(out, 8, link) == "nvls"


def test_algorithms_and_nvls_round_trip_through_the_cluster_file(tmp_path):
    cluster = load_cluster("dgx-h100-80gb")
    path = tmp_path / "h100.toml"
    write_cluster_file(cluster, path)
    again = read_cluster_file(path)
    assert again.nodes[0].algorithms == ("ring", "tree", "nvls") and again.nodes[0].nvls == cluster.nodes[0].nvls
    assert again == cluster
