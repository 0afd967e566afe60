"""Cluster TOML files: read, validate, write. Format version 1:

    format_version = 1
    name = "my-cluster"
    description = "..."

    default_precision = "fp32"             # optional (default fp32): fp32 | tf32 | bf16 | fp16

    [device_types.v100-32gb]
    peak_flops = 14.0e12                  # FLOP/s in fp32, or a table per dtype the device has:
                                          # { fp32 = 14e12, fp16 = 112e12 } (fp32 required; a
                                          # dtype left out is one the device refuses; fp8: the
                                          # FP8 tensor cores of Hopper / Ada, mxfp8: Blackwell's)
    memory_bandwidth_bytes_per_s = 900e9
    memory_gib = 32
    kernel_overhead_s = 1.0e-5
    max_efficiency = 0.7                  # a fraction in (0, 1], or a table per dtype:
                                          # { fp32 = 0.6, bf16 = 0.87 } (fp32 required; a dtype
                                          # left out uses fp32's; only dtypes in peak_flops)
    half_efficiency_flops = 2.0e8
    source = "where these numbers come from"

    [[nodes]]
    name = "server"
    count = 8                              # this node repeated (optional, default 1)
    devices = ["v100-32gb"]                # one entry per device; types may be mixed
    intra_link = { bandwidth_bytes_per_s = 12e9, latency_s = 1e-5 }
    network = { bandwidth_bytes_per_s = 1.175e9, latency_s = 5e-5 }
    rails = 1                              # optional: network ports (a DGX: one per GPU)
    algorithms = ["ring"]                  # optional: + "tree", "nvls" (NCCL's, with nvls = {...})

    [runtime]                              # optional: the runtime's measured overheads
    rendezvous = true                      # (written by `paraplan calibrate`)
    action_s = 2.5e-4
    step_s = 5e-3
    solo_step_s = 1e-3                     # optional (default step_s): per step of a one-device plan
    exchange_s = 8e-4                      # optional (default 0): per message of a 1F1B pipeline, beyond the link
    compute_scale = 1.1                    # optional (default 1): compute while every device computes
    tp_kernel_s = 5e-5                     # optional (default 0): per kernel of a TP layer's pass
    sdp_layer_s = 1e-3                     # optional (default 0): per layer and pass under SDP
    dp_sync_s = 2e-3                       # optional (default 0): per step of a plan syncing DP gradients
    optimizer_s_per_byte = 3e-10          # optional (default 0): per byte of model states a device holds
    optimizer_curve = [[1.6e7, 1e-3], [6.4e7, 1.4e-2]]  # optional: (state bytes, seconds) measured, ascending;
                                           # replaces the per-byte rate where given
    source = "how they were measured"

    [calibration]                          # optional, not read back: the evidence behind the
    ...                                    # figures above (`paraplan calibrate` writes it)

Every error names the file, the field and what was expected, in one line.
"""

from __future__ import annotations

import sys
from pathlib import Path

from paraplan.errors import ParaplanError
from paraplan.hardware.cluster import (
    Cluster,
    DeviceSpec,
    LinkSpec,
    NodeSpec,
    PrecisionError,
    RuntimeOverheads,
    StorageSpec,
    canonical_node_order,
)
from paraplan.hardware.cluster_write import FORMAT_VERSION, GIB
from paraplan.hardware.links import algorithms_problem
from paraplan.system.fileio import is_finite_number, read_text

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


_DEVICE_FIELDS = {
    "peak_flops": "FLOP/s",
    "memory_bandwidth_bytes_per_s": "bytes/s",
    "memory_gib": "GiB",
    "kernel_overhead_s": "seconds",
    "max_efficiency": "a fraction in (0, 1]",
    "half_efficiency_flops": "FLOPs",
}
# optional: a GPU described down to its SMs is priced kernel by kernel (costs/op_roofline.py)
_OPERATOR_FIELDS = {
    "sm_count": "streaming multiprocessors, a whole number",
    "attention_efficiency": "a fraction in (0, 1]",
    "memory_efficiency": "a fraction in (0, 1]",
}


class ClusterFileError(ParaplanError):
    pass


def _shown(key: str) -> str:
    """A key of the file as an error shows it: quoted when it holds a space, a newline or an
    unprintable character, so that the message stays one line."""
    return key if key.isprintable() and not any(c.isspace() for c in key) else repr(key)


def _shown_number(value) -> str:
    """The value as an error shows it, one line and short (an integer of 400 digits is not)."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"


def _number(where: str, table: dict, key: str, expected: str, allow_zero: bool = False) -> float:
    if key not in table:
        raise ClusterFileError(f"{where}.{key}: missing (expected {expected})")
    value = table[key]
    if not is_finite_number(value):
        raise ClusterFileError(f"{where}.{key}: expected a number ({expected}), got {_shown_number(value)}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ClusterFileError(f"{where}.{key}: expected a positive number ({expected}), got {value!r}")
    return float(value)


def _link(where: str, table: object) -> LinkSpec:
    if not isinstance(table, dict):
        raise ClusterFileError(f"{where}: expected a table {{ bandwidth_bytes_per_s = ..., latency_s = ... }}")
    return LinkSpec(bandwidth_bytes_per_s=_number(where, table, "bandwidth_bytes_per_s", "bytes/s"),
                    latency_s=_number(where, table, "latency_s", "seconds", allow_zero=True))


def _peaks(where: str, table: dict) -> tuple[float, tuple[tuple[str, float], ...]]:
    """`peak_flops`: one number (fp32) or a table per dtype; (fp32 peak, the other dtypes' peaks)."""
    from paraplan.precision import PEAK_DTYPES as PRECISIONS

    value = table.get("peak_flops")
    if not isinstance(value, dict):
        return _number(where, table, "peak_flops", "FLOP/s, or a table { fp32 = ..., bf16 = ... }"), ()
    for key in value:
        if key not in PRECISIONS:
            raise ClusterFileError(f"{where}.peak_flops.{_shown(key)}: unknown dtype; expected any of "
                                   f"{', '.join(PRECISIONS)}")
    fp32 = _number(f"{where}.peak_flops", value, "fp32", "FLOP/s; every device computes in fp32")
    return fp32, tuple(sorted((key, _number(f"{where}.peak_flops", value, key, "FLOP/s"))
                              for key in value if key != "fp32"))


def _fraction(where: str, table: dict, key: str) -> float:
    value = _number(where, table, key, "a fraction in (0, 1]")
    if value > 1:
        raise ClusterFileError(f"{where}.{key}: expected a fraction in (0, 1], got {value}")
    return value


def _efficiencies(where: str, table: dict, dtypes: set[str]) -> tuple[float, tuple[tuple[str, float], ...]]:
    """`max_efficiency`: one fraction (every dtype) or a table per dtype the device has; (fp32's,
    the other dtypes')."""
    from paraplan.precision import PEAK_DTYPES as PRECISIONS

    value = table.get("max_efficiency")
    if not isinstance(value, dict):
        return _fraction(where, table, "max_efficiency"), ()
    inner = f"{where}.max_efficiency"
    for key in value:
        if key not in PRECISIONS:
            raise ClusterFileError(f"{inner}.{_shown(key)}: unknown dtype; expected any of {', '.join(PRECISIONS)}")
        if key not in dtypes:
            raise ClusterFileError(f"{inner}.{key}: the device has no {key} peak (peak_flops gives "
                                   f"{', '.join(sorted(dtypes))})")
    fp32 = _number(inner, value, "fp32", "a fraction in (0, 1]; a dtype left out uses fp32's")
    if fp32 > 1:
        raise ClusterFileError(f"{inner}.fp32: expected a fraction in (0, 1], got {fp32}")
    return fp32, tuple(sorted((key, _fraction(inner, value, key)) for key in value if key != "fp32"))


def _device(where: str, name: str, table: object) -> DeviceSpec:
    if not isinstance(table, dict):
        raise ClusterFileError(f"{where}: expected a table of device figures")
    fp32, other_peaks = _peaks(where, table)
    efficiency, other_efficiencies = _efficiencies(where, table, {"fp32", *dict(other_peaks)})
    values = {key: _number(where, table, key, unit) for key, unit in _DEVICE_FIELDS.items()
              if key not in ("peak_flops", "max_efficiency")}
    return DeviceSpec(
        name=name, peak_flops=fp32, other_peaks=other_peaks,
        memory_bandwidth_bytes_per_s=values["memory_bandwidth_bytes_per_s"],
        memory_bytes=int(values["memory_gib"] * GIB), kernel_overhead_s=values["kernel_overhead_s"],
        max_efficiency=efficiency, other_efficiencies=other_efficiencies,
        half_efficiency_flops=values["half_efficiency_flops"], source=str(table.get("source", "")),
        **_operator_fields(where, table),
    )


def _operator_fields(where: str, table: dict) -> dict:
    """The optional figures of the per-operator cost model: all of sm_count, attention_efficiency and
    memory_efficiency, or none; gemm_tile = [M, N] optional."""
    given = [key for key in _OPERATOR_FIELDS if key in table]
    if not given:
        return {}
    if len(given) < len(_OPERATOR_FIELDS):
        missing = next(key for key in _OPERATOR_FIELDS if key not in table)
        raise ClusterFileError(f"{where}.{missing}: missing (expected {_OPERATOR_FIELDS[missing]}; "
                               f"{', '.join(_OPERATOR_FIELDS)} go together)")
    sm = _number(where, table, "sm_count", _OPERATOR_FIELDS["sm_count"])
    if sm != int(sm):
        raise ClusterFileError(f"{where}.sm_count: expected a whole number of SMs, got {table['sm_count']!r}")
    out = {"sm_count": int(sm), "attention_efficiency": _fraction(where, table, "attention_efficiency"),
           "memory_efficiency": _fraction(where, table, "memory_efficiency")}
    if "gemm_tile" in table:
        tile = table["gemm_tile"]
        if not (isinstance(tile, list) and len(tile) == 2 and all(isinstance(x, int) and not isinstance(x, bool)
                                                                   and x > 0 for x in tile)):
            raise ClusterFileError(f"{where}.gemm_tile: expected [M, N], two positive whole numbers, got {tile!r}")
        out["gemm_tile"] = (tile[0], tile[1])
    return out


def cluster_from_dict(data: dict, origin: str) -> Cluster:
    """Validate a parsed cluster file; `origin` (the file name) starts every error message."""
    version = data.get("format_version")
    if version != FORMAT_VERSION:
        raise ClusterFileError(f"{origin}: format_version: expected {FORMAT_VERSION}, got {version!r}")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise ClusterFileError(f"{origin}: name: expected a non-empty string")
    types_table = data.get("device_types")
    if not isinstance(types_table, dict) or not types_table:
        raise ClusterFileError(f"{origin}: device_types: expected at least one [device_types.NAME] table")
    types = {t: _device(f"{origin}: device_types.{_shown(t)}", t, tbl) for t, tbl in types_table.items()}
    nodes_list = data.get("nodes")
    if not isinstance(nodes_list, list) or not nodes_list:
        raise ClusterFileError(f"{origin}: nodes: expected at least one [[nodes]] table")
    nodes: list[NodeSpec] = []
    for i, node in enumerate(nodes_list):
        where = f"{origin}: nodes[{i}]"
        if not isinstance(node, dict):
            raise ClusterFileError(f"{where}: expected a table")
        devices = node.get("devices")
        if not isinstance(devices, list) or not devices:
            raise ClusterFileError(f"{where}.devices: expected a non-empty list of device type names")
        for d in devices:
            if not isinstance(d, str) or d not in types:
                raise ClusterFileError(f"{where}.devices: unknown device type {d!r} (defined: {', '.join(types)})")
        count = node.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ClusterFileError(f"{where}.count: expected a positive integer, got {count!r}")
        _check_materialisable(f"{where}.count", count, len(devices), sum(len(n.devices) for n in nodes))
        intra = _link(f"{where}.intra_link", node.get("intra_link"))
        network = _link(f"{where}.network", node.get("network"))
        rails = node.get("rails", 1)
        if isinstance(rails, bool) or not isinstance(rails, int) or rails < 1:
            raise ClusterFileError(f"{where}.rails: expected the node's number of network ports, a positive "
                                   f"integer, got {rails!r}")
        nvls = _link(f"{where}.nvls", node["nvls"]) if "nvls" in node else None
        if problem := algorithms_problem(algorithms := node.get("algorithms", ["ring"]), nvls is not None):
            raise ClusterFileError(f"{where}.algorithms: {problem}")
        base = str(node.get("name", f"node{i}"))
        for c in range(count):
            nodes.append(NodeSpec(name=base if count == 1 else f"{base}{c}", devices=tuple(types[d] for d in devices),
                                  intra_link=intra, network=network, rails=rails, algorithms=tuple(algorithms),
                                  nvls=nvls))
    default = _default_precision(origin, data)
    if len({d.name for n in nodes for d in n.devices}) > 1:
        nodes = canonical_node_order(nodes, default)
    cluster = Cluster(name=name, nodes=tuple(nodes), description=str(data.get("description", "")),
                      overheads=_runtime(f"{origin}: runtime", data["runtime"]) if "runtime" in data else None,
                      storage=_storage(f"{origin}: storage", data["storage"]) if "storage" in data else None,
                      default_precision=default)
    try:
        cluster.check_precision(cluster.default_precision)
    except PrecisionError as exc:
        raise ClusterFileError(f"{origin}: default_precision: {exc}") from None
    return cluster


def _default_precision(origin: str, data: dict) -> str:
    from paraplan.precision import PRECISIONS

    value = data.get("default_precision", "fp32")
    if value not in PRECISIONS:
        raise ClusterFileError(f"{origin}: default_precision: expected one of {', '.join(PRECISIONS)}, got {value!r}")
    return value


BYTES_PER_DEVICE = 512  # a device's slot, its entry in its node and its share of the node (measured ~300)


def _check_materialisable(where: str, count: int, per_node: int, so_far: int) -> None:
    """A node count whose devices would not fit in this machine's memory is refused in one line
    (a count of 10**12 otherwise builds nodes until the kernel kills the process)."""
    from paraplan.system.host import available_memory_bytes, gib

    available = available_memory_bytes()
    devices = so_far + count * per_node
    if available is not None and devices * BYTES_PER_DEVICE > available:
        raise ClusterFileError(f"{where}: {count:,} nodes of {per_node} devices ({devices:,} devices in all) would "
                               f"take ~{gib(devices * BYTES_PER_DEVICE)} to describe; this machine has "
                               f"{gib(available)} available (at most {available // BYTES_PER_DEVICE:,} devices)")


def _storage(where: str, table: object) -> StorageSpec:
    """[storage]: shared_read_bytes_per_s (positive) and where the figure comes from (source)."""
    if not isinstance(table, dict) or set(table) - {"shared_read_bytes_per_s", "source"}:
        raise ClusterFileError(f"{where}: expected a table of shared_read_bytes_per_s and source")
    value = table.get("shared_read_bytes_per_s")
    if not is_finite_number(value) or value <= 0:
        raise ClusterFileError(f"{where}.shared_read_bytes_per_s: expected a positive number of bytes per second, "
                               f"got {value!r}")
    return StorageSpec(float(value), str(table.get("source", "")))


def _runtime(where: str, table: object) -> RuntimeOverheads:
    if not isinstance(table, dict):
        raise ClusterFileError(f"{where}: expected a table {{ rendezvous = ..., action_s = ..., step_s = ... }}")
    rendezvous = table.get("rendezvous", False)
    if not isinstance(rendezvous, bool):
        raise ClusterFileError(f"{where}.rendezvous: expected true or false, got {rendezvous!r}")
    optional = {key: _number(where, table, key, unit, allow_zero=key != "compute_scale")
                for key, unit in (("compute_scale", "a factor"), ("tp_kernel_s", "seconds"), ("sdp_layer_s", "seconds"),
                                  ("dp_sync_s", "seconds"), ("optimizer_s_per_byte", "seconds per byte"),
                                  ("solo_step_s", "seconds"), ("exchange_s", "seconds"))
                if key in table}
    if "optimizer_curve" in table:
        optional["optimizer_curve"] = _optimizer_curve(f"{where}.optimizer_curve", table["optimizer_curve"])
    return RuntimeOverheads(rendezvous=rendezvous, action_s=_number(where, table, "action_s", "seconds", True),
                            step_s=_number(where, table, "step_s", "seconds", True),
                            source=str(table.get("source", where)), **optional)


def _optimizer_curve(where: str, value: object) -> tuple[tuple[float, float], ...]:
    """[[state bytes, seconds], ...]: sizes positive and ascending, seconds not negative."""
    def number(x: object) -> bool:
        return is_finite_number(x)

    if not isinstance(value, list) or not value or not all(
            isinstance(p, list) and len(p) == 2 and all(number(x) for x in p) for p in value):
        raise ClusterFileError(f"{where}: expected a list of [state bytes, seconds] pairs, got {value!r}")
    points = tuple((float(b), float(s)) for b, s in value)
    sizes = [b for b, _ in points]
    if any(b <= 0 or s < 0 for b, s in points) or sizes != sorted(set(sizes)):
        raise ClusterFileError(f"{where}: sizes must be positive and ascending and seconds not negative, got {value!r}")
    return points


def read_cluster_file(path: str | Path) -> Cluster:
    path = Path(path)
    text = read_text(path, "cluster file", ClusterFileError)  # TOML is UTF-8
    try:
        data = tomllib.loads(text)
    except (ValueError, RecursionError) as exc:
        # TOMLDecodeError is a ValueError, and so is an integer of more than 4,300 digits; arrays
        # nested a thousand deep exhaust the parser's recursion
        what = exc if isinstance(exc, ValueError) else "nested too deeply"
        raise ClusterFileError(f"{path}: malformed TOML: {what}") from None
    return cluster_from_dict(data, str(path))
