"""Clusters: presets, links, heterogeneous TOML files, and errors that name the field."""

import pytest

from paraplan.errors import ParaplanError, UnknownNameError
from paraplan.hardware import load_cluster, preset_names
from paraplan.hardware.cluster_file import ClusterFileError, read_cluster_file, write_cluster_file

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
}


@pytest.mark.parametrize("name,shape", PRESETS.items())
def test_presets_describe_the_paper_testbeds(name, shape):
    devices, nodes, kind = shape
    c = load_cluster(name)
    assert (c.n_devices, len(c.nodes)) == (devices, nodes)
    assert set(c.device_types()) == {kind}
    assert all(slot.spec.source for slot in c.devices)


def test_every_preset_is_listed_and_local_exists():
    assert set(PRESETS) | {"local"} == set(preset_names())
    local = load_cluster("local")
    assert local.n_devices >= 1


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
    assert c.link(0, 8).transfer_s(1e6) == pytest.approx(c.link(0, 8).latency_s + 1e6 / 11.5e9)


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
