"""Measured runs on a cluster of mixed GPUs, predicted (issue 52 item 5): Sailor's validation runs on
its "MIT" cluster (SOSP'25; public repository eth-easl/sailor at cf2c8e3,
sailor/Planner/simulations/validation/mit/), each run's layout built as a paraplan Plan and simulated
on the cluster as Sailor's files describe it (presets sailor-mit and sailor-mit-2gpu), against the
iteration time measured. Nothing here is fitted to these runs: the GPUs' figures are datasheets and
the TITAN RTX's fp32 efficiency curve fitted to Galvatron-BMW's tables (galvatron-8xtitan), the links
Sailor's own measurements.

The runs (each file's `real`, seconds per iteration; Sailor's averaging is not in the repository for
this cluster: its Clariden script averages rank 0's iterations 4-10 of 10):
  N2/plan_config_N2_D1.json L5-16: 2 stages of [12, 14] layers, RTX 3090 | TITAN RTX, 2 GPUs of each
      node with TP 2, micro-batch 2, global batch 256: 119.83914 s
  N2/plan_config_N2_D2.json L5-15: one stage of all 26 layers, DP 2 over a TITAN RTX replica and an
      RTX 3090 replica, each 2 GPUs with TP 2, micro-batch 2, global batch 256: 91.78 s
  N3/plan_config_N3_D1.json L5-23: 3 stages of [8, 9, 9] layers, RTX 3090 | RTX 2080 | TITAN RTX, 8
      GPUs of each node with TP 8, micro-batch 2, global batch 144: 59.45533 s
The model is Sailor's OPT-350 (its training_config_opt_350.json: 24 blocks, hidden 1024, 16 heads,
FFN 4 x 1024, vocabulary 50,272, sequence 2,048, Adam; 26 layers: the embedding, the blocks, the
final norm with the tied head), a Megatron GPT: priced as transformers' GPT-2 of that shape (learned
positions, GeLU, tied head, dropout), measured as paraplan measures it, in fp32 (Sailor's runs name
no other precision). Assumed where the files are silent: 1F1B for the pipelines, the data-parallel
run's gradients all-reduced once after its 64 accumulated micro-batches.

With --planner, also the plan paraplan chooses on each run's nodes (the comparison of every planner)
against the measured layout, both priced by the same cost model.

Writes $PARAPLAN_BENCH_OUT/published_mixed_runs.json (default bench-out/) and, with --planner,
published_mixed_planner.json. Run:
.venv/bin/python benchmarks/published_mixed_runs.py [--planner]
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import dataclass
from pathlib import Path

from paraplan.hardware import load_cluster
from paraplan.plans.plan import LayerRange, LayerStrategy, Plan, Stage
from paraplan.simulator.predict import simulate_plan
from paraplan.workload import workload

OUT = Path(os.environ.get("PARAPLAN_BENCH_OUT", "bench-out"))
OPT_350 = "hf:gpt2?n_layer=24&n_embd=1024&n_head=16&vocab_size=50272&n_positions=2048&seq_len=2048"
SAILOR = "eth-easl/sailor sailor/Planner/simulations/validation/mit"


@dataclass(frozen=True)
class MixedRun:
    label: str
    source: str  # the file and lines of the measured run
    cluster: str
    stages: tuple  # (first layer, stop, node, tp) per stage; a stage of several nodes is data parallel
    global_batch: int
    micro: int  # samples per micro-batch per replica
    measured_s: float


RUNS = (
    MixedRun("2 stages [12, 14]: RTX 3090 | TITAN RTX, TP2 each", f"{SAILOR}/N2/plan_config_N2_D1.json L5-16",
             "sailor-mit-2gpu", ((0, 12, ("k1",), 2), (12, 26, ("n0",), 2)), 256, 2, 119.83914),
    MixedRun("DP2 over TITAN RTX + RTX 3090, TP2 each", f"{SAILOR}/N2/plan_config_N2_D2.json L5-15",
             "sailor-mit-2gpu", ((0, 26, ("k1", "n0"), 2),), 256, 2, 91.78),
    MixedRun("3 stages [8, 9, 9]: RTX 3090 | RTX 2080 | TITAN RTX, TP8 each", f"{SAILOR}/N3/plan_config_N3_D1.json L5-23",
             "sailor-mit", ((0, 8, ("k1",), 8), (8, 17, ("r0",), 8), (17, 26, ("n0",), 8)), 144, 2, 59.45533),
)


def node_devices(cluster, name: str) -> tuple[int, ...]:
    index = [n.name for n in cluster.nodes].index(name)
    return tuple(slot.id for slot in cluster.devices if slot.node == index)


def used_nodes(run: MixedRun):
    """The cluster of the nodes the run used, as the preset describes them (for the planners)."""
    from dataclasses import replace

    cluster = load_cluster(run.cluster)
    names = [node for _, _, nodes, _ in run.stages for node in nodes]
    kept = tuple(n for n in cluster.nodes if n.name in names)
    return replace(cluster, name=f"{run.cluster}[{','.join(n.name for n in kept)}]", nodes=kept)


def run_plan(run: MixedRun, cluster=None) -> Plan:
    """The run's layout: each stage on its nodes' devices, TP inside a node, data parallel across
    the stage's nodes; micro-batches of `micro` samples per replica."""
    cluster = cluster or load_cluster(run.cluster)
    replicas = len(run.stages[0][2])
    n_micro = run.global_batch // (run.micro * replicas)
    stages = []
    for start, stop, nodes, tp in run.stages:
        devices = tuple(d for node in nodes for d in node_devices(cluster, node)[:tp])
        strategy = LayerStrategy(dp=len(nodes), tp=tp, order="tp,dp") if len(nodes) > 1 else LayerStrategy(tp=tp)
        stages.append(Stage(LayerRange(start, stop), devices, strategies=(strategy,) * (stop - start)))
    return Plan(model=OPT_350, cluster=cluster.name, n_layers=26, global_batch=run.global_batch, n_micro=n_micro,
                schedule="1f1b", stages=tuple(stages), grad_sync="after-backward" if replicas > 1 else "none",
                precision="fp32")


def rows(runs=RUNS) -> list[dict]:
    out = []
    for run in runs:
        w = workload(OPT_350, run.cluster, batch=run.global_batch, precision="fp32")
        sim = simulate_plan(run_plan(run), w.costs)
        p = sim.prediction
        row = {"run": run.label, "source": run.source, "cluster": run.cluster, "global_batch": run.global_batch,
               "measured_s": run.measured_s, "predicted_s": round(p.iteration_s, 3),
               "time_ratio": round(p.iteration_s / run.measured_s, 3),
               "predicted_peak_gib": round(max(m.peak_bytes for m in p.memory) / 2**30, 2), "fits": p.feasible}
        out.append(row)
        print(f"{run.label:>58}: measured {run.measured_s:.2f} s, predicted {row['predicted_s']} s "
              f"(x{row['time_ratio']}), peak {row['predicted_peak_gib']} GiB", flush=True)
    return out


def planner_against_measured(runs=RUNS, time_limit_s: float = 60.0) -> list[dict]:
    """What paraplan chooses on each run's nodes (`paraplan plan`'s comparison of every planner, fp32,
    the same global batch), against the measured layout priced by the same cost model."""
    from paraplan.planners.auto import compare

    out = []
    for run in runs:
        cluster = used_nodes(run)
        w = workload(OPT_350, cluster, cluster_name=cluster.name, batch=run.global_batch, precision="fp32")
        measured = simulate_plan(run_plan(run, cluster), w.costs).prediction
        result = compare(w.request, time_limit_s=time_limit_s)
        best = result.row(result.best) if result.best else None
        row = {"run": run.label, "cluster": cluster.name, "measured_s": run.measured_s,
               "measured_layout_predicted_s": round(measured.iteration_s, 3),
               "measured_layout_fits": measured.feasible, "chosen_planner": result.best,
               "chosen_predicted_s": round(best.iteration_s, 3) if best else None,
               "chosen_shape": best.shape if best else None,
               "chosen_over_measured_layout": round(best.iteration_s / measured.iteration_s, 3) if best else None}
        out.append(row)
        print(f"{run.label:>58}: the measured layout {row['measured_layout_predicted_s']} s by prediction; "
              f"paraplan's choice {result.best} {row['chosen_predicted_s']} s ({row['chosen_shape']})", flush=True)
    return out


def main() -> None:
    from _paraplan_cli import bench_parser

    parser = bench_parser(__doc__)
    parser.add_argument("--planner", action="store_true",
                        help="also run the comparison of every planner on each run's nodes (about a minute each)")
    args = parser.parse_args()
    table = rows()
    result = {"rows": table, "median_abs_time_error": round(statistics.median(abs(r["time_ratio"] - 1) for r in table), 3)}

    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "published_mixed_runs.json").write_text(json.dumps(result, indent=1))
    print(f"median |time error| {result['median_abs_time_error']:.1%}")
    if args.planner:
        (OUT / "published_mixed_planner.json").write_text(json.dumps(planner_against_measured(), indent=1))


if __name__ == "__main__":
    main()
