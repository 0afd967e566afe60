"""FD-DPS operator placements run for real (runtime/dag/dag_runtime.py) against the simulator, and what
the `runnable` constraint (every backward operator on its forward's device) costs in predicted
iteration time on the paper's models.

Part 1, measured against predicted, on 2 gloo ranks here: vgg-tiny at batch 16 with a measured
operator profile (`paraplan profile --operators`), three placements: `fddps` (runnable=true) on
`local`, the same operators spread over both devices by hand (forward in two even runs, split parts
k on device k, each backward with its forward: what runnable=true allows) and everything on one
device (1 rank). They run interleaved (A B C A B C ...) for ROUNDS rounds so the machine's drift
falls on all alike; the spread over the rounds is reported. Predicted: the simulator with the same
operator profile and the `local` links, link contention on.

Part 2, the constraint's cost: the FD-DPS evaluation's models, batches and GPU counts
(benchmarks/fddps_eval.py: fddps-8xp100, analytic P100 costs) planned by fddps and fddps-nosplit
with runnable=false (the paper's free placement) and runnable=true: the schedule's own length
(FD-DPS eq. (10)) and the simulated iteration with link contention.

Writes $PARAPLAN_BENCH_OUT/runtime_dag/ (default bench-out/): runs.json, summary.md.
Run: .venv/bin/python benchmarks/runtime_dag.py [--rounds 3] [--steps 8] [--quick]
(--quick: part 2 on vgg-16 and resnet-50 only)
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
from dataclasses import replace
from pathlib import Path

from _paraplan_cli import bench_parser, cli  # noqa: E402  (benchmarks/: shared with the other runtime benchmarks)

from paraplan.hardware import load_cluster
from paraplan.models.op_split import PART
from paraplan.planners.registry import make_plan
from paraplan.planners.request import PlanRequest
from paraplan.plans.plan import OperatorPlacement
from paraplan.plans.plan_file import write_plan
from paraplan.runtime.dag.program import build_program
from paraplan.simulator.predict import simulate_plan
from paraplan.workload import cost_model, measured_model, operator_graph, workload

OUT = Path(os.environ.get("PARAPLAN_BENCH_OUT", "bench-out")) / "runtime_dag"
MODEL = "vgg-tiny"
BATCH = 16
WARMUP_STEPS = 2
# fddps_eval.py's setups: (label, zoo model, image size, batch, GPU counts)
PAPER_SETUPS = [("vgg-16", "vgg-16", None, 64, (2, 4)), ("resnet-50", "resnet-50", None, 64, (4, 8)),
                ("resnet-152", "resnet-152", None, 16, (4, 8)), ("nasnet-large", "nasnet-large", None, 16, (4, 8)),
                ("nasnet-large@331", "nasnet-large", 331, 16, (4, 8))]



def spread(plan, world: int):
    """The plan's operators dealt out as the module doc says (each device in trace order)."""
    program = build_program(plan.model, plan.global_batch)
    index = {n: i for i, n in enumerate(program.names)}

    def base(op):
        head, sep, tail = op.rpartition(PART)
        return (head, int(tail)) if sep and tail.isdigit() else (op.removesuffix("/gather"), -1)

    order = sorted((op for p in plan.operators for op in p.ops),
                   key=lambda op: (index[base(op)[0]], op.endswith("/gather"), op))
    forward = [op for op in order if op.startswith("fwd:")]
    device = {op: (base(op)[1] % world if base(op)[1] >= 0 else j * world // len(forward))
              for j, op in enumerate(forward)}
    for op in order:
        if op not in device:
            name, part = base(op)
            f = program.forward_of[index[name]]
            fwd = program.names[f] + (f"{PART}{part}" if part >= 0 else "") if f >= 0 else None
            device[op] = device.get(fwd, 0) if not op.endswith("/gather") else 0
    return replace(plan, operators=tuple(OperatorPlacement(d, tuple(op for op in order if device[op] == d))
                                         for d in range(world)), prediction=None)


def one_device(plan):
    order = [op for p in plan.operators for op in p.ops]
    program = build_program(plan.model, plan.global_batch)
    index = {n: i for i, n in enumerate(program.names)}
    order.sort(key=lambda op: (index[op.rpartition(PART)[0] if PART in op else op.removesuffix("/gather")],
                               op.endswith("/gather"), op))
    return replace(plan, operators=(OperatorPlacement(0, tuple(order)),), prediction=None)


def measured_vs_predicted(rounds: int, steps: int) -> list[dict]:
    profile_path = OUT / "operators.json"
    if not profile_path.exists():
        cli("profile", MODEL, "--operators", "--out", str(profile_path))
    w = workload(MODEL, "local", batch=BATCH, profile=profile_path, operators="required")  # an operator profile
    cm = w.costs
    fddps = make_plan(w.request, "fddps")
    todo = {"fddps (runnable)": fddps, "spread by hand": spread(fddps, 2), "one device": one_device(fddps)}
    measured: dict[str, list[float]] = {name: [] for name in todo}
    for r in range(rounds):
        for name, plan in todo.items():
            path = OUT / "plan.json"
            write_plan(plan, path)
            run_dir = OUT / "run"
            shutil.rmtree(run_dir, ignore_errors=True)
            cli("train", "--plan", str(path), "--steps", str(steps), "--out-dir", str(run_dir))
            ranks = [json.loads(f.read_text()) for f in sorted(run_dir.glob("steps_rank*.json"))]
            per_step = [max(x[i] for x in ranks) for i in range(steps)][WARMUP_STEPS:]
            measured[name].append(statistics.median(per_step))
            print(f"round {r + 1}: {name:18s} {measured[name][-1] * 1e3:7.1f} ms", flush=True)
    rows = []
    for name, plan in todo.items():
        sim = simulate_plan(plan, cm)
        runs = measured[name]
        median = statistics.median(runs)
        ops = {p.device: len(p.ops) for p in plan.operators}
        rows.append({"plan": name, "operators_per_device": ops, "measured_s": median, "min_s": min(runs),
                     "max_s": max(runs), "predicted_s": sim.prediction.iteration_s,
                     "predicted_free_s": simulate_plan(plan, cm, contention=False).prediction.iteration_s,
                     "error": median / sim.prediction.iteration_s - 1})  # measured against predicted
    return rows


def constraint_cost(quick: bool) -> list[dict]:
    base = load_cluster("fddps-8xp100")
    rows = []
    for label, model, image, batch, gpus in PAPER_SETUPS[:2] if quick else PAPER_SETUPS:
        built, spec = measured_model(model, image_size=image)  # then one cost model per device count
        graph = operator_graph(built)
        for k in gpus:
            node = base.nodes[0]
            cluster = replace(base, name=f"{base.name}-{k}", nodes=(replace(node, devices=node.devices[:k]),))
            cm = cost_model(spec, cluster, operators=graph)
            for method in ("fddps", "fddps-nosplit"):
                row = {"setup": label, "gpus": k, "batch": batch, "planner": method}
                for runnable in (False, True):
                    request = PlanRequest(costs=cm, model_name=built.ref, cluster_name=cluster.name, batch=batch,
                                          options={"runnable": runnable})
                    plan = make_plan(request, method)
                    key = "runnable" if runnable else "free"
                    row[f"{key}_length_s"] = float(dict(plan.search.options)["schedule_length_s"])
                    row[f"{key}_iteration_s"] = plan.prediction.iteration_s
                    row[f"{key}_feasible"] = plan.prediction.feasible
                rows.append(row)
                print(f"{label} {k} GPUs {method}: length {row['free_length_s']:.4f} -> {row['runnable_length_s']:.4f} s,"
                      f" contended {row['free_iteration_s']:.4f} -> {row['runnable_iteration_s']:.4f} s", flush=True)
    return rows


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    runs = measured_vs_predicted(args.rounds, args.steps)
    cost = constraint_cost(args.quick)
    (OUT / "runs.json").write_text(json.dumps({"model": MODEL, "batch": BATCH, "rounds": args.rounds,
                                               "steps": args.steps, "runs": runs, "constraint": cost}, indent=1))
    lines = ["# Operator placements run for real: measured against predicted", "",
             f"{MODEL}, batch {BATCH}, gloo ranks with one thread each on this machine; each placement {args.steps} "
             f"steps (the first {WARMUP_STEPS} dropped) in each of {args.rounds} interleaved rounds; predicted by the "
             "simulator with a measured operator profile and the `local` links.", "",
             "| placement | operators per device | measured median of rounds (min..max) | predicted (contention) | "
             "predicted (no contention) | error |", "|---|---|---|---|---|---|"]
    for r in runs:
        lines.append(f"| {r['plan']} | {r['operators_per_device']} | {r['measured_s'] * 1e3:.1f} ms "
                     f"({r['min_s'] * 1e3:.1f}..{r['max_s'] * 1e3:.1f}) | {r['predicted_s'] * 1e3:.1f} ms | "
                     f"{r['predicted_free_s'] * 1e3:.1f} ms | {r['error']:+.0%} |")
    lines += ["", "# What runnable=true costs (fddps-8xp100, analytic P100 costs)", "",
              "| model | GPUs | planner | schedule length free -> runnable | change | contended iteration free -> "
              "runnable | change |", "|---|---|---|---|---|---|---|"]
    for r in cost:
        lines.append(f"| {r['setup']} ({r['batch']}) | {r['gpus']} | {r['planner']} | {r['free_length_s'] * 1e3:.1f} -> "
                     f"{r['runnable_length_s'] * 1e3:.1f} ms | {r['runnable_length_s'] / r['free_length_s'] - 1:+.1%} | "
                     f"{r['free_iteration_s'] * 1e3:.1f} -> {r['runnable_iteration_s'] * 1e3:.1f} ms | "
                     f"{r['runnable_iteration_s'] / r['free_iteration_s'] - 1:+.1%} |")
    (OUT / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
