"""How fast Bi-Partition's exact DP is: bipartition_all over L layers and up to M workers (goal: under
10 s at 100 layers and 64 workers), with links and memory checks of the kind the planner passes.

Writes bench-out/planner_speed/bipartition.{json,png} (`make results`: results/planner_speed/).
Run: .venv/bin/python benchmarks/planner_speed_bipartition.py [--quick]

The model is a synthetic GPT-like stack (an embedding, equal blocks, a heavier head) with per-layer
times, parameters, saved activations and outputs; links are alpha + bytes / bandwidth. Memory is
the planner's count (planners/bipartition/planner.py): fp32 Adam states and the saved activations of the
layers whose backward a worker runs, kept for the micro-batches in flight since their forward
(bounded over all M workers, as the planner does), a weight copy for forward-only layers, a reserve.
Four memory settings: none (fits=None); ample (fits passed, never binding: every state's best last
worker is still asked about); loose (a device holds about half the model); tight (about 8 layers,
so at 100 layers no count below about 13 fits). fits and cut_s are cheap Python callables over
prefix sums, as the planner's should be.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from paraplan.planners.bipartition.division import DoesNotFit  # noqa: E402
from paraplan.planners.bipartition.dp import bipartition_all  # noqa: E402

OUT = Path(os.environ.get("PARAPLAN_BENCH_OUT", "bench-out")) / "planner_speed"
GOAL_S = 10.0
LAYERS = (10, 30, 100)
WORKERS = (4, 8, 16, 32, 64)
MEMORY = ("none", "ample", "loose", "tight")
N_MICRO = 16
STATE_BYTES_PER_PARAM = 16  # fp32 Adam: weights, gradients, two moments
RESERVE_BYTES = 2e9
LINK_ALPHA_S, LINK_BPS = 10e-6, 10e9


def synthetic_model(n_layers: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Per-layer forward/backward seconds, parameters, saved and output bytes of a GPT-like stack."""
    rng = np.random.default_rng(seed)
    forward = rng.uniform(0.9, 1.1, n_layers) * 4e-3
    forward[0], forward[-1] = 1e-3, 8e-3  # embedding, head
    backward = forward * rng.uniform(1.8, 2.2, n_layers)
    params = np.full(n_layers, 150e6) * rng.uniform(0.95, 1.05, n_layers)
    params[0] = params[-1] = 250e6  # tied-size embedding and head
    saved = rng.uniform(0.9, 1.1, n_layers) * 400e6
    output = np.full(n_layers, 50e6)
    return {"forward_s": forward, "backward_s": backward, "params": params, "saved_bytes": saved,
            "output_bytes": output}


def link_cut(model) -> callable:
    output = model["output_bytes"]

    def transfer_s(n_bytes: float) -> float:
        return LINK_ALPHA_S + n_bytes / LINK_BPS

    def cut_s(s1: int | None, s2: int | None) -> float:
        # the activation after forward layer s1 and the gradient of layer s2's output; None: nothing
        return (0.0 if s1 is None else transfer_s(output[s1])) + (0.0 if s2 is None else transfer_s(output[s2]))
    return cut_s


def memory_fits(model, capacity_bytes: float, max_workers: int, counter: list[int]):
    """The planner's memory count (planners/bipartition/planner.py worker_memory) over prefix sums: a
    layer whose backward runs here costs its states and its saved activations for the micro-batches
    in flight between its forward (here, on the earliest worker before, or on the next one after)
    and this backward; a layer whose forward only runs here costs a copy of its weights."""
    states = np.concatenate(([0.0], np.cumsum(model["params"] * STATE_BYTES_PER_PARAM))).tolist()
    weights = np.concatenate(([0.0], np.cumsum(model["params"] * 2))).tolist()  # fp16 copy
    saved = np.concatenate(([0.0], np.cumsum(model["saved_bytes"]))).tolist()

    def in_flight(forward_worker: int, worker: int) -> int:
        return max(1, min(N_MICRO, math.ceil(max_workers - (forward_worker + worker) / 2)))

    def segment(start: int, stop: int, forward_worker: int, worker: int) -> float:
        if stop <= start:
            return 0.0
        return states[stop] - states[start] + in_flight(forward_worker, worker) * (saved[stop] - saved[start])

    def fits(w: int, forward: tuple[int, int], backward: tuple[int, int]) -> bool:
        counter[0] += 1
        (f0, f1), (b0, b1) = forward, backward
        used = (segment(b0, min(b1, f0), 0, w) + segment(max(b0, f0), min(b1, f1), w, w)
                + segment(max(b0, f1), b1, w + 1, w))
        for start, stop in ((f0, min(f1, b0)), (max(f0, b1), f1)):  # forward only here
            if stop > start:
                used += weights[stop] - weights[start]
        return used + RESERVE_BYTES <= capacity_bytes
    return fits


def capacity(model, memory: str) -> float | None:
    per_layer_states = float(np.mean(model["params"])) * STATE_BYTES_PER_PARAM
    if memory == "none":
        return None
    if memory == "ample":
        return float("inf")  # asked about every last worker, never binding
    if memory == "loose":
        return RESERVE_BYTES + 0.5 * float(np.sum(model["params"])) * STATE_BYTES_PER_PARAM + 8 * 400e6
    return RESERVE_BYTES + 8 * per_layer_states + 8 * 400e6  # tight: about 8 layers per device


def measure(n_layers: int, n_workers: int, memory: str, repeats: int) -> dict:
    model = synthetic_model(n_layers)
    cut_s = link_cut(model)
    limit = capacity(model, memory)
    times, cpu_times, calls = [], [], 0
    found: dict = {}
    for _ in range(repeats):
        counter = [0]
        fits = None if limit is None else memory_fits(model, limit, n_workers, counter)
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            found = bipartition_all(model["forward_s"], model["backward_s"], cut_s, n_workers, fits=fits)
        except DoesNotFit:
            found = {}
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)
        calls = counter[0]
    best = min(found, key=lambda m: found[m].bottleneck_s) if found else None
    return {"n_layers": n_layers, "n_workers": n_workers, "memory": memory, "median_s": statistics.median(times),
            "min_s": min(times), "max_s": max(times), "cpu_s": statistics.median(cpu_times), "repeats": repeats, "fits_calls": calls,
            "counts_found": sorted(found), "best_count": best,
            "best_bottleneck_s": None if best is None else found[best].bottleneck_s}


def figure(rows: list[dict]) -> None:
    fig, axes = plt.subplots(1, len(MEMORY), figsize=(18, 4.2), sharey=True)
    for ax, memory in zip(axes, MEMORY, strict=True):
        for n_layers in LAYERS:
            mine = [r for r in rows if r["memory"] == memory and r["n_layers"] == n_layers]
            if mine:
                line, = ax.plot([r["n_workers"] for r in mine], [r["median_s"] for r in mine], marker="o",
                                label=f"L = {n_layers}, wall")
                ax.plot([r["n_workers"] for r in mine], [r["cpu_s"] for r in mine], marker=".", linestyle=":",
                        color=line.get_color(), label=f"L = {n_layers}, CPU")
        ax.axhline(GOAL_S, color="red", linestyle="--", linewidth=0.9, label=f"goal at L=100, M=64: {GOAL_S:.0f} s")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(WORKERS, [str(m) for m in WORKERS])
        ax.set_xlabel("workers M (every count 1..M solved)")
        ax.set_title(f"memory: {memory}")
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("bipartition_all time (s)")
    axes[0].legend(fontsize=8)
    fig.suptitle("Bi-Partition exact DP: time to solve every worker count (median of repeats; "
                 "wall time on a shared 2-core machine, and this process's CPU time)")
    fig.tight_layout()
    fig.savefig(OUT / "bipartition.png", dpi=110)
    plt.close(fig)


def main() -> None:
    from _paraplan_cli import bench_parser

    parser = bench_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="at most 16 workers")
    quick = parser.parse_args().quick
    OUT.mkdir(parents=True, exist_ok=True)
    rows = []
    load_before = os.getloadavg()[0]
    for memory in MEMORY:
        for n_layers in LAYERS:
            for n_workers in WORKERS:
                if n_workers > n_layers or (quick and n_workers > 16):
                    continue
                repeats = 3 if n_layers * n_workers <= 30 * 32 else 1
                row = measure(n_layers, n_workers, memory, repeats)
                rows.append(row)
                print(f"memory {memory:5s} L={n_layers:3d} M={n_workers:2d}: {row['median_s']:7.3f} s "
                      f"(cpu {row['cpu_s']:7.3f} s), "
                      f"{row['fits_calls']:8d} fits calls, counts {len(row['counts_found']):2d} found, "
                      f"best {row['best_count']}", flush=True)
    headline = [r for r in rows if r["n_layers"] == 100 and r["n_workers"] == 64]
    out = {"goal_s": GOAL_S, "goal": "bipartition_all at 100 layers and 64 workers",
           "meets_goal": {r["memory"]: r["median_s"] < GOAL_S for r in headline},
           "machine": platform.processor() or platform.machine(), "python": platform.python_version(),
           "numpy": np.__version__, "cpu_count": os.cpu_count(),
           # other work on the machine inflates wall times; the CPU time of this process less so
           "load_average_before_after": [load_before, os.getloadavg()[0]], "n_micro": N_MICRO, "rows": rows}
    (OUT / "bipartition.json").write_text(json.dumps(out, indent=1))
    figure(rows)
    for r in headline:
        print(f"goal at L=100, M=64 with memory {r['memory']}: {r['median_s']:.2f} s (cpu {r['cpu_s']:.2f} s) -> "
              f"{'met' if r['median_s'] < GOAL_S else 'MISSED'}")


if __name__ == "__main__":
    main()
