"""Measured against predicted for Bi-Partition plans (Runtime III): VGG-tiny on 2 gloo ranks, the
planner's own plan on `local` and two divisions that split a layer's forward from its backward
(below the second worker's graph: its input sent by the first worker; above the first worker's
graph: recomputed from its own output), run for real with `paraplan train` and simulated with a
measured profile as the runtime runs them (split_layers="recompute"); beside them, what the paper's
scheme (saved activations sent) would have predicted for the same ranges. The plans run
interleaved (A B C A B C ...) for ROUNDS rounds; the spread over rounds is reported.

Writes bench-out/runtime_bipartition/{runs.json, summary.md, predicted_vs_measured.png}
(`make results`: results/runtime_bipartition/).
Run: .venv/bin/python benchmarks/runtime_bipartition.py [--rounds 3] [--steps 20]
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
from dataclasses import replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from _paraplan_cli import bench_parser, cli  # noqa: E402  (benchmarks/: shared with the other runtime benchmarks)

from paraplan.costs.memory import plan_memory  # noqa: E402
from paraplan.planners.registry import make_plan  # noqa: E402
from paraplan.plans.plan import LayerRange, Plan, Stage  # noqa: E402
from paraplan.plans.plan_file import write_plan  # noqa: E402
from paraplan.plans.worker_roles import worker_roles  # noqa: E402
from paraplan.runtime.measure.compare import memory_comparison, read_overheads  # noqa: E402
from paraplan.simulator.predict import simulate_plan  # noqa: E402
from paraplan.workload import workload  # noqa: E402

OUT = Path(os.environ.get("PARAPLAN_BENCH_OUT", "bench-out")) / "runtime_bipartition"
MODEL = "vgg-tiny"
BATCH = 32
N_MICRO = 4
WARMUP_STEPS = 2



def _split(ranges) -> Plan:
    n = ranges[-1][0][1]
    return Plan(model=MODEL, cluster="local", n_layers=n, global_batch=BATCH, n_micro=N_MICRO, schedule="1f1b",
                grad_sync="none", stages=tuple(Stage(LayerRange(*f), (k,), backward_layers=LayerRange(*b))
                                               for k, (f, b) in enumerate(ranges)))


def plans(request) -> dict:
    return {"planner": replace(make_plan(request, "bipartition"), prediction=None),
            "split below": _split([((0, 9), (0, 8)), ((9, 16), (8, 16))]),
            "split above": _split([((0, 7), (0, 9)), ((7, 16), (9, 16))])}


def _describe(plan) -> str:
    roles = worker_roles(plan)
    text = "; ".join(f"w{r.index}: F {s.layers} B {s.backward}" for r, s in zip(roles, plan.stages, strict=True))
    split = [i for r in roles for i in r.recomputed]
    return text + (f" (layer {', '.join(map(str, split))} recomputed)" if split else " (layer-wise)")


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    profile_path = OUT / "profile.json"
    if not profile_path.exists():
        cli("profile", MODEL, "--batch-sizes", "1,2,4,8,16,32", "--repeats", "15", "--out", str(profile_path))
    w = workload(MODEL, "local", batch=BATCH, stages=2, exact_stages=True, profile=profile_path,
                 overheads=read_overheads())
    spec, cm = w.spec, w.costs
    todo = plans(w.request)
    measured: dict[str, list[float]] = {name: [] for name in todo}
    memory: dict[str, list] = {}
    for r in range(args.rounds):
        for name, plan in todo.items():
            path = OUT / "plan.json"
            write_plan(plan, path)
            run_dir = OUT / "run"
            shutil.rmtree(run_dir, ignore_errors=True)
            cli("train", "--plan", str(path), "--steps", str(args.steps), "--out-dir", str(run_dir))
            ranks = [json.loads(f.read_text()) for f in sorted(run_dir.glob("steps_rank*.json"))]
            per_step = [max(x[i] for x in ranks) for i in range(args.steps)][WARMUP_STEPS:]
            measured[name].append(statistics.median(per_step))
            if r == 0:
                _, breakdowns = plan_memory(plan, spec, {d: 2**34 for d in plan.devices}, device_kind="cpu-core")
                memory[name] = [vars(m) for m in memory_comparison(breakdowns, run_dir)]
            print(f"round {r + 1}: {name:12s} {measured[name][-1] * 1e3:7.1f} ms", flush=True)
    rows = []
    for name, plan in todo.items():
        predicted = simulate_plan(plan, cm).prediction.iteration_s
        paper = simulate_plan(replace(plan, split_layers="send-activations"), cm).prediction.iteration_s
        runs = measured[name]
        median = statistics.median(runs)
        rows.append({"plan": name, "ranges": _describe(plan), "measured_s": median, "min_s": min(runs),
                     "max_s": max(runs), "predicted_s": predicted, "paper_scheme_s": paper,
                     "error": median / predicted - 1, "memory": memory[name]})  # error: measured against predicted
    (OUT / "runs.json").write_text(json.dumps({"model": MODEL, "batch": BATCH, "n_micro": N_MICRO,
                                               "rounds": args.rounds, "steps": args.steps, "rows": rows}, indent=1))
    _figure(rows)
    lines = ["# Bi-Partition plans: measured against predicted", "",
             f"{MODEL}, global batch {BATCH} in {N_MICRO} micro-batches, 1F1B, 2 gloo ranks with one thread each on "
             f"this machine; each plan {args.steps} steps (the first {WARMUP_STEPS} dropped) in each of "
             f"{args.rounds} interleaved rounds; predicted with a measured profile, the `local` preset's links and "
             "the shipped runtime overheads, as the runtime runs the plan (split layers recomputed); the paper's "
             "scheme (saved activations sent) priced beside it.", "",
             "| plan | ranges | measured median of rounds (min..max) | predicted | error | paper's scheme |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['plan']} | {r['ranges']} | {r['measured_s'] * 1e3:.1f} ms ({r['min_s'] * 1e3:.1f}.."
                     f"{r['max_s'] * 1e3:.1f}) | {r['predicted_s'] * 1e3:.1f} ms | {r['error']:+.1%} | "
                     f"{r['paper_scheme_s'] * 1e3:.1f} ms |")
    lines += ["", "Memory per rank (MiB): states = parameters + gradients + optimizer states, activations = the "
              "peak of what autograd keeps (measured on the last step).", "",
              "| plan | rank | states measured | predicted | activations measured | predicted |",
              "|---|---|---|---|---|---|"]
    for r in rows:
        for k, m in enumerate(r["memory"]):
            lines.append(f"| {r['plan']} | {k} | {m['measured_states'] / 2**20:.3f} | "
                         f"{m['predicted_states'] / 2**20:.3f} | {m['measured_activations'] / 2**20:.3f} | "
                         f"{m['predicted_activations'] / 2**20:.3f} |")
    (OUT / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _figure(rows) -> None:
    fig, ax = plt.subplots(figsize=(6, 5))
    for i, r in enumerate(rows):
        ax.errorbar(r["measured_s"] * 1e3, r["predicted_s"] * 1e3,
                    xerr=[[(r["measured_s"] - r["min_s"]) * 1e3], [(r["max_s"] - r["measured_s"]) * 1e3]], fmt="o",
                    label=f"{r['plan']}: {r['error']:+.0%}")
        ax.annotate(r["plan"], (r["measured_s"] * 1e3, r["predicted_s"] * 1e3), fontsize=8,
                    xytext=(4, 6 if i % 2 == 0 else -12), textcoords="offset points")
    ax.legend(fontsize=7, loc="upper left", title="error of the prediction", title_fontsize=7)
    top = max(max(r["max_s"], r["predicted_s"]) for r in rows) * 1e3 * 1.15
    ax.plot([0, top], [0, top], color="grey", linewidth=0.8)
    for k in (0.85, 1.15):
        ax.plot([0, top], [0, top * k], color="grey", linewidth=0.5, linestyle=":")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("measured step (ms): median of rounds, bar = min..max")
    ax.set_ylabel("predicted (ms)")
    ax.set_title(f"{MODEL}, batch {BATCH}, 2 gloo ranks: Bi-Partition plans; dotted ±15%", fontsize=9)
    fig.tight_layout()
    fig.savefig(OUT / "predicted_vs_measured.png", dpi=120)


if __name__ == "__main__":
    main()
