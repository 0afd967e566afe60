"""How fast the simulator is: 1F1B with 64 stages x 1024 micro-batches (goal: under 2 s here).

Writes bench-out/simulator_speed.json (`make results`: results/). Run: .venv/bin/python benchmarks/simulator_speed.py
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from paraplan.simulator.pipeline import PipelineWork, StageWork, run

GOAL_S = 2.0


def work(n_stages: int, n_micro: int, schedule: str) -> PipelineWork:
    rng = np.random.default_rng(0)
    stages = tuple(StageWork(device=k, forward_s=float(rng.uniform(1, 2)), backward_s=float(rng.uniform(2, 4)),
                             send_forward_s=0.1 if k < n_stages - 1 else 0.0, send_backward_s=0.1 if k else 0.0)
                   for k in range(n_stages))
    return PipelineWork(schedule, n_micro, (stages,))


def measure(n_stages: int, n_micro: int, schedule: str, repeats: int = 3) -> dict:
    times, tasks = [], 0
    for _ in range(repeats):
        w = work(n_stages, n_micro, schedule)
        t0 = time.perf_counter()
        result = run(w)
        times.append(time.perf_counter() - t0)
        tasks = len(result.timeline.start)
    return {"schedule": schedule, "n_stages": n_stages, "n_micro": n_micro, "tasks": tasks,
            "median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
            "tasks_per_s": tasks / statistics.median(times)}


def main() -> None:
    from _paraplan_cli import bench_parser

    bench_parser(__doc__).parse_args()
    rows = [measure(64, 1024, "1f1b"), measure(64, 1024, "gpipe"), measure(8, 64, "1f1b"), measure(4, 8, "gpipe")]
    headline = rows[0]
    out = {"goal_s": GOAL_S, "meets_goal": headline["median_s"] < GOAL_S, "machine": platform.processor() or
           platform.machine(), "python": platform.python_version(), "rows": rows}
    root = Path(os.environ.get("PARAPLAN_BENCH_OUT", "bench-out"))
    root.mkdir(parents=True, exist_ok=True)
    (root / "simulator_speed.json").write_text(json.dumps(out, indent=2))
    for r in rows:
        print(f"{r['schedule']:6s} {r['n_stages']:3d} stages x {r['n_micro']:5d} micro-batches: {r['tasks']:7d} tasks, "
              f"median {r['median_s']:.3f} s (min {r['min_s']:.3f}, max {r['max_s']:.3f})")
    print(f"goal: 64 x 1024 1F1B under {GOAL_S} s -> {'met' if out['meets_goal'] else 'MISSED'}")


if __name__ == "__main__":
    main()
