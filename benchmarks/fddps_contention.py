"""FD-DPS with link contention modelled (links="ports", ours) against the paper's FD-DPS, HEFT and one
device, judged by the simulator WITH contention (simulator/engine.py's default: every device has one
send and one receive port; what `paraplan plan` reports as the iteration time).

The FD-DPS paper's scheduler (and our faithful `fddps`) assumes transfers never wait for each other,
so on real graphs its schedule length (eq. (10)) is far below what the contended simulator measures.
`fddps-ports` books every transfer on the ports while scheduling (planners/fddps/ports.py `PortLedger`).

For each model and 4 / 8 devices of the fddps-8xp100 preset (8 P100s, PCIe 3.0 alpha-beta links)
this records, per method, the simulated iteration with contention (plan.prediction.iteration_s),
the schedule's own length (search option schedule_length_s) and the simulated makespan (iteration
minus the fixed per-step overhead) it should be compared with, the transfers and, for the port-aware
runs, how many were booked as inversions (served in another order by the simulator: the only source
of disagreement, see planners/fddps/ports.py), plus one device's iteration (fddps-nosplit on one
device: nothing to transfer). "(OOM)": the simulator finds the plan over a device's memory.

Methods: fddps (the paper), fddps-ports (ours: fddps with links=ports), fddps-ports-ef (fddps-ports
with Find_Slot's rule (4) by earliest finish instead of the paper's lowest-priority device; with
ports, far more nodes miss their LST and fall back to rule (4), which ignores when a device is
free), fddps-nosplit-ports (the paper's D-DPS, no operator splitting, links=ports), heft (links
free), heft-ports (HEFT with links=ports), one-device. Writes results.json and table.md to
$PARAPLAN_BENCH_OUT/fddps_contention/ (default bench-out/).
Run: .venv/bin/python benchmarks/fddps_contention.py [model:batch ...]
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import replace
from pathlib import Path

from paraplan.hardware import load_cluster
from paraplan.planners.registry import make_plan
from paraplan.planners.request import PlanRequest
from paraplan.simulator.engine import TRANSFER
from paraplan.simulator.predict import simulate_plan
from paraplan.workload import cost_model, workload

OUT = Path(os.environ.get("PARAPLAN_BENCH_OUT", "bench-out")) / "fddps_contention"
CLUSTER = "fddps-8xp100"
MODELS = (("resnet-50", 64), ("resnet-152", 16), ("vgg-16", 64), ("bert-huge-32", 8), ("gpt2-tiny", 8))
DEVICES = (4, 8)
# name in the table -> (planner, options)
METHODS = {
    "fddps": ("fddps", {}),
    "fddps-ports": ("fddps-ports", {}),
    "fddps-ports-ef": ("fddps-ports", {"fallback": "earliest_finish"}),
    "fddps-nosplit-ports": ("fddps-nosplit", {"links": "ports"}),
    "heft": ("heft", {}),
    "heft-ports": ("heft", {"links": "ports"}),
}


def restricted(cluster, k: int):
    node = cluster.nodes[0]
    return replace(cluster, name=f"{cluster.name}[:{k}]", nodes=(replace(node, devices=node.devices[:k]),))


def run_method(cm, ref: str, batch: int, planner: str, options: dict, n_stages: int | None = None) -> dict:
    t0 = time.perf_counter()
    plan = make_plan(PlanRequest(costs=cm, model_name=ref, cluster_name=cm.cluster.name, batch=batch,
                                 n_stages=n_stages, options={"runnable": False, **options}), planner)  # the paper's
    seconds = time.perf_counter() - t0
    search = dict(plan.search.options)
    transfers = simulate_plan(plan, cm).dag.timeline.type.tolist().count(TRANSFER)
    iteration = plan.prediction.iteration_s
    makespan = iteration - cm.overheads.step_s
    length = float(search["schedule_length_s"])
    return {"iteration_s": iteration, "simulated_makespan_s": makespan, "schedule_length_s": length,
            "simulated_over_schedule": makespan / length if length > 0 else None,
            "feasible": plan.prediction.feasible, "reason": plan.prediction.reason,
            "devices_used": len(plan.operators), "transfers": transfers, "operators": int(search["operators"]),
            "port_wait_s": search.get("port_wait_s"), "port_inversions": search.get("port_inversions"),
            "plan_s": seconds}


def main(models=MODELS) -> dict:
    base = load_cluster(CLUSTER)
    rows = []
    for name, batch in models:
        w = workload(name, base, operators="required")
        for k in DEVICES:  # the same model and operator graph on the first k devices
            cm = cost_model(w.spec, restricted(base, k), operators=w.operators)
            row = {"model": w.built.ref, "batch": batch, "devices": k, "methods": {}}
            for label, (planner, options) in METHODS.items():
                row["methods"][label] = run_method(cm, w.built.ref, batch, planner, options)
            row["methods"]["one-device"] = run_method(cm, w.built.ref, batch, "fddps-nosplit", {}, n_stages=1)
            rows.append(row)
            print(_line(row), flush=True)
    result = {"cluster": CLUSTER, "contention": True, "machine": platform.machine(),
              "python": platform.python_version(), "rows": rows}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "results.json").write_text(json.dumps(result, indent=1))
    (OUT / "table.md").write_text(table(rows))
    print(table(rows))
    return result


def _line(row) -> str:
    m = row["methods"]
    return (f"{row['model']} b{row['batch']} {row['devices']}dev: "
            + ", ".join(f"{k} {v['iteration_s']:.4g}s" for k, v in m.items()))


def table(rows) -> str:
    names = [*METHODS, "one-device"]
    out = ["Simulated iteration with link contention (s; lower is better; * = best feasible), and for "
           "fddps-ports its own schedule length against the simulated makespan, and its transfers booked "
           "out of the simulator's order.", "",
           "| model | batch | devices | " + " | ".join(names)
           + " | fddps-ports length | sim / length | inversions / transfers | ports vs fddps | ports vs 1 dev |",
           "|---|---:|---:|" + "---:|" * (len(names) + 5)]
    for row in rows:
        m = row["methods"]
        best = min(m[n]["iteration_s"] for n in names if m[n]["feasible"])
        cells = []
        for n in names:
            v = m[n]
            mark = "*" if v["iteration_s"] == best else ""
            cells.append(f"{v['iteration_s']:.4g}{mark}" + ("" if v["feasible"] else " (OOM)"))
        ports, paper, one = m["fddps-ports"], m["fddps"], m["one-device"]
        out.append(f"| {row['model']} | {row['batch']} | {row['devices']} | " + " | ".join(cells)
                   + f" | {ports['schedule_length_s']:.4g} | {ports['simulated_over_schedule']:.3f}"
                   + f" | {ports['port_inversions']:.0f} / {ports['transfers']}"
                   + f" | {paper['iteration_s'] / ports['iteration_s']:.2f}x"
                   + f" | {one['iteration_s'] / ports['iteration_s']:.2f}x |")
    return "\n".join(out) + "\n"


def _model_batch(text: str) -> tuple[str, int]:
    import argparse

    name, _, batch = text.rpartition(":")
    if not name or not batch.isdigit():
        raise argparse.ArgumentTypeError(f"expected MODEL:BATCH (e.g. resnet-50:64), got {text!r}")
    return name, int(batch)


if __name__ == "__main__":
    from _paraplan_cli import bench_parser

    parser = bench_parser(__doc__)
    parser.add_argument("models", nargs="*", type=_model_batch, metavar="MODEL:BATCH",
                        help="the models to run, each with its batch (default: "
                             + " ".join(f"{m}:{b}" for m, b in MODELS) + ")")
    main(tuple(parser.parse_args().models) or MODELS)
