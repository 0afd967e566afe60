"""Peak memory of every device under a plan.

Per device of a stage:
  model states  = sum over the stage's layers of params x state_bytes_per_param / (tp x sdp)
                  (fp32 Adam: 4 param + 4 grad + 8 moments = 16 bytes per parameter by default;
                  sdp shards all of it, ZeRO-3 / FSDP; tp splits the layer's weights)
  activations   = micro-batches in flight x what each keeps for backward:
                  GPipe keeps all n_micro; 1F1B keeps min(n_stages - stage, n_micro) (Galvatron §II-B);
                  a checkpointed layer keeps only its input (the boundary activation), and one
                  layer's full saved set comes back during its recomputation;
                  per layer at the local batch micro / (dp x sdp), divided by tp (Megatron splits
                  most activations of a tensor-parallel layer);
  weight stash  = async 1F1B (PipeDream) keeps n_stages - stage - 1 older weight versions;
  reserve       = a fixed per-device amount (CUDA context, allocator, workspace).
A tied weight used on a stage that does not own it (GPT-2's head) is a second copy there.

Bi-Partition: a worker's saved activations are those of its forward range (they are made there).
"""

from __future__ import annotations

from dataclasses import dataclass

from paraplan.models.spec import ModelSpec
from paraplan.plan.plan import DeviceMemory, Plan

GIB = 2**30


@dataclass(frozen=True)
class MemoryConfig:
    state_bytes_per_param: float = 16.0  # fp32 Adam; mixed precision with fp32 master weights: 16 too
    param_bytes_per_param: float = 4.0  # the weights alone (what a weight stash copies)
    activation_scale: float = 1.0  # measured in fp32; 0.5 for fp16/bf16 activations
    reserve_bytes: int = GIB // 2


@dataclass(frozen=True)
class MemoryBreakdown:
    device: int
    stage: int
    states_bytes: float
    activation_bytes: float
    stash_bytes: float
    reserve_bytes: float
    in_flight: int

    @property
    def peak_bytes(self) -> float:
        return self.states_bytes + self.activation_bytes + self.stash_bytes + self.reserve_bytes


def micro_batches_in_flight(schedule: str, n_stages: int, stage: int, n_micro: int) -> int:
    if schedule == "gpipe":
        return n_micro
    return min(n_stages - stage, n_micro)


def stage_memory(plan: Plan, model: ModelSpec, stage_index: int, config: MemoryConfig | None = None) -> MemoryBreakdown:
    config = config or MemoryConfig()
    stage = plan.stages[stage_index]
    micro = plan.global_batch / plan.n_micro
    replicas_dp = 1 if stage.strategies else len(stage.devices)
    owned = set(stage.layers)
    states = stash = 0.0
    boundary = full = recompute_peak = 0.0
    for i in stage.layers:
        layer = model.layers[i]
        s = stage.strategy(i)
        params = layer.param_bytes / model.dtype_bytes
        # a tied weight owned by a layer on another stage is a separate copy here
        if layer.shared_param_bytes and any(o not in owned for o in layer.shared_owners):
            params += layer.shared_param_bytes / model.dtype_bytes
        states += params * config.state_bytes_per_param / (s.tp * s.sdp)
        stash += params * config.param_bytes_per_param / (s.tp * s.sdp)
        local = micro / replicas_dp / (s.data_degree if stage.strategies else 1)
        saved = layer.saved_bytes.at(local) * config.activation_scale / s.tp
        if s.checkpoint:
            previous = model.layers[i - 1].output_bytes if i > 0 else model.input_bytes
            boundary += previous.at(local) * config.activation_scale / s.tp
            recompute_peak = max(recompute_peak, saved)
        else:
            full += saved
    in_flight = micro_batches_in_flight(plan.schedule, plan.n_stages, stage_index, plan.n_micro)
    activations = in_flight * (full + boundary) + recompute_peak
    stash_versions = plan.n_stages - stage_index - 1 if plan.schedule == "async-1f1b" else 0
    return MemoryBreakdown(device=stage.devices[0], stage=stage_index, states_bytes=states,
                           activation_bytes=activations, stash_bytes=stash_versions * stash,
                           reserve_bytes=config.reserve_bytes, in_flight=in_flight)


def plan_memory(plan: Plan, model: ModelSpec, capacities: dict[int, int],
                config: MemoryConfig | None = None) -> tuple[tuple[DeviceMemory, ...], tuple[MemoryBreakdown, ...]]:
    """Peak bytes of every device the plan uses (every device of a stage holds the same)."""
    out, breakdowns = [], []
    for s, stage in enumerate(plan.stages):
        b = stage_memory(plan, model, s, config)
        breakdowns.append(b)
        for d in stage.devices:
            out.append(DeviceMemory(device=d, peak_bytes=int(round(b.peak_bytes)), capacity_bytes=capacities[d]))
    return tuple(out), tuple(breakdowns)


def out_of_memory_reason(memory: tuple[DeviceMemory, ...]) -> str:
    """'' when everything fits, else the worst device and by how much."""
    over = [m for m in memory if not m.fits]
    if not over:
        return ""
    worst = max(over, key=lambda m: m.peak_bytes - m.capacity_bytes)
    extra = f" (and {len(over) - 1} more)" if len(over) > 1 else ""
    return (f"device {worst.device} out of memory by {(worst.peak_bytes - worst.capacity_bytes) / GIB:.2f} GiB: "
            f"needs {worst.peak_bytes / GIB:.2f} GiB of {worst.capacity_bytes / GIB:.2f} GiB{extra}")
