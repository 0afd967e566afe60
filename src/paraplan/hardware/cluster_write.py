"""Cluster TOML files written: the inverse of hardware/cluster_file.py's reader (format version 1)."""

from __future__ import annotations

from pathlib import Path

from paraplan.hardware.cluster import Cluster, DeviceSpec, LinkSpec

FORMAT_VERSION = 1
GIB = 2**30


def cluster_to_dict(cluster: Cluster, calibration: dict | None = None) -> dict:
    """The TOML-ready form of a cluster (nodes written one by one, device types deduplicated);
    `calibration`: the measurements behind it, kept in the file for the record."""
    types: dict[str, DeviceSpec] = {}
    for node in cluster.nodes:
        for d in node.devices:
            types.setdefault(d.name, d)

    def link(lk: LinkSpec) -> dict:
        return {"bandwidth_bytes_per_s": lk.bandwidth_bytes_per_s, "latency_s": lk.latency_s}

    data = {
        "format_version": FORMAT_VERSION,
        "name": cluster.name,
        "description": cluster.description,
        "default_precision": cluster.default_precision,
        "device_types": {
            name: {"peak_flops": d.peaks if d.other_peaks else d.peak_flops, "memory_bandwidth_bytes_per_s": d.memory_bandwidth_bytes_per_s,
                   "memory_gib": d.memory_bytes / GIB, "kernel_overhead_s": d.kernel_overhead_s,
                   "max_efficiency": d.efficiencies if d.other_efficiencies else d.max_efficiency,
                   "half_efficiency_flops": d.half_efficiency_flops,
                   **({"sm_count": d.sm_count, "gemm_tile": list(d.gemm_tile),
                       "attention_efficiency": d.attention_efficiency, "memory_efficiency": d.memory_efficiency}
                      if d.sm_count else {}),
                   "source": d.source}
            for name, d in types.items()
        },
        "nodes": [{"name": n.name, "devices": [d.name for d in n.devices], "intra_link": link(n.intra_link),
                   "network": link(n.network), **({"rails": n.rails} if n.rails > 1 else {}),
                   **({"algorithms": list(n.algorithms)} if n.algorithms != ("ring",) else {}),
                   **({"nvls": link(n.nvls)} if n.nvls is not None else {})} for n in cluster.nodes],
    }
    if cluster.overheads is not None:
        o = cluster.overheads
        data["runtime"] = {"rendezvous": o.rendezvous, "action_s": o.action_s, "step_s": o.step_s,
                           "compute_scale": o.compute_scale, "tp_kernel_s": o.tp_kernel_s, "sdp_layer_s": o.sdp_layer_s,
                           "dp_sync_s": o.dp_sync_s,
                           "optimizer_s_per_byte": o.optimizer_s_per_byte,
                           **({"optimizer_curve": [list(p) for p in o.optimizer_curve]} if o.optimizer_curve else {}),
                           **({"solo_step_s": o.solo_step_s} if o.solo_step_s is not None else {}),
                           **({"exchange_s": o.exchange_s} if o.exchange_s else {}),
                           "source": o.source}
    if calibration:
        data["calibration"] = calibration
    return data


def write_cluster_file(cluster: Cluster, path: str | Path, calibration: dict | None = None) -> None:
    """Write atomically: a half-written cluster file is never left behind."""
    import tomli_w

    from paraplan.system.fileio import atomic_write_text

    atomic_write_text(path, tomli_w.dumps(cluster_to_dict(cluster, calibration)))
