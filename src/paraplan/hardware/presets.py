"""Cluster presets (one TOML file per paper testbed, shipped in presets/) and `local`.

`load_cluster(name_or_path)` takes a preset name or the path of a user's TOML file. A preset of
identical nodes takes another node count as `NAME?nodes=N` (dgx-h100-80gb?nodes=128: 1,024 GPUs).
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from paraplan.errors import ParaplanError, UnknownNameError
from paraplan.hardware.cluster import Cluster, DeviceSpec, LinkSpec, NodeSpec
from paraplan.hardware.cluster_file import cluster_from_dict, read_cluster_file, tomllib

LOCAL = "local"


def _preset_files() -> dict[str, Path]:
    folder = resources.files("paraplan.hardware") / "presets"
    return {Path(str(p)).stem: Path(str(p)) for p in folder.iterdir() if str(p).endswith(".toml")}


def preset_names() -> list[str]:
    return sorted(_preset_files()) + [LOCAL]


MAX_PRESET_NODES = 4096


def load_cluster(name_or_path: str) -> Cluster:
    if name_or_path == LOCAL:
        return local_cluster()
    files = _preset_files()
    name, _, query = name_or_path.partition("?")
    if name in files and (query or name == name_or_path):
        data = tomllib.loads(files[name].read_text())
        if query:
            data = _with_nodes(data, name, query)
        return cluster_from_dict(data, f"preset {name_or_path}")
    if name_or_path.endswith(".toml") or os.sep in name_or_path:
        return read_cluster_file(name_or_path)
    raise UnknownNameError("cluster", name_or_path, preset_names())


def _with_nodes(data: dict, name: str, query: str) -> dict:
    """The preset's one node table repeated N times (`nodes=N`), the cluster named NAME?nodes=N."""
    key, _, value = query.partition("=")
    if key != "nodes" or not value.isdigit() or not 1 <= int(value) <= MAX_PRESET_NODES:
        raise ParaplanError(f"cluster {name}?{query}: expected {name}?nodes=N with N a whole number of nodes "
                            f"from 1 to {MAX_PRESET_NODES}")
    if len(data["nodes"]) != 1:
        raise ParaplanError(f"cluster {name}?{query}: {name} lists {len(data['nodes'])} kinds of node; "
                            "a node count applies to presets of one kind")
    nodes = int(value)
    devices = len(data["nodes"][0]["devices"])
    return {**data, "name": f"{name}?nodes={nodes}", "nodes": [{**data["nodes"][0], "count": nodes}],
            "description": f"{data.get('description', '')} ({nodes} nodes, {nodes * devices} devices)"}


def _total_memory_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 * 2**30


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _half_peak(fp32_peak: float, units: tuple[str, ...]) -> float:
    """A 16-bit dtype's matmul peak on this machine's cores: fp32's with hardware for it, else the
    slow path's 1/50 (measured here: see local_cluster)."""
    return fp32_peak if _cpu_flags() & set(units) else fp32_peak / 50


def local_cluster() -> Cluster:
    """This machine's CPU cores as devices, one process per core, joined by gloo on loopback.

    The core figures are assumptions until `paraplan profile` measures the real ones: ~2.5 GHz
    with AVX2 FMA (32 fp32 FLOP/cycle, 80 GFLOP/s peak), eager PyTorch at ~25% of it, ~10 us of
    dispatch per aten kernel. bf16 and fp16 (`_half_peak`): the fp32 peak on a core with
    AVX512-BF16 / AMX or AVX512-FP16 (oneDNN's kernels); without them torch multiplies 16-bit
    matrices on a slow path, measured on this machine's AMD EPYC cores (no AVX512-BF16) at
    0.8-1.3 GFLOP/s against 57-74 GFLOP/s in fp32 (one thread, n = 256-1,024): 1/50 of the fp32 peak.
    Loopback gloo was measured at ~1.5 ms per message and ~2.2 GB/s
    (shared/notes/runtime-on-cpu.md). Memory is split evenly between the cores.
    """
    cores = os.cpu_count() or 1
    core = DeviceSpec(
        name="cpu-core", peak_flops=80.0e9, memory_bandwidth_bytes_per_s=10.0e9,
        memory_bytes=_total_memory_bytes() // cores, kernel_overhead_s=1.0e-5, max_efficiency=0.25,
        half_efficiency_flops=1.0e5, other_peaks=(("bf16", _half_peak(80.0e9, ("avx512_bf16", "amx_bf16"))),
                                                  ("fp16", _half_peak(80.0e9, ("avx512_fp16", "amx_fp16")))),
        source="assumed core figures; gloo loopback measured (runtime-on-cpu notes)",
    )
    loopback = LinkSpec(bandwidth_bytes_per_s=2.2e9, latency_s=1.5e-3)
    return Cluster(name=LOCAL, description=f"this machine: {cores} CPU cores as devices, gloo on loopback",
                   nodes=(NodeSpec(name="localhost", devices=(core,) * cores, intra_link=loopback, network=loopback),))


def launch_placement(cluster_ref: str, devices) -> tuple[int, int] | None:
    """(nodes, devices per node) that `devices` take on cluster `cluster_ref` (Cluster.placement:
    a launcher's --nnodes and --nproc-per-node), or None where that cluster cannot be loaded here."""
    try:
        return load_cluster(cluster_ref).placement(devices)
    except (ParaplanError, IndexError):
        return None
