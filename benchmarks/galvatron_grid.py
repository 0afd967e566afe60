"""Does Galvatron-BMW lose to a variant inside its own space? (issue 31, item 1)

The grid of Galvatron's own cases: BERT-Huge-32, ViT-Huge-32, T5-Large-32, Swin-Huge-32 and GPT-2 XL,
at 8 / 12 / 16 / 20 GiB per device, batch 64 and 32, on 8 TITAN RTX (galvatron-8xtitan) and 16
A100s (galvatron-16xa100): BMW's plan and the plan of every variant whose space lies inside BMW's
(planners/galvatron/planner.py: PORTFOLIO), each judged by the simulator. A cell is "beaten" when a
variant's simulated throughput is higher than BMW's. Before the simulator ranked BMW's final
candidates the issue counted 3 of 20 cells beaten on 8 TITANs at batch 64, 2 at batch 32, 1 of 20
on 16 A100s.

Writes $PARAPLAN_BENCH_OUT/galvatron_grid.json (default bench-out/). Run:
.venv/bin/python benchmarks/galvatron_grid.py [--jobs 2]   (several minutes: 80 cells x 11 planners)
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path

from paraplan.planners.galvatron.planner import PORTFOLIO
from paraplan.planners.registry import make_plan
from paraplan.workload import workload

OUT = Path(os.environ.get("PARAPLAN_BENCH_OUT", "bench-out"))
MODELS = ("bert-huge-32", "vit-huge-32", "t5-large-32", "swin-huge-32", "gpt2-xl")
BUDGETS = (8, 12, 16, 20)
BATCHES = (64, 32)
CLUSTERS = ("galvatron-8xtitan", "galvatron-16xa100")


def _throughput(plan) -> float:
    p = plan.prediction
    return p.throughput_samples_per_s if p.feasible else 0.0


def cell(model: str, cluster: str, batch: int, budget: int) -> dict:
    request = workload(model, cluster, batch=batch, memory=f"{budget}GiB").request
    t0 = time.perf_counter()
    bmw = make_plan(request, "galvatron-bmw")
    bmw_s = time.perf_counter() - t0
    others = {name: _throughput(make_plan(request, name)) for name in PORTFOLIO["galvatron-bmw"]}
    best_other = max(others, key=others.get)
    ours = _throughput(bmw)
    return {"model": model, "cluster": cluster, "batch": batch, "budget_gib": budget,
            "bmw_samples_per_s": round(ours, 3), "bmw_found_by": dict(bmw.search.options).get("found_by", "galvatron-bmw"),
            "bmw_search_s": round(bmw_s, 2), "best_variant": best_other,
            "best_variant_samples_per_s": round(others[best_other], 3),
            "beaten": others[best_other] > ours * (1 + 1e-9)}


def main() -> None:
    from _paraplan_cli import bench_parser

    parser = bench_parser(__doc__)
    parser.add_argument("--jobs", type=int, default=1, help="cells planned at a time (forked processes)")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    todo = [(model, cluster, batch, budget) for cluster in CLUSTERS for batch in BATCHES for model in MODELS
            for budget in BUDGETS]
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        cells = []
        for (model, cluster, batch, budget), c in zip(todo, pool.starmap(cell, todo), strict=True):
            cells.append(c)
            print(f"{cluster} b{batch} {model} {budget} GiB: BMW {c['bmw_samples_per_s']} "
                  f"({c['bmw_found_by']}, {c['bmw_search_s']} s), best variant {c['best_variant']} "
                  f"{c['best_variant_samples_per_s']}{'  BEATEN' if c['beaten'] else ''}", flush=True)
    found = [c["bmw_found_by"] for c in cells if c["bmw_samples_per_s"] > 0]
    summary = {"cells": len(cells), "beaten": sum(c["beaten"] for c in cells), "jobs": args.jobs,
               "load_average": round(os.getloadavg()[0], 2),
               "found_by_another_variant": sum(f != "galvatron-bmw" for f in found),
               "median_bmw_search_s": sorted(c["bmw_search_s"] for c in cells)[len(cells) // 2]}
    (OUT / "galvatron_grid.json").write_text(json.dumps({"summary": summary, "cells": cells}, indent=2) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
