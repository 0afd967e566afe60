"""What a planner says of its plan: the simulator's prediction (time, memory per device,
feasibility and what the numbers stand on) and how the plan was found."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceMemory:
    device: int
    peak_bytes: int
    capacity_bytes: int

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.capacity_bytes


# the engines whose implementation can price a plan (costs/engine_profile.py: PROFILES, in this order)
PRICED_BY = ("paraplan", "megatron", "torchtitan", "deepspeed")


@dataclass(frozen=True)
class Prediction:
    iteration_s: float
    throughput_samples_per_s: float
    memory: tuple[DeviceMemory, ...] = ()
    feasible: bool = True
    reason: str = ""  # when not feasible: e.g. "device 3 out of memory by 1.20 GiB"
    # what the prediction stands on (issue 33; workload.cost_source): "this machine, calibrated on
    # DATE", "analytic preset NAME", "profile FILE (...)"; "" in files written before it
    cost_source: str = ""
    # whose implementation priced it (costs/engine_profile.py): "paraplan" (its own runtime; files
    # written before issue 48 load so), "torchtitan", "megatron", "deepspeed"
    engine: str = "paraplan"


@dataclass(frozen=True)
class SearchInfo:
    planner: str
    search_s: float
    options: tuple[tuple[str, str | int | float | bool], ...] = ()
    note: str = ""  # one line when the planner did less than asked (fewer stages) and why; "" otherwise
