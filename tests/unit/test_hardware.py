"""Clusters: presets, links, heterogeneous TOML files, and errors that name the field."""

import pytest

from paraplan.errors import ParaplanError, UnknownNameError
from paraplan.hardware import load_cluster, preset_names
from paraplan.hardware.cluster_file import ClusterFileError, read_cluster_file
from paraplan.hardware.cluster_write import write_cluster_file

PRESETS = {
    # name: (devices, nodes, device type)
    "csimd-v100-1gbe": (8, 8, "v100-32gb"),
    "csimd-v100-10gbe": (8, 8, "v100-32gb"),
    "gropipe-8xt4": (8, 1, "t4-16gb"),
    "galvatron-8xtitan": (8, 1, "titan-rtx-24gb"),
    "galvatron-16xtitan": (16, 2, "titan-rtx-24gb"),
    "galvatron-16xa100": (16, 2, "a100-40gb"),
    "galvatron-64xa100": (64, 8, "a100-40gb"),
    "fddps-8xp100": (8, 1, "p100-16gb"),
    "bipartition-7vm": (7, 7, "vm-1core"),
    "dgx-a100-80gb": (16, 2, "a100-80gb"),
    "dgx-h100-80gb": (16, 2, "h100-80gb"),
}


@pytest.mark.parametrize("name,shape", PRESETS.items())
def test_presets_describe_the_paper_testbeds(name, shape):
    devices, nodes, kind = shape
    c = load_cluster(name)
    assert (c.n_devices, len(c.nodes)) == (devices, nodes)
    assert set(c.device_types()) == {kind}
    assert all(slot.spec.source for slot in c.devices)


# the presets of more than one device kind (issue 52 item 4): name -> {device type: count}
MIXED_PRESETS = {"mixed-a100-v100": {"a100-40gb": 8, "v100-32gb": 8},
                 "sailor-mit": {"rtx-3090": 8, "titan-rtx-24gb": 16, "rtx-2080-11gb": 24},
                 "sailor-mit-2gpu": {"rtx-3090": 2, "titan-rtx-24gb": 4, "rtx-2080-11gb": 6}}


def test_every_preset_is_listed_and_local_exists():
    assert set(PRESETS) | set(MIXED_PRESETS) | {"local"} == set(preset_names())
    for name, kinds in MIXED_PRESETS.items():
        assert load_cluster(name).device_types() == kinds
    local = load_cluster("local")
    assert local.n_devices >= 1


# the vendors' dense peaks per dtype (datasheets), TFLOP/s; a dtype left out is one the chip lacks
VENDOR_PEAKS = {
    "dgx-a100-80gb": {"fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312},
    "galvatron-16xa100": {"fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312},
    "dgx-h100-80gb": {"fp32": 67, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9},
    "galvatron-8xtitan": {"fp32": 16.3, "fp16": 130},
    "csimd-v100-10gbe": {"fp32": 14, "fp16": 112},
    "gropipe-8xt4": {"fp32": 8.1, "fp16": 65},
    "fddps-8xp100": {"fp32": 9.3, "fp16": 18.7},
}


@pytest.mark.parametrize("name", VENDOR_PEAKS)
def test_presets_carry_the_vendors_peak_per_dtype(name):
    spec = load_cluster(name).devices[0].spec
    assert {k: v / 1e12 for k, v in spec.peaks.items()} == pytest.approx(VENDOR_PEAKS[name])


@pytest.mark.parametrize("name, precision", [("galvatron-8xtitan", "bf16"), ("csimd-v100-10gbe", "tf32"),
                                             ("gropipe-8xt4", "bf16"), ("fddps-8xp100", "bf16")])
def test_a_device_without_the_dtype_refuses_it_in_one_line(name, precision):
    from paraplan.hardware.cluster import PrecisionError

    with pytest.raises(PrecisionError, match=f"has no {precision} .it computes in") as info:
        load_cluster(name).check_precision(precision)
    assert "\n" not in str(info.value)


def test_default_precision_bf16_for_the_new_presets_fp32_for_the_papers():
    assert {n: load_cluster(n).default_precision for n in PRESETS} == {
        n: "bf16" if n.startswith("dgx-") else "fp32" for n in PRESETS}


@pytest.mark.parametrize("nodes", [1, 4, 384])
def test_the_dgx_presets_take_any_node_count(nodes):
    c = load_cluster(f"dgx-h100-80gb?nodes={nodes}")
    assert c.n_devices == 8 * nodes and len(c.nodes) == nodes
    if nodes > 1:  # NVLink inside a node, one NDR port per GPU between nodes
        assert c.link(0, 7).bandwidth_bytes_per_s > 300e9 and c.link(0, 8).bandwidth_bytes_per_s < 50e9


@pytest.mark.parametrize("name", ["dgx-a100-80gb?nodes=0", "dgx-a100-80gb?nodes=x", "dgx-a100-80gb?gpus=8",
                                  "dgx-a100-80gb?nodes=100000", "bipartition-7vm?nodes=3x"])
def test_a_bad_node_count_is_one_line(name):
    with pytest.raises(ParaplanError, match="nodes=N"):
        load_cluster(name)


def test_peaks_per_dtype_in_a_cluster_file(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(HETERO.replace("peak_flops = 20e12", "peak_flops = { fp32 = 20e12, bf16 = 160e12 }")
                    .replace('name = "mixed"', 'name = "mixed"\ndefault_precision = "fp32"'))
    c = read_cluster_file(path)
    assert c.device(0).peak_for("bf16") == 160e12 and c.device(0).peak_for("fp32") == 20e12
    write_cluster_file(c, tmp_path / "again.toml")
    assert read_cluster_file(tmp_path / "again.toml").device(0).peaks == c.device(0).peaks
    for edit, message in [("{ fp32 = 20e12, bf17 = 1e12 }", "peak_flops.bf17: unknown dtype"),
                          ("{ bf16 = 1e12 }", "peak_flops.fp32: missing"),
                          ("{ fp32 = 20e12, bf16 = -1.0 }", "peak_flops.bf16: expected a positive number")]:
        path.write_text(HETERO.replace("peak_flops = 20e12", f"peak_flops = {edit}"))
        with pytest.raises(ClusterFileError, match=message):
            read_cluster_file(path)
    path.write_text(HETERO.replace('name = "mixed"', 'name = "mixed"\ndefault_precision = "bf16"'))
    with pytest.raises(ClusterFileError, match="default_precision: mixed: big has no bf16"):
        read_cluster_file(path)
    path.write_text(HETERO.replace('name = "mixed"', 'name = "mixed"\ndefault_precision = "int8"'))
    with pytest.raises(ClusterFileError, match="default_precision: expected one of fp32, tf32, bf16, fp16"):
        read_cluster_file(path)


def test_efficiency_per_dtype_in_a_cluster_file(tmp_path):
    """max_efficiency as a table per dtype: each dtype's own, fp32's for a dtype left out; written
    back as a table; a dtype unknown, absent from peak_flops, or above 1 refused in one line."""
    path = tmp_path / "c.toml"
    two = HETERO.replace("peak_flops = 20e12", "peak_flops = { fp32 = 20e12, bf16 = 160e12, fp16 = 160e12 }")
    path.write_text(two.replace("max_efficiency = 0.7", "max_efficiency = { fp32 = 0.55, bf16 = 0.85 }"))
    c = read_cluster_file(path)
    big = c.device(0)
    assert (big.efficiency_for("fp32"), big.efficiency_for("bf16"), big.efficiency_for("fp16")) == (0.55, 0.85, 0.55)
    assert big.for_precision("bf16").max_efficiency == 0.85 and big.for_precision("bf16").peak_flops == 160e12
    assert big.for_precision("fp32").max_efficiency == 0.55
    assert c.device(1).efficiency_for("fp32") == 0.6  # a plain number: every dtype
    write_cluster_file(c, tmp_path / "again.toml")
    import tomllib

    written = tomllib.loads((tmp_path / "again.toml").read_text())["device_types"]
    assert written["big"]["max_efficiency"] == {"fp32": 0.55, "bf16": 0.85} and written["small"]["max_efficiency"] == 0.6
    assert read_cluster_file(tmp_path / "again.toml") == c
    for edit, message in [("{ fp32 = 0.5, bf17 = 0.9 }", "max_efficiency.bf17: unknown dtype"),
                          ("{ fp32 = 0.5, tf32 = 0.9 }", "max_efficiency.tf32: the device has no tf32 peak"),
                          ("{ bf16 = 0.9 }", "max_efficiency.fp32: missing"),
                          ("{ fp32 = 0.5, bf16 = 1.2 }", "max_efficiency.bf16: expected a fraction in (0, 1], got 1.2"),
                          ("{ fp32 = 1.5 }", "max_efficiency.fp32: expected a fraction in (0, 1], got 1.5"),
                          ("{ fp32 = 0.5, bf16 = 0 }", "max_efficiency.bf16: expected a positive number")]:
        path.write_text(two.replace("max_efficiency = 0.7", f"max_efficiency = {edit}"))
        with pytest.raises(ClusterFileError, match=message.replace("(", r"\(").replace(")", r"\)")) as info:
            read_cluster_file(path)
        assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_the_a100_presets_share_one_compute_model():
    """Galvatron's A100-40GB presets and dgx-a100-80gb: one fp32 efficiency (fitted by
    benchmarks/paper_fidelity.py), the tensor-core dtypes' as benchmarks/efficiency_fit.py fitted."""
    specs = [load_cluster(name).devices[0].spec for name in ("galvatron-16xa100", "galvatron-64xa100", "dgx-a100-80gb")]
    assert len({(s.efficiencies["fp32"], s.half_efficiency_flops, s.kernel_overhead_s) for s in specs}) == 1
    for s in specs:
        assert s.efficiency_for("bf16") == s.efficiency_for("fp16") == s.efficiency_for("tf32") == 0.869


def test_network_speeds_of_the_csimd_presets():
    slow, fast = load_cluster("csimd-v100-1gbe"), load_cluster("csimd-v100-10gbe")
    assert fast.link(0, 1).bandwidth_bytes_per_s == pytest.approx(10 * slow.link(0, 1).bandwidth_bytes_per_s)
    assert slow.link(0, 1).bandwidth_bytes_per_s < 125e6  # under the 1 Gb/s line rate


def test_links_inside_and_between_nodes():
    c = load_cluster("galvatron-16xa100")
    assert c.link(0, 7).bandwidth_bytes_per_s > 100e9  # NVLink inside a node
    assert c.link(0, 8).bandwidth_bytes_per_s < 13e9  # InfiniBand between nodes
    assert c.slowest_link((0, 1, 8)).bandwidth_bytes_per_s == c.link(0, 8).bandwidth_bytes_per_s
    assert c.link(3, 3).transfer_s(0) == 0.0
    assert c.link(0, 8).transfer_s(1e6) == pytest.approx(c.link(0, 8).latency_s + 1e6 / 12.5e9)


HETERO = """
format_version = 1
name = "mixed"

[device_types.big]
peak_flops = 20e12
memory_bandwidth_bytes_per_s = 1e12
memory_gib = 40
kernel_overhead_s = 1e-5
max_efficiency = 0.7
half_efficiency_flops = 1e8

[device_types.small]
peak_flops = 5e12
memory_bandwidth_bytes_per_s = 3e11
memory_gib = 8
kernel_overhead_s = 1e-5
max_efficiency = 0.6
half_efficiency_flops = 1e8

[[nodes]]
name = "a"
devices = ["big", "small", "small"]
intra_link = { bandwidth_bytes_per_s = 50e9, latency_s = 1e-6 }
network = { bandwidth_bytes_per_s = 10e9, latency_s = 5e-6 }

[[nodes]]
name = "b"
devices = ["small"]
intra_link = { bandwidth_bytes_per_s = 10e9, latency_s = 1e-6 }
network = { bandwidth_bytes_per_s = 1e9, latency_s = 2e-5 }
"""


def test_heterogeneous_cluster_round_trips(tmp_path):
    path = tmp_path / "mixed.toml"
    path.write_text(HETERO)
    c = read_cluster_file(path)
    assert [s.spec.name for s in c.devices] == ["big", "small", "small", "small"]
    assert c.device(0).memory_bytes == 40 * 2**30 and c.device(3).peak_flops == 5e12
    # across nodes: the narrower port and the slower latency
    assert c.link(0, 3).bandwidth_bytes_per_s == 1e9 and c.link(0, 3).latency_s == 2e-5
    assert c.link(1, 2).bandwidth_bytes_per_s == 50e9
    out = tmp_path / "again.toml"
    write_cluster_file(c, out)
    assert read_cluster_file(out) == c
    assert load_cluster(str(path)) == c


@pytest.mark.parametrize("edit,message", [
    (lambda t: t.replace("format_version = 1", "format_version = 7"), "format_version: expected 1"),
    (lambda t: t.replace("peak_flops = 20e12", "peak_flops = -1"), "device_types.big.peak_flops"),
    (lambda t: t.replace("memory_gib = 40", 'memory_gib = "lots"'), "device_types.big.memory_gib"),
    (lambda t: t.replace('devices = ["small"]', 'devices = ["huge"]'), "nodes[1].devices: unknown device type 'huge'"),
    (lambda t: t.replace("network = { bandwidth_bytes_per_s = 1e9, latency_s = 2e-5 }", ""), "nodes[1].network"),
    (lambda t: t.replace("max_efficiency = 0.7", "max_efficiency = 1.5"), "max_efficiency"),
    (lambda t: t + "\n[[[broken", "malformed TOML"),
    (lambda t: t.replace('name = "b"', 'name = "b"\nalgorithms = ["tree"]'), "nodes[1].algorithms: expected a list of ring"),
    (lambda t: t.replace('name = "b"', 'name = "b"\nalgorithms = ["ring", "butterfly"]'), "nodes[1].algorithms"),
    (lambda t: t.replace('name = "b"', 'name = "b"\nalgorithms = ["ring", "nvls"]'), "nvls in algorithms needs"),
])
def test_bad_cluster_files_name_the_field(tmp_path, edit, message):
    path = tmp_path / "bad.toml"
    path.write_text(edit(HETERO))
    with pytest.raises(ClusterFileError) as info:
        read_cluster_file(path)
    assert message in str(info.value)
    assert str(path) in str(info.value)
    assert "\n" not in str(info.value).strip()


def test_unknown_cluster_and_missing_file():
    with pytest.raises(UnknownNameError):
        load_cluster("galvatron-8xtitn")
    with pytest.raises(ParaplanError, match="cannot read"):
        load_cluster("/nonexistent/cluster.toml")


def test_a_ring_across_nodes_uses_a_rail_per_gpu_of_the_group():
    """Issue 48, item 3: a DGX node has one network port per GPU. An all-reduce over k GPUs on each
    of N nodes leaves each node over k rails: 2 (n-1)/n M / (k x port) + 2 (n-1) alpha, where the
    simulator once priced one port per ring; one GPU per node still has one rail; the NVLink hops
    bound it; a node with one shared port (rails = 1) keeps one."""
    from dataclasses import replace as dc_replace

    from paraplan.costs.collectives import ring_allreduce_s

    cluster = load_cluster("dgx-a100-80gb?nodes=4")
    port = cluster.nodes[0].network
    nbytes = 2**30
    for k in (1, 2, 4, 8):
        group = tuple(node * 8 + i for node in range(4) for i in range(k))
        n = len(group)
        expected = 2 * (n - 1) / n * nbytes / min(k * port.bandwidth_bytes_per_s,
                                                   cluster.nodes[0].intra_link.bandwidth_bytes_per_s)
        expected += 2 * (n - 1) * port.latency_s
        assert ring_allreduce_s(nbytes, n, cluster.slowest_link(group)) == pytest.approx(expected, rel=1e-12)
    one_port = dc_replace(cluster, nodes=tuple(dc_replace(node, rails=1) for node in cluster.nodes))
    assert one_port.slowest_link(tuple(range(32))).bandwidth_bytes_per_s == port.bandwidth_bytes_per_s
    # inside one node nothing changes
    inside = cluster.slowest_link(tuple(range(8)))
    assert (inside.bandwidth_bytes_per_s, inside.latency_s) == (cluster.nodes[0].intra_link.bandwidth_bytes_per_s,
                                                                  cluster.nodes[0].intra_link.latency_s)
