"""Galvatron-BMW search time: the issue's two targets, and how it grows with layers, devices and
memory granularity (the paper's §VII-D reports hundreds of seconds for its largest cases).

Targets (one memory budget, a given batch, analytic costs, `galvatron-bmw`, both schedules):
  BERT-Huge-32 on galvatron-8xtitan at 16 GB, batch 64          — under 10 s
  Llama-2-70B on galvatron-64xa100 (40 GB A100s), batch 64       — under 60 s
Growth: BERT-Huge with 8..128 transformer blocks (its measured block repeated: the model is the
same per layer, only longer) on 8 TITANs; BERT-Huge-32 on 8, 16, 32 and 64 devices (the A100
presets, 32 = four of the 64-A100 preset's nodes); memory_bins 128..2048.

Each point is timed `REPEATS` times, interleaved, and the median and spread are reported (the
machine drifts 10-25% between runs). Writes $PARAPLAN_BENCH_OUT/galvatron_search_speed.{json,png}.
Run: .venv/bin/python benchmarks/galvatron_search_speed.py
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import replace
from pathlib import Path

from paraplan.hardware import load_cluster
from paraplan.planners.registry import make_plan
from paraplan.sizes import gib_bytes
from paraplan.workload import cost_model, measured_model, plan_request

OUT = Path(os.environ.get("PARAPLAN_BENCH_OUT", "bench-out"))
REPEATS = 3
PLANNER = "galvatron-bmw"


def longer(spec, n_blocks: int):
    """The model with `n_blocks` copies of its first block between its embedding and head."""
    first, block, last = spec.layers[0], spec.layers[1], spec.layers[-1]
    layers = [first] + [replace(block, name=f"block{i}") for i in range(n_blocks)] + [last]
    layers = tuple(replace(layer, index=i, shared_owners=()) for i, layer in enumerate(layers))
    return replace(spec, name=f"{spec.name}-{n_blocks}blocks", layers=layers, ref="")


def cluster_of(n_devices: int):
    if n_devices == 8:
        return load_cluster("galvatron-8xtitan")
    big = load_cluster("galvatron-64xa100")
    per_node = len(big.nodes[0].devices)
    return replace(big, name=f"a100-{n_devices}", nodes=big.nodes[: n_devices // per_node])


def time_plan(spec, cluster, batch: int, memory_gib: float | None, bins: int = 512) -> dict:
    # a spec and a cluster of its own (longer(), cluster_of()): workload.py's steps from the cost model on
    request = plan_request(cost_model(spec, cluster), model_name=spec.name, cluster_name=cluster.name, batch=batch,
                           memory=None if memory_gib is None else gib_bytes(memory_gib), options={"memory_bins": bins})
    t0 = time.perf_counter()
    plan = make_plan(request, PLANNER)
    return {"seconds": time.perf_counter() - t0, "feasible": plan.prediction.feasible,
            "throughput": plan.prediction.throughput_samples_per_s, "stages": plan.n_stages}


def measure_points(points: list[tuple[str, dict, tuple]]) -> list[dict]:
    """Every point REPEATS times, interleaved (A B C A B C ...)."""
    runs: dict[int, list[dict]] = {i: [] for i in range(len(points))}
    for r in range(REPEATS):
        for i, (label, _meta, args) in enumerate(points):
            runs[i].append(time_plan(*args))
            print(f"  run {r + 1}/{REPEATS} {label}: {runs[i][-1]['seconds']:.2f} s", flush=True)
    out = []
    for i, (label, meta, _) in enumerate(points):
        seconds = [x["seconds"] for x in runs[i]]
        out.append({"label": label, **meta, "median_s": statistics.median(seconds), "min_s": min(seconds),
                    "max_s": max(seconds), "feasible": runs[i][0]["feasible"], "stages": runs[i][0]["stages"],
                    "throughput": runs[i][0]["throughput"]})
    return out


def main() -> None:
    from _paraplan_cli import bench_parser

    bench_parser(__doc__).parse_args()
    _, bert = measured_model("bert-huge-32")
    titan = load_cluster("galvatron-8xtitan")
    print("targets", flush=True)
    targets = measure_points([
        ("bert-huge-32, 8 TITAN, 16 GB, batch 64", {"target_s": 10}, (bert, titan, 64, 16)),
    ])
    _, llama = measured_model("llama2-70b")
    targets += measure_points([
        ("llama2-70b, 64 A100 40 GB, batch 64", {"target_s": 60}, (llama, load_cluster("galvatron-64xa100"), 64, None)),
    ]) if REPEATS else []
    print("layers", flush=True)
    by_layers = measure_points([(f"{n} blocks", {"layers": n + 2}, (longer(bert, n), titan, 64, 16))
                                for n in (8, 16, 32, 64, 128)])
    print("devices", flush=True)
    by_devices = measure_points([(f"{n} devices", {"devices": n}, (bert, cluster_of(n), 64, 16))
                                 for n in (8, 16, 32, 64)])
    print("memory bins", flush=True)
    by_bins = measure_points([(f"{b} bins", {"bins": b}, (bert, titan, 64, 16, b)) for b in (128, 256, 512, 1024, 2048)])
    result = {"planner": PLANNER, "repeats": REPEATS, "targets": targets, "layers": by_layers,
              "devices": by_devices, "memory_bins": by_bins}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "galvatron_search_speed.json").write_text(json.dumps(result, indent=1))
    figure(result, OUT / "galvatron_search_speed.png")
    for t in targets:
        print(f"{t['label']}: median {t['median_s']:.1f} s (min {t['min_s']:.1f}, max {t['max_s']:.1f}); "
              f"target {t['target_s']} s: {'met' if t['max_s'] < t['target_s'] else 'MISSED'}")


def figure(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, key, x, xlabel in ((axes[0], "layers", "layers", "layers (BERT-Huge blocks + 2)"),
                               (axes[1], "devices", "devices", "devices (BERT-Huge-32)"),
                               (axes[2], "memory_bins", "bins", "memory granularity: bins per device")):
        rows = result[key]
        xs = [r[x] for r in rows]
        ax.errorbar(xs, [r["median_s"] for r in rows],
                    yerr=[[r["median_s"] - r["min_s"] for r in rows], [r["max_s"] - r["median_s"] for r in rows]],
                    marker="o", capsize=3)
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs)
        ax.set_xticklabels([str(v) for v in xs])
        ax.set_xlabel(xlabel)
        ax.set_ylabel("search seconds (median, min-max)")
        ax.grid(alpha=0.3)
    fig.suptitle(f"{result['planner']} search time on this machine (batch 64, 16 GB; "
                 f"{result['repeats']} interleaved runs per point)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    main()
