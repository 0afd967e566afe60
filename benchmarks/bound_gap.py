"""How far is the best plan from the lower bound, and how long does the auto comparison take at the
sizes people plan? (issue 31, items 4 and 5)

Twelve requests: each paper's default request and, in bf16 on the A100-80GB preset (dgx-a100-80gb,
nodes of 8), Llama-2-like models from 8 to 1,024 GPUs. Each runs `paraplan plan`'s comparison
(planners/auto.py: every planner in its own process, 2 at a time here, the default 60 s time
limit each) and records the winner, its predicted iteration, the lower bound (planners/bound.py)
and which term binds, the gap and what it is made of (the winner's time per device beyond the
bound: more compute, exposed communication, after the schedule, idle; simulator/time_split.py),
the comparison's wall time and every planner's search time and status (a planner stopped at its
limit says so, with its best plan so far).

The requests (model, cluster, global batch, sequence length where not the zoo's):
  CSIMD          VGG-16 on 8 V100s over 10 GbE (csimd-v100-10gbe), batch 64
  GroPipe        ResNet-50 on 8 T4s (gropipe-8xt4), batch 256
  Galvatron-BMW  GPT-2 XL on 8 TITAN RTX (galvatron-8xtitan), batch 64
  FD-DPS         VGG-16 on 8 P100s (fddps-8xp100), batch 64
  Bi-Partition   AlexNet on 7 VMs (bipartition-7vm), batch 56
  Llama-2-7B-like, sequence 2,048: 8 GPUs at batch 64, 64 GPUs at batch 512
  Llama-2-13B-like, sequence 2,048: 64 GPUs at batch 512
  Llama-2-70B-like (sequence 1,024): 64 GPUs at batch 512; 256, 512 and 1,024 GPUs at batch 1,024
  (examples/a100-80gb-x{64,256,1024}.toml: the preset's machine at those sizes)

Writes $PARAPLAN_BENCH_OUT/bound_gap.json (default bench-out/; `make results` copies it to
results/). Run: .venv/bin/python benchmarks/bound_gap.py [--only NAME ...]   (15-20 minutes)
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import asdict
from pathlib import Path

from paraplan.planners.auto import compare
from paraplan.simulator.time_split import against_bound
from paraplan.workload import workload

OUT = Path(os.environ.get("PARAPLAN_BENCH_OUT", "bench-out"))
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"  # the 70B-like comparison's cluster files

REQUESTS = [  # (name, model, cluster, batch, seq_len)
    ("csimd", "vgg-16", "csimd-v100-10gbe", 64, None),
    ("gropipe", "resnet-50", "gropipe-8xt4", 256, None),
    ("galvatron", "gpt2-xl", "galvatron-8xtitan", 64, None),
    ("fddps", "vgg-16", "fddps-8xp100", 64, None),
    ("bipartition", "alexnet", "bipartition-7vm", 56, None),
    ("llama7b-8", "llama2-7b", "dgx-a100-80gb?nodes=1", 64, 2048),
    ("llama7b-64", "llama2-7b", "dgx-a100-80gb?nodes=8", 512, 2048),
    ("llama13b-64", "llama2-13b", "dgx-a100-80gb?nodes=8", 512, 2048),
    ("llama70b-64", "llama2-70b", str(EXAMPLES / "a100-80gb-x64.toml"), 512, None),
    ("llama70b-256", "llama2-70b", str(EXAMPLES / "a100-80gb-x256.toml"), 1024, None),
    ("llama70b-512", "llama2-70b", "dgx-a100-80gb?nodes=64", 1024, None),
    ("llama70b-1024", "llama2-70b", str(EXAMPLES / "a100-80gb-x1024.toml"), 1024, None),
]


def run(name: str, model: str, cluster: str, batch: int, seq_len: int | None, time_limit: float) -> dict:
    t0 = time.perf_counter()
    load = os.getloadavg()[0]
    w = workload(model, cluster, batch=batch, seq_len=seq_len, operators="optional")
    setup_s = time.perf_counter() - t0
    result = compare(w.request, time_limit_s=time_limit)
    wall = time.perf_counter() - t0
    best = result.row(result.best) if result.best else None
    bound = result.bound
    return {"name": name, "model": model, "cluster": cluster, "n_devices": bound.n_devices, "batch": batch,
            "seq_len": seq_len, "precision": str(w.request.costs.precision), "load_average": round(load, 2),
            "wall_s": round(wall, 1), "setup_s": round(setup_s, 1), "compare_s": round(result.wall_s, 1),
            "best": result.best, "best_shape": best.shape if best else None,
            "best_iteration_s": best.iteration_s if best else None,
            "best_bubble_fraction": best.bubble if best else None,
            "best_timed_out": best.timed_out if best else None,
            "bound_s": bound.iteration_s, "binding": bound.binding, "bound_micro_batch": bound.micro_batch,
            "work_bound_s": bound.work_s / bound.n_devices,
            "gap": best.iteration_s / bound.iteration_s - 1 if best else None,
            # what the gap is made of (simulator/time_split.py), seconds per device on average
            "best_time_split": asdict(against_bound(best.split, bound.iteration_s)) if best and best.split else None,
            "planners": [{"planner": r.planner, "status": r.status, "timed_out": r.timed_out,
                          "search_s": None if r.search_s is None else round(r.search_s, 2),
                          "iteration_s": r.iteration_s, "shape": r.shape, "reason": r.reason}
                         for r in result.rows if r.status != "skipped"]}


def main() -> None:
    from _paraplan_cli import bench_parser

    parser = bench_parser(__doc__)
    parser.add_argument("--only", nargs="*", help="request names to run (default: all)")
    parser.add_argument("--time-limit", type=float, default=60.0)
    args = parser.parse_args()
    rows = []
    for name, model, cluster, batch, seq in REQUESTS:
        if args.only and name not in args.only:
            continue
        row = run(name, model, cluster, batch, seq, args.time_limit)
        rows.append(row)
        gap = f"{row['gap']:+.1%}" if row["gap"] is not None else "no plan"
        print(f"{name:14s} {row['n_devices']:5d} GPUs  best {row['best']} ({row['best_shape']})  "
              f"{row['best_iteration_s'] or float('nan'):.4g} s vs bound {row['bound_s']:.4g} s ({row['binding']})  "
              f"gap {gap}  comparison {row['wall_s']} s (load {row['load_average']})", flush=True)
        if row["best_time_split"]:
            parts = row["best_time_split"]
            print("   " + ", ".join(f"{k[:-2]} {parts[k] * 1e3:.4g} ms" for k in
                                    ("bound_s", "extra_compute_s", "exposed_comm_s", "after_s", "idle_s")), flush=True)
    path = OUT / "bound_gap.json"
    if args.only and path.exists():  # a partial run replaces its requests' rows and keeps the others
        kept = {r["name"]: r for r in json.loads(path.read_text())["requests"]}
        kept.update({r["name"]: r for r in rows})
        rows = [kept[name] for name, *_ in REQUESTS if name in kept]
    gaps = [r["gap"] for r in rows if r["gap"] is not None]
    summary = {"median_gap": statistics.median(gaps) if gaps else None, "max_gap": max(gaps) if gaps else None,
               "requests": len(rows), "target": "median gap <= 10%, none above 30% (issue 31 item 4)"}
    OUT.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"summary": summary, "requests": rows}, indent=1) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
