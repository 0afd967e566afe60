"""Device, link, node and cluster descriptions: pure frozen data, no I/O.

Nothing here assumes identical devices: every node lists its own devices (any mix of types) and
its own links, so heterogeneous clusters (CSIMD's cost model allows them) are ordinary data.
Links are full duplex: a device can send and receive at full bandwidth at once.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from functools import cached_property

from paraplan.errors import ParaplanError
from paraplan.hardware.links import GroupLink, LinkSpec, group_link


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator (or CPU core) type, for the analytic compute model in costs/analytic.py."""

    name: str
    peak_flops: float  # FLOP/s in fp32 (the one figure a version-1 cluster file gives)
    memory_bandwidth_bytes_per_s: float
    memory_bytes: int
    kernel_overhead_s: float  # launch + framework dispatch per aten kernel
    max_efficiency: float  # fraction of the fp32 peak large kernels reach (other dtypes: other_efficiencies)
    # Work per kernel (FLOPs) at which a kernel reaches half of max_efficiency: small micro-batches
    # leave the device under-filled, so time is not proportional to batch (CSIMD Fig. 1).
    half_efficiency_flops: float
    source: str = ""
    # the peaks of the other dtypes the device computes in, (dtype, FLOP/s) sorted by dtype
    # (precision.py: tf32, bf16, fp16); a dtype missing here the device does not have (no bf16 on a
    # V100, T4, P100 or TITAN RTX), and a plan in it is refused
    other_peaks: tuple[tuple[str, float], ...] = ()
    # max_efficiency of the other dtypes, (dtype, fraction) sorted by dtype, where it differs from
    # fp32's: tensor-core GEMMs reach another fraction of their peak than fp32's CUDA cores (the
    # A100: 0.869 of 312 TFLOPS in bf16, benchmarks/efficiency_fit.py; fp32 fitted apart,
    # benchmarks/paper_fidelity.py); a dtype missing here uses max_efficiency
    other_efficiencies: tuple[tuple[str, float], ...] = ()
    # The per-operator cost model (costs/op_roofline.py) for GPUs described down to their SMs; 0: the
    # layer roofline prices this device (CPUs, the papers' testbeds with their fitted constants)
    sm_count: int = 0
    gemm_tile: tuple[int, int] = (256, 128)  # cuBLAS's thread-block tile (M x N) for large GEMMs
    attention_efficiency: float = 0.0  # fraction of peak a fused (flash) attention kernel reaches
    memory_efficiency: float = 1.0  # fraction of the datasheet's memory bandwidth copies reach
    # The FP8 GEMMs of an FP8 plan (costs/fp8_linear.py): set only on the view `for_precision("fp8",
    # recipe)` returns (the peak of the recipe's dtype, `fp8` or `mxfp8`, and its efficiency); 0 elsewhere
    fp8_gemm_flops: float = 0.0
    fp8_gemm_efficiency: float = 0.0

    @property
    def operator_priced(self) -> bool:
        """Whether kernels are priced one by one on this device (costs/op_roofline.py)."""
        return self.sm_count > 0 and self.attention_efficiency > 0

    @property
    def peaks(self) -> dict[str, float]:
        """FLOP/s per dtype the device computes in, fp32 included."""
        return {"fp32": self.peak_flops, **dict(self.other_peaks)}

    @property
    def efficiencies(self) -> dict[str, float]:
        """max_efficiency per dtype given, fp32 included (the others fall back to fp32's)."""
        return {"fp32": self.max_efficiency, **dict(self.other_efficiencies)}

    def efficiency_for(self, precision: str) -> float:
        """The fraction of its peak a large kernel in `precision` reaches."""
        from paraplan.precision import Precision

        return self.efficiencies.get(str(Precision(precision)), self.max_efficiency)

    def peak_for(self, precision: str) -> float:
        """The peak a plan in `precision` computes at (each precision has its dtype's peak: tf32 the
        TF32 tensor cores'); a dtype the device does not have raises PrecisionError naming the
        device and the dtypes it has."""
        from paraplan.precision import Precision

        key = str(Precision(precision))
        if key not in self.peaks:
            raise PrecisionError(f"{self.name} has no {key} (it computes in {', '.join(sorted(self.peaks))})")
        return self.peaks[key]

    def for_precision(self, precision: str, fp8_recipe: str = "") -> DeviceSpec:
        """The device as a cost model in `precision` sees it: its peak and its efficiency in that dtype.
        fp8: bf16's (everything but the linears' GEMMs runs in bf16), and the FP8 GEMMs' peak and
        efficiency of the recipe's dtype (`fp8_gemm_peak`)."""
        from paraplan.precision import Precision

        if precision != Precision.FP8:
            return replace(self, peak_flops=self.peak_for(precision), max_efficiency=self.efficiency_for(precision))
        peak, efficiency = self.fp8_gemm_peak(fp8_recipe)
        return replace(self, peak_flops=self.peak_for(Precision.BF16), max_efficiency=self.efficiency_for(Precision.BF16),
                       fp8_gemm_flops=peak, fp8_gemm_efficiency=efficiency)

    def fp8_gemm_peak(self, fp8_recipe: str) -> tuple[float, float]:
        """(FLOP/s, efficiency) of the FP8 GEMMs `fp8_recipe` runs: MX FP8 needs the device's `mxfp8`
        peak (Blackwell), the others its `fp8` peak (Hopper, Ada); PrecisionError in one line when
        the device has none. An FP8 peak without its own efficiency takes bf16's."""
        from paraplan.precision import DEFAULT_FP8_RECIPE, Precision

        key = "mxfp8" if fp8_recipe == "mxfp8" else "fp8"
        if key not in self.peaks:
            has = "FP8 (Hopper or Ada)" if key == "fp8" else "MX FP8 (Blackwell)"
            raise PrecisionError(f"{self.name} has no {has} tensor cores for the fp8 recipe "
                                 f"{fp8_recipe or DEFAULT_FP8_RECIPE!r} (it computes in {', '.join(sorted(self.peaks))})")
        return self.peaks[key], self.efficiencies.get(key, self.efficiency_for(Precision.BF16))


class PrecisionError(ParaplanError):
    """A plan or request in a precision a device does not compute in."""


@dataclass(frozen=True)
class RuntimeOverheads:
    """What the runtime (torch.distributed.pipelining on gloo) costs beyond compute and transfers.

    The papers' models have none of these; a prediction of a real run needs them. They come from a
    measurement (`runtime/measure/compare.py: measured_overheads` on a recorded timeline, averaged over
    several runs by `paraplan calibrate`), never from constants: `source` says which. A cluster
    file written by `paraplan calibrate` carries them (its [runtime] table), so that plan,
    simulate and train --compare on that cluster predict with them.
      rendezvous: blocking point-to-point transfers that start only once the receiver posts its
                  receive (simulator/pipeline.py);
      action_s:   per pipeline action (schedule bookkeeping, the autograd engine starting, p2p calls);
      step_s:     per iteration, outside the schedule (optimizer, zeroing gradients, the loss).
      solo_step_s: the same for a plan on one device, where it was measured apart (None: step_s):
                  one process has no ranks to wait for at the step's end; the 2-rank figure put
                  3-6 ms too many on a one-process step of 44 ms here (paraplan calibrate).
      compute_scale: a layer's time while every device of the machine computes over its time
                  alone (CPU cores sharing caches, memory bandwidth or a host's hyperthreads); it
                  multiplies the compute of plans that use more than one device;
      tp_kernel_s: per kernel of a tensor-parallel layer's pass (DTensor dispatches every operator
                  of the layer: its cost grows with the kernel count), beyond the collectives' link time;
      sdp_layer_s: per layer and pass under sharded data parallelism (FSDP2: one unit per layer,
                  its hooks, copies and collective calls), beyond the collectives' link time;
      dp_sync_s:  per step of a plan whose layers sync their gradients over data-parallel replicas
                  (DDP's hooks, bucket copies and the all-reduce as it runs inside a step), beyond
                  the all-reduce's link time;
      optimizer_s_per_byte: the optimizer's step and the zeroing of gradients, per byte of model
                  states (parameters, gradients, optimizer states) a device holds; the device
                  holding the most finishes its step last.
      optimizer_curve: the same step measured at several sizes, (state bytes, seconds) ascending:
                  where it is given it replaces the per-byte rate (a step over states that fit in
                  the CPU's last-level cache runs 3-4x faster per byte than one beyond it: 1.0 and
                  3.5 ns per Adam parameter on a 2-core EPYC with 32 MiB of L3, so one rate
                  measured across the edge priced a small model's step 4x too slow).
    """

    rendezvous: bool = False
    action_s: float = 0.0
    step_s: float = 0.0
    source: str = "none"
    compute_scale: float = 1.0
    tp_kernel_s: float = 0.0
    sdp_layer_s: float = 0.0
    dp_sync_s: float = 0.0
    optimizer_s_per_byte: float = 0.0
    optimizer_curve: tuple[tuple[float, float], ...] = ()
    solo_step_s: float | None = None
    # per message of a schedule whose sender waits for its send (torch's Schedule1F1B batches a send
    # with its next receive and waits for both), beyond the link's latency: what a message costs
    # inside a running 1F1B pipeline over the loaded ping-pong (paraplan calibrate's doubling fit).
    # GPipe and the multi-chunk runtime post their sends and wait for them later: they pay the link
    # alone (simulator/pipeline.py)
    exchange_s: float = 0.0

    def __post_init__(self):
        if min(self.action_s, self.step_s, self.tp_kernel_s, self.sdp_layer_s, self.dp_sync_s, self.exchange_s,
               self.optimizer_s_per_byte, 0.0 if self.solo_step_s is None else self.solo_step_s) < 0 \
                or not self.compute_scale > 0:
            raise ValueError(f"runtime overheads must not be negative: {self}")
        sizes = [b for b, _ in self.optimizer_curve]
        if any(b <= 0 or s < 0 for b, s in self.optimizer_curve) or sizes != sorted(set(sizes)):
            raise ValueError(f"optimizer_curve: positive sizes in ascending order, seconds not negative: "
                             f"{self.optimizer_curve}")

    def optimizer_step_s(self, states_bytes: float) -> float:
        """The optimizer's step over `states_bytes` of model states: along the measured curve
        (linear between its points and from (0, 0) to the first, its last segment's slope beyond
        the last), else at the per-byte rate."""
        if not self.optimizer_curve or states_bytes <= 0:
            return self.optimizer_s_per_byte * max(states_bytes, 0.0)
        points = ((0.0, 0.0), *self.optimizer_curve)
        for (b0, s0), (b1, s1) in zip(points, points[1:], strict=False):
            if states_bytes <= b1:
                return s0 + (s1 - s0) * (states_bytes - b0) / (b1 - b0)
        (b0, s0), (b1, s1) = points[-2], points[-1]
        return s1 + (s1 - s0) / (b1 - b0) * (states_bytes - b1)

    def scale_for(self, n_devices_used: int) -> float:
        """What multiplies compute times in a plan on `n_devices_used` devices."""
        return self.compute_scale if n_devices_used > 1 else 1.0

    def step_for(self, n_devices_used: int) -> float:
        """The per-iteration cost outside the schedule of a plan on `n_devices_used` devices."""
        return self.solo_step_s if n_devices_used == 1 and self.solo_step_s is not None else self.step_s


@dataclass(frozen=True)
class NodeSpec:
    name: str
    devices: tuple[DeviceSpec, ...]
    intra_link: LinkSpec  # between two devices of this node (PCIe, NVLink, shared memory)
    network: LinkSpec  # one port of this node to the inter-node network (Ethernet, InfiniBand)
    # network ports (rails) of the node, each of `network`'s bandwidth: a DGX has one per GPU (8), and
    # a collective whose group has k GPUs on the node sends over min(k, rails) of them (NCCL runs one
    # ring channel per rail); 1: one port the node's GPUs share
    rails: int = 1
    # the collective algorithms the node's library picks among (hardware/links.py): ring always;
    # NCCL's tree across nodes; NVLS (NVLink SHARP) inside an NVSwitch node of Hopper or later,
    # `nvls` its all-reduce's alpha and bus bandwidth
    algorithms: tuple[str, ...] = ("ring",)
    nvls: LinkSpec | None = None


@dataclass(frozen=True)
class DeviceSlot:
    """A device's place in the cluster: global id, node, index within the node, and its type."""

    id: int
    node: int
    local_index: int
    spec: DeviceSpec


@dataclass(frozen=True)
class StorageSpec:
    """The file system checkpoints are written to and read back from, which every node reaches (a
    node's own disk is lost with the node): its aggregate read bandwidth; each node reads through
    its network port (NodeSpec.network)."""

    shared_read_bytes_per_s: float
    source: str


# Assumed, not measured: a parallel file system of a few storage servers (one NVMe server reads
# about 10-25 GB/s; 10 GB/s for the whole cluster is a modest one). A cluster file's [storage]
# table replaces it (docs/clusters.md).
DEFAULT_STORAGE = StorageSpec(10.0e9, "assumed: a shared file system reading 10 GB/s in all (no measurement)")


@dataclass(frozen=True)
class Cluster:
    name: str
    nodes: tuple[NodeSpec, ...]
    description: str = ""
    # where a checkpoint is read back from after a failure (issue 53: costs/restart.py); None:
    # DEFAULT_STORAGE
    storage: StorageSpec | None = None
    # the runtime's measured overheads on this cluster (`paraplan calibrate`); None: not measured
    overheads: RuntimeOverheads | None = None
    # the precision a request on this cluster trains in unless it names one (precision.py): fp32 for
    # the papers' testbeds, bf16 for the A100-80GB / H100-80GB presets
    default_precision: str = "fp32"

    @cached_property
    def devices(self) -> tuple[DeviceSlot, ...]:
        slots = []
        for n, node in enumerate(self.nodes):
            for i, spec in enumerate(node.devices):
                slots.append(DeviceSlot(id=len(slots), node=n, local_index=i, spec=spec))
        return tuple(slots)

    def placement(self, devices) -> tuple[int, int]:
        """(nodes, devices per node) that `devices` (ids) take: what a launcher's --nnodes and
        --nproc-per-node say (the fullest node's count)."""
        per_node = Counter(self.devices[d].node for d in devices)
        return len(per_node), max(per_node.values(), default=0)

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

    def slowest_link(self, group: tuple[int, ...]) -> GroupLink:
        """What a collective over `group` runs on: its ring's bottleneck link, and the other
        algorithms its library may pick (hardware/links.py: group_link)."""
        # memoised per group: the simulator asks for every layer of every stage (a hybrid plan on
        # 1,024 devices: 82 layers x 3 dimensions x groups of up to 128, 5.7 M links per 300 plans)
        cache = self.__dict__.setdefault("_ring_links", {})
        key = tuple(group)
        if key not in cache:
            cache[key] = group_link(self, key)
        return cache[key]

    def with_memory(self, memory_bytes: int) -> Cluster:
        """The same cluster with every device's memory set to a budget (a user's limit)."""
        return replace(self, nodes=tuple(
            replace(n, devices=tuple(replace(d, memory_bytes=memory_bytes) for d in n.devices))
            for n in self.nodes))

    def without_nodes(self, names) -> Cluster:
        """The cluster less the named nodes (a fallback ladder's rung: planners/ladder.py)."""
        names = list(names)
        return replace(self, name=f"{self.name} less {', '.join(names)}",
                       nodes=tuple(n for n in self.nodes if n.name not in names))

    def without_last_devices(self, k: int) -> Cluster:
        """A one-node cluster less its last `k` devices."""
        node = self.nodes[0]
        return replace(self, name=f"{self.name} less {k} device{'s' if k != 1 else ''}",
                       nodes=(replace(node, devices=node.devices[:len(node.devices) - k]),))

    def with_memory_of_kinds(self, budgets: dict[str, int]) -> Cluster:
        """The same cluster with the devices of each named type at its budget; others as they are."""
        return replace(self, nodes=tuple(
            replace(n, devices=tuple(replace(d, memory_bytes=budgets.get(d.name, d.memory_bytes)) for d in n.devices))
            for n in self.nodes))

    def with_memory_scaled(self, factor: float) -> Cluster:
        """The same cluster with every device's memory times `factor` (a planning headroom)."""
        return replace(self, nodes=tuple(
            replace(n, devices=tuple(replace(d, memory_bytes=int(d.memory_bytes * factor)) for d in n.devices))
            for n in self.nodes))

    def check_precision(self, precision: str, fp8_recipe: str = "") -> None:
        """Raise PrecisionError (one line, naming the cluster and the device type) unless every
        device computes in `precision` (fp8: with `fp8_recipe`'s FP8 GEMMs)."""
        seen = set()
        for slot in self.devices:
            if slot.spec.name not in seen:
                seen.add(slot.spec.name)
                try:
                    if precision == "fp8":  # first: its line names the tensor cores missing
                        slot.spec.fp8_gemm_peak(fp8_recipe)
                    slot.spec.peak_for(precision)
                except PrecisionError as exc:
                    raise PrecisionError(f"{self.name}: {exc}") from None

    def device_types(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for slot in self.devices:
            counts[slot.spec.name] = counts.get(slot.spec.name, 0) + 1
        return counts


def canonical_node_order(nodes: list[NodeSpec], precision: str) -> list[NodeSpec]:
    """A cluster of several device kinds numbers its devices from the fastest node down (its slowest
    device's peak in the cluster's precision, then its total, then what it holds), whatever order the
    file lists the nodes in: planners give stage s the s-th group, so a plan, and the comparison's
    choice, would otherwise depend on the file's order (issue 52). Nodes alike keep the file's order."""
    def peak(d) -> float:
        try:
            return d.peak_for(precision)
        except PrecisionError:
            return d.peak_flops

    def key(n: NodeSpec):
        return (-min(peak(d) for d in n.devices), -sum(peak(d) for d in n.devices), tuple(d.name for d in n.devices),
                -n.intra_link.bandwidth_bytes_per_s, -n.network.bandwidth_bytes_per_s, n.rails)

    return sorted(nodes, key=key)
