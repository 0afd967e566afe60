"""Peak memory of every device under a plan, from the per-layer strategy costs (costs/strategy.py).

Per device of a stage:
  model states  = the states of every layer whose backward (and update) the stage runs, sharded by
                  tp x sdp (costs/strategy.py: fp32 Adam, 16 bytes per parameter by default);
                  Bi-Partition: a layer whose forward runs here but whose backward runs elsewhere
                  costs only a copy of its latest weights (the paper's "partial copy");
  activations   = for each layer whose backward runs here, its saved tensors (costs/strategy.py) times
                  the micro-batches in flight between its forward and this backward: GPipe keeps all
                  n_micro; 1F1B keeps min(n_stages - stage, n_micro) (Galvatron §II-B); with the
                  forward on stage a and the backward on stage b (Bi-Partition, which sends the
                  activations to the backward owner), ceil(n_stages - (a + b) / 2) (the steady state
                  has one forward and one backward per stage per cycle, and a pass moves one stage per
                  half cycle), plus one checkpointed layer's recomputation;
  weight stash  = async 1F1B (PipeDream) keeps n_stages - stage - 1 older weight versions;
  reserve       = a fixed per-device amount (CUDA context, allocator, workspace).
A tied weight used on a stage that does not hold its owner (GPT-2's head) is a second copy there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from paraplan.costs.memory_config import GIB, MemoryConfig
from paraplan.costs.strategy import layer_memory
from paraplan.models.spec import ModelSpec
from paraplan.plan.plan import DeviceMemory, Plan

__all__ = ["GIB", "MemoryBreakdown", "MemoryConfig", "micro_batches_in_flight", "out_of_memory_reason",
           "plan_memory", "stage_memory"]


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


def micro_batches_in_flight(schedule: str, n_stages: int, stage: int, n_micro: int,
                            forward_stage: int | None = None) -> int:
    """Micro-batches whose activations wait on `stage` for their backward; `forward_stage` is where
    their forward ran when that is another stage (Bi-Partition)."""
    if schedule == "gpipe":
        return n_micro
    a = stage if forward_stage is None else forward_stage
    return max(1, min(n_micro, math.ceil(n_stages - (a + stage) / 2)))


def stage_memory(plan: Plan, model: ModelSpec, stage_index: int, config: MemoryConfig | None = None) -> MemoryBreakdown:
    config = config or MemoryConfig()
    stage = plan.stages[stage_index]
    micro = plan.global_batch / plan.n_micro  # entering the stage's group; strategies split it further
    forward_owner = {i: s for s, st in enumerate(plan.stages) for i in st.layers}
    held = set(stage.layers) | set(stage.backward)
    states = stash = activations = recompute = 0.0
    in_flight_here = micro_batches_in_flight(plan.schedule, plan.n_stages, stage_index, plan.n_micro)
    for i in sorted(held):
        layer = model.layers[i]
        tied_copy = bool(layer.shared_param_bytes) and any(o not in held for o in layer.shared_owners)
        m = layer_memory(model, i, stage.strategy(i), micro, config, tied_copy)
        if i in stage.backward:
            states += m.states_bytes
            in_flight = micro_batches_in_flight(plan.schedule, plan.n_stages, stage_index, plan.n_micro,
                                                forward_owner[i])
            activations += in_flight * m.saved_bytes
            recompute = max(recompute, m.recompute_bytes)
        else:  # Bi-Partition: forward only here; the backward owner updates and sends the weights back
            states += m.weights_bytes
        if i in stage.layers:
            stash += m.weights_bytes
    stash_versions = plan.n_stages - stage_index - 1 if plan.schedule == "async-1f1b" else 0
    return MemoryBreakdown(device=stage.devices[0], stage=stage_index, states_bytes=states,
                           activation_bytes=activations + recompute, stash_bytes=stash_versions * stash,
                           reserve_bytes=config.reserve_bytes, in_flight=in_flight_here)


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
