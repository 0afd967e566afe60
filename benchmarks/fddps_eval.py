"""FD-DPS §5 (Tables 5, 6, 7 and Figure 5) on paraplan's simulator, beside the paper's numbers.

The paper (../shared/papers/fd-dps.md) trains TF-Slim models on one server with 8 x P100 and
compares operator-placement strategies: FastT, MP-DPS, D-DPS(-F) (FD-DPS without intra-operator
splitting) and FD-DPS, plus data parallelism. Here the same comparison runs on the fddps-8xp100
preset restricted to the paper's GPU counts, with the analytic P100 costs and the aten-level
operator graphs of models/op_trace.py:

  - Table 5: per model and GPU count, the single-GPU time, DP (`dp`), FastT (`fastt`), MP-DPS
    (`mpdps`), HEFT (`heft`, ours, not in the paper), FD-DPS (`fddps`) and the paper's two speedup
    columns, computed from our numbers the way the paper's printed values are computed:
    Speedup¹ = (MP-DPS - FD-DPS) / MP-DPS and Speedup² = (FastT - FD-DPS) / FastT (the paper's
    footnote calls Speedup¹ "MP-DPS over FastT", but every printed value is FD-DPS over MP-DPS).
    Each operator plan has two times: the simulator's iteration with link contention (each GPU
    sends one and receives one transfer at a time: the honest yardstick) and the schedule's own
    critical-path length (transfers never wait, FD-DPS eq. (10)).
  - Table 6: the split decisions on VGG-16's operators the paper lists.
  - Table 7: 4 GPUs, MP-DPS vs D-DPS(-F) (`fddps-nosplit`) vs FD-DPS with the operators split.
  - Figure 5: search seconds against graph size, 8 GPUs: the real graphs above and the synthetic
    NASNet-like graphs of benchmarks/fddps_search_speed.py up to 80k operators.

Models: vgg-16 and resnet-50 at the zoo's 224x224 (the paper's single-GPU times match TF-Slim's
default sizes, to which its preprocessing resizes CIFAR-10 images, far better than 32x32),
resnet-152 for ResNet_200 (the largest ResNet in the zoo), nasnet-large (NASNet-A large, CIFAR stem,
32x32) and nasnet-large at 331x331 (ImageNet stem, TF-Slim's default size) for NasNet_large;
nasnet-large stands for the whole Inception/NASNet family (InceptionV3 and PnasNet_mobile are not
reproduced).

Writes $PARAPLAN_BENCH_OUT/fddps_eval/ (default bench-out/): fddps_eval.json, table5.md, table7.md
(with Table 6), figure5.md, table5.png, figure5.png. Run: .venv/bin/python benchmarks/fddps_eval.py
(`--from-json`: only rewrite the tables and figures from the last fddps_eval.json)
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402

from paraplan.costs.op_costs import op_seconds_per_device  # noqa: E402
from paraplan.hardware import load_cluster  # noqa: E402
from paraplan.models import zoo  # noqa: E402
from paraplan.models.op_split import split_candidates  # noqa: E402
from paraplan.models.op_trace import build_op_graph  # noqa: E402
from paraplan.planners.fddps.planner import search_graph  # noqa: E402
from paraplan.planners.registry import make_plan  # noqa: E402
from paraplan.planners.request import PlanRequest  # noqa: E402
from paraplan.workload import cost_model, measured_model, operator_graph  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fddps_search_speed as synthetic  # noqa: E402

OUT = Path(os.environ.get("PARAPLAN_BENCH_OUT", "bench-out")) / "fddps_eval"
CLUSTER = "fddps-8xp100"
# (label, zoo model, image size (None: the zoo's), batch, GPU counts, the paper's row)
SETUPS = [
    ("vgg-16", "vgg-16", None, 64, (2, 4), "Vgg_16"),
    ("resnet-50", "resnet-50", None, 64, (4, 8), "ResNet_50"),
    ("resnet-152", "resnet-152", None, 16, (4, 8), "ResNet_200"),
    ("nasnet-large", "nasnet-large", None, 16, (4, 8), "NasNet_large"),
    ("nasnet-large@331", "nasnet-large", 331, 16, (4, 8), "NasNet_large"),
]
OP_METHODS = ("fastt", "mpdps", "heft", "fddps-nosplit", "fddps")
LABEL = {"dp": "DP", "fastt": "FastT", "mpdps": "MP-DPS", "heft": "HEFT", "fddps-nosplit": "D-DPS(-F)",
         "fddps": "FD-DPS"}
REPEATS = 3  # search seconds: the median of 3 runs (synthetic graphs: 3 up to 10k operators, as fddps_search_speed)
SYNTHETIC_SIZES = (1_000, 5_000, 10_000, 20_000, 40_000, 80_000)
SYNTHETIC_METHODS = ("fddps", "fastt", "heft", "mpdps")  # fddps-nosplit: the same core (the graph arrives split)

# ---- the paper, transcribed (fd-dps.md §5)
# Table 3: operators, edges of the TF-Slim graphs (batch)
PAPER_T3 = {"Vgg_16": (3932, 5461), "InceptionV3": (12745, 21928), "ResNet_50": (12692, 24345),
            "ResNet_200": (45472, 82347), "PnasNet_mobile": (62192, 91957), "NasNet_large": (83206, 148548)}
# Table 5: (model, GPUs) -> single GPU, DP, FastT, MP-DPS, Speedup¹ %, FD-DPS, Speedup² % (None: OOM)
PAPER_T5 = {
    ("Vgg_16", 2): (0.794, 1.272, 1.122, 1.066, 1.41, 1.051, 6.33),
    ("Vgg_16", 4): (0.794, 1.770, 1.975, 1.905, 4.88, 1.812, 8.25),
    ("InceptionV3", 2): (0.574, 0.738, 0.712, 0.702, 2.42, 0.685, 3.79),
    ("InceptionV3", 4): (0.574, 0.943, 0.912, 0.872, 5.62, 0.823, 9.76),
    ("ResNet_50", 4): (0.394, 0.895, 0.834, 0.719, 5.01, 0.683, 18.11),
    ("ResNet_50", 8): (0.394, 1.983, 1.874, 1.741, 8.85, 1.587, 15.31),
    ("ResNet_200", 4): (2.331, 0.986, 0.853, 0.806, 7.82, 0.743, 12.90),
    ("ResNet_200", 8): (2.331, 2.321, 2.046, 1.955, 11.87, 1.723, 15.79),
    ("PnasNet_mobile", 4): (0.822, 1.669, 1.624, 1.547, 10.54, 1.384, 14.59),
    ("PnasNet_mobile", 8): (0.822, 2.643, 2.459, 2.147, 12.76, 1.873, 23.83),
    ("NasNet_large", 4): (None, None, 4.289, 3.876, 6.42, 3.627, 15.43),
    ("NasNet_large", 8): (None, None, 7.425, 6.550, 9.45, 5.931, 20.12),
}
PAPER_BATCH = {"Vgg_16": 64, "InceptionV3": 64, "ResNet_50": 64, "ResNet_200": 16, "PnasNet_mobile": 64,
               "NasNet_large": 16}
# Table 6 (Vgg_16): operator, time ms, "memory ratio" KB, split; and our graph's node for it
PAPER_T6 = [("Conv1_1", 2.146, 3.64, "no", "fwd:conv1.0:convolution"),
            ("Conv1_2", 15.673, 43.82, "yes", "fwd:conv2.0:convolution"),
            ("Conv1_2bp", 36.466, 56.88, "yes", "bwd:conv2.0:convolution_backward"),
            ("Relu1_2", 2.908, 0.12, "no", "fwd:conv2.1:relu_"),
            ("Pool1", 0.96, 0.54, "no", "fwd:conv2.2:max_pool2d_with_indices"),
            ("Fc6", 1.654, 136766.44, "no", "fwd:pool_fc1.2:addmm")]
# Table 7 (4 GPUs): MP-DPS, D-DPS(-F), FD-DPS, Speed % (FD-DPS over D-DPS(-F)), operators split
PAPER_T7 = {"Vgg_16": (1.905, 1.926, 1.812, 5.92, "Conv2D, Conv2Dbp"),
            "InceptionV3": (0.872, 0.843, 0.823, 2.37, "Conv2D, Conv2Dbp"),
            "ResNet_50": (0.719, 0.735, 0.683, 7.07, "Conv2D, Conv2Dbp"),
            "ResNet_200": (0.806, 0.825, 0.743, 9.94, "Conv2D, Conv2Dbp"),
            "PnasNet_mobile": (1.547, 1.489, 1.314, 11.75, "Conv2D, Conv2Dbp, Matmul"),
            "NasNet_large": (3.876, 4.211, 3.627, 13.87, "Conv2D, Conv2Dbp, Matmul")}
# §5.4, the only numbers of Figure 5 in the text (8 GPUs, search seconds)
PAPER_F5 = ["PnasNet_mobile: FD-DPS searches 185.8 s less than FastT",
            "NasNet_large: MP-DPS searches 95.5 s less than D-DPS(-F) and 117.3 s less than FD-DPS",
            "NasNet_large: D-DPS(-F) searches 21.8 s less than FD-DPS"]


def cut(cluster, k: int):
    node = cluster.nodes[0]
    return replace(cluster, name=f"{cluster.name}-{k}", nodes=(replace(node, devices=node.devices[:k]),))


def speedup(base: float | None, new: float | None) -> float | None:
    """The paper's Speedup columns: the time saved over `base`, percent."""
    return None if base is None or new is None else 100.0 * (base - new) / base


def check_transcription() -> list[str]:
    """Where the paper's printed speedups differ from our reading of them (the formulas above) by more
    than rounding: one cell, PnasNet_mobile x4's Speedup² (printed 14.59%, its times give 14.78%)."""
    odd = []
    for (model, k), (_, _, fastt, mpdps, s1, fddps, s2) in PAPER_T5.items():
        for column, printed, value in (("Speedup¹", s1, speedup(mpdps, fddps)), ("Speedup²", s2, speedup(fastt, fddps))):
            if abs(value - printed) > 0.01:
                odd.append(f"Table 5 {model} x{k} {column}: printed {printed:.2f}%, its times give {value:.2f}%")
    for model, (_, nosplit, fddps, s, _) in PAPER_T7.items():
        if abs(speedup(nosplit, fddps) - s) > 0.01:
            odd.append(f"Table 7 {model} Speed: printed {s:.2f}%, its times give {speedup(nosplit, fddps):.2f}%")
    assert len(odd) == 1, odd  # the transcription is checked: a typo here would show as a second mismatch
    return odd


def traffic(graph, plan, cluster, batch: int) -> dict:
    """Where an operator plan's work and transfers go: compute seconds per device, the edges whose
    ends run on different devices and their bytes, and how many of those re-send a tensor already
    sent to that device (the simulator and the schedules send once per edge, not once per tensor and
    destination; the bytes beyond the largest per (producer, destination device) pair)."""
    where = {op: p.device for p in plan.operators for op in p.ops}
    device = np.array([where[n.name] for n in graph.nodes])
    seconds = op_seconds_per_device(graph, cluster, batch, None)[:, 0]
    per_device = np.bincount(device, weights=seconds, minlength=cluster.n_devices)
    pairs: dict[tuple[int, int], list[float]] = {}
    for e in graph.edges:
        if device[e.src] != device[e.dst]:
            pairs.setdefault((e.src, int(device[e.dst])), []).append(e.nbytes.at(batch))
    cross = [b for v in pairs.values() for b in v]
    return {"compute_s_per_device": per_device.tolist(),
            "devices_with_5pct_of_compute": int((per_device >= 0.05 * per_device.sum()).sum()),
            "cross_device_edges": len(cross), "cross_device_gb": sum(cross) / 1e9,
            "repeated_transfers": len(cross) - len(pairs),
            "repeated_gb": sum(sum(v) - max(v) for v in pairs.values()) / 1e9,
            # the busiest GPU's sends, each tensor once per destination: a lower bound on the time its port
            # needs when it sends one transfer at a time
            "busiest_send_s": max((sum(max(v) for (src, _), v in pairs.items() if device[src] == d)
                                   for d in range(cluster.n_devices)), default=0.0) / _bandwidth(cluster)}


def _bandwidth(cluster) -> float:
    return cluster.nodes[0].intra_link.bandwidth_bytes_per_s


def run_method(cm, cluster, model_ref: str, batch: int, method: str, repeats: int = 1) -> dict:
    """One planner's plan and prediction; its search seconds the median of `repeats` runs (the plans
    are deterministic, the timings on a shared machine are not)."""
    # the paper's evaluation: its free placement (runnable=False; what the runtime's constraint
    # costs is benchmarks/runtime_dag.py's)
    request = PlanRequest(costs=cm, model_name=model_ref, cluster_name=cluster.name, batch=batch,
                          options={"runnable": False} if method != "dp" else {})
    searches, walls = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        plan = make_plan(request, method)
        walls.append(time.perf_counter() - t0)
        searches.append(plan.search.search_s)
    pred = plan.prediction
    options = dict(plan.search.options)
    row = {"iteration_s": pred.iteration_s, "feasible": pred.feasible, "reason": pred.reason,
           "search_s": statistics.median(searches), "search_runs_s": searches, "wall_s": statistics.median(walls),
           "peak_gib": max((m.peak_bytes for m in pred.memory), default=0) / 2**30}
    if method == "dp":
        return row
    graph = search_graph(request, method == "fddps", runnable=False)
    row.update({"schedule_length_s": float(options["schedule_length_s"]), "operators": graph.n_nodes,
                "operators_split": sum(n.name.endswith("/gather") for n in graph.nodes),
                "split_ops": sorted({n.op for n in graph.nodes if "/part" in n.name}),
                **traffic(graph, plan, cluster, batch)})
    return row


def table5() -> tuple[list[dict], dict]:
    base = load_cluster(CLUSTER)
    rows, graphs = [], {}
    for label, model, image, batch, gpus, paper in SETUPS:
        # workload.py's steps one by one: Table III's columns time the measurement and the trace apart
        t0 = time.perf_counter()
        built, spec = measured_model(model, image_size=image)
        measure_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        graph = operator_graph(built)
        graph_s = time.perf_counter() - t0
        forward = sum(n.phase == "forward" for n in graph.nodes)
        graphs[label] = {"model": model, "image_size": built.inputs.image_size, "batch": batch, "paper_row": paper,
                         "nodes": graph.n_nodes, "forward_nodes": forward, "edges": len(graph.edges),
                         "layers": spec.n_layers, "params": spec.param_count, "measure_s": measure_s,
                         "op_graph_s": graph_s, "paper_nodes_edges": PAPER_T3[paper]}
        print(f"{label}: {graph.n_nodes} operators ({forward} forward), {len(graph.edges)} edges; "
              f"measure {measure_s:.1f} s, op graph {graph_s:.1f} s", flush=True)
        single = {}
        one = cut(base, 1)
        cm1 = cost_model(spec, one, operators=graph)
        for method in ("fddps", "dp"):  # fddps on one GPU: every operator in turn, the sum of their times
            single[method] = run_method(cm1, one, built.ref, batch, method)
        extra = (8,) if label == "vgg-16" else ()  # Figure 5 wants every real graph on 8 GPUs
        for k in gpus + extra:
            cluster = cut(base, k)
            cm = cost_model(spec, cluster, operators=graph)
            methods = {m: run_method(cm, cluster, built.ref, batch, m, REPEATS) for m in ("dp",) + OP_METHODS}
            # TF-Slim's clones (train_image_classifier --num_clones) each take --batch_size samples: DP with
            # the batch per GPU, k x batch in all
            clones = run_method(cm, cluster, built.ref, batch * k, "dp")
            rows.append({"setup": label, "model": model, "image_size": built.inputs.image_size, "batch": batch,
                         "gpus": k, "paper_row": paper, "in_paper": k in gpus, "nodes": graph.n_nodes,
                         "single": single, "methods": methods, "dp_batch_per_gpu": clones})
            print(f"  {k} GPUs: " + ", ".join(
                f"{LABEL[m]} {r['iteration_s']:.3f}" + (f"/{r['schedule_length_s']:.3f}" if "schedule_length_s" in r
                                                        else "") + ("" if r["feasible"] else " (infeasible)")
                for m, r in methods.items()) + f"   [1 GPU {single['fddps']['iteration_s']:.3f}]", flush=True)
    return rows, graphs


def table6() -> list[dict]:
    # its own code: only the operator graph and its device times, no measured layers or cost model
    built = zoo.build("vgg-16")
    graph = build_op_graph(built)
    cluster = load_cluster(CLUSTER)
    seconds = op_seconds_per_device(graph, cluster, 64, None)[:, 0]
    chosen = set(split_candidates(graph, 64))
    index = graph.index()
    out = []
    for name, ms, kb, split, node in PAPER_T6:
        i = index[node]
        out.append({"paper_op": name, "node": node, "paper_ms": ms, "paper_kb": kb, "paper_split": split,
                    "ms": 1e3 * float(seconds[i]), "param_kb": graph.nodes[i].param_bytes / 1024,
                    "gflops": graph.nodes[i].flops.at(64) / 1e9,
                    "split": "yes" if i in chosen else "no"})
    return out


def figure5_synthetic() -> list[dict]:
    rows = []
    for n in SYNTHETIC_SIZES:
        problem = synthetic.nasnet_like(n)
        problem.lists  # built outside the timing, as fddps_search_speed does  # noqa: B018
        row = {"nodes": problem.n_nodes, "edges": problem.n_edges, "methods": {}}
        for method in SYNTHETIC_METHODS:
            r = synthetic.measure(problem, method, REPEATS if n <= 10_000 else 1)
            row["methods"][method] = {"search_s": r["search_s"], "makespan_s": r["makespan_s"]}
        rows.append(row)
        print(f"synthetic {problem.n_nodes} nodes: " + ", ".join(
            f"{LABEL[m]} {v['search_s']:.2f} s" for m, v in row["methods"].items()), flush=True)
    return rows


# ---------------------------------------------------------------------------------------- output
def fmt(x: float | None, digits: int = 3) -> str:
    return "OOM" if x is None else f"{x:.{digits}f}"


def pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}%"


def ours(row: dict, method: str, key: str = "iteration_s") -> float | None:
    r = row["methods"][method]
    return r[key] if r["feasible"] else None


def table5_md(rows: list[dict], graphs: dict) -> str:
    paper_rows = [r for r in rows if r["in_paper"]]
    n = len(paper_rows)
    count = dict.fromkeys(("paper_order", "order", "order_cp", "fd_best", "fd_best_cp", "dp_wins", "single_wins",
                           "cp_beats_single", "single_oom"), 0)
    for r in paper_rows:
        p = PAPER_T5[(r["paper_row"], r["gpus"])]
        t = {m: ours(r, m) for m in OP_METHODS}
        cp = {m: ours(r, m, "schedule_length_s") for m in OP_METHODS}
        fastest = min(v for v in t.values() if v is not None)
        count["paper_order"] += p[5] < p[3] < p[2]
        count["order"] += None not in (t["fddps"], t["mpdps"], t["fastt"]) and t["fddps"] < t["mpdps"] < t["fastt"]
        count["order_cp"] += None not in (cp["fddps"], cp["mpdps"], cp["fastt"]) and cp["fddps"] < cp["mpdps"] < cp["fastt"]
        count["fd_best"] += t["fddps"] is not None and t["fddps"] <= fastest
        count["fd_best_cp"] += cp["fddps"] is not None and cp["fddps"] <= min(v for v in cp.values() if v is not None)
        count["dp_wins"] += ours(r, "dp") is not None and ours(r, "dp") < fastest
        count["single_wins"] += r["single"]["fddps"]["feasible"] and r["single"]["fddps"]["iteration_s"] <= fastest * 1.001
        count["single_oom"] += not r["single"]["fddps"]["feasible"]
        count["cp_beats_single"] += (r["single"]["fddps"]["feasible"]
                                     and min(v for v in cp.values() if v is not None) < r["single"]["fddps"]["iteration_s"])
    count["fd_slower"] = sum(r["methods"]["fddps"]["search_s"] > max(r["methods"]["mpdps"]["search_s"],
                                                                      r["methods"]["fddps-nosplit"]["search_s"])
                             for r in rows)
    clones_oom = ", ".join(f"{r['setup']} x{r['gpus']}: {'OOM' if not r['dp_batch_per_gpu']['feasible'] else 'fits'}"
                           for r in paper_rows if not r["single"]["fddps"]["feasible"])
    chains = [r for r in paper_rows if r["model"].startswith("resnet")]
    chain_gain = max(r["single"]["fddps"]["iteration_s"] / ours(r, m, "schedule_length_s")
                     for r in chains for m in ("fastt", "mpdps", "heft", "fddps-nosplit"))
    # the transfers the schedules assume run side by side: the busiest GPU's sends alone, against the schedule
    worst = max(((r["methods"][m]["busiest_send_s"] / r["methods"][m]["schedule_length_s"], r, m)
                 for r in paper_rows for m in OP_METHODS), key=lambda x: x[0])
    w_ratio, w_row, w_method = worst
    w = w_row["methods"][w_method]
    plans = [r["methods"][m] for r in paper_rows for m in OP_METHODS]
    over_half = sum(x["busiest_send_s"] > 0.5 * x["schedule_length_s"] for x in plans)
    ratio = [PAPER_T3[g["paper_row"]][0] / g["nodes"] for g in graphs.values()]
    vgg1 = next(r for r in paper_rows if r["setup"] == "vgg-16" and r["gpus"] == 2)
    lines = [
        "# FD-DPS Table 5 on paraplan's simulator (fddps-8xp100, analytic P100 costs)", "",
        "Produced by `benchmarks/fddps_eval.py`. For each setting: the paper's row, then ours twice: the simulated "
        "iteration with link contention (each GPU sends one and receives one transfer at a time: the honest "
        "yardstick), and the schedule's own critical-path length (transfers never wait: the quantity FastT, "
        "MP-DPS, HEFT and FD-DPS minimise, FD-DPS eq. (10)).", "",
        "## Summary", "",
        f"**Ranking: it does not reproduce.** The paper has FD-DPS < MP-DPS < FastT in {count['paper_order']} of "
        f"the {n} rows we reproduce; we have it in {count['order']} of {n} with contention and {count['order_cp']} "
        f"of {n} by schedule length. FD-DPS (with its batch splits) has the shortest schedule of the operator "
        f"planners in {count['fd_best_cp']} of {n} rows, but the fastest contended iteration in only "
        f"{count['fd_best']} of {n}. Data parallelism is the fastest method in {count['dp_wins']} of {n} rows (at "
        f"the same global batch), and one GPU is as fast as the best contended operator plan (within 0.1%) or "
        f"faster in {count['single_wins']} of {n} (one GPU is out of memory in {count['single_oom']}); by schedule "
        "length (no contention) an operator plan beats one GPU in "
        f"{count['cp_beats_single']} of the {n - count['single_oom']} where one GPU fits. Where ours agrees with the paper: FD-DPS's split rule makes the "
        "paper's Table 6 decisions on VGG-16 exactly (table7.md); NASNet-A large at TF-Slim's 331x331 does not fit "
        "one 16 GB P100 at batch 16 (the paper's OOM), at 32x32 it does, and DP with the batch per GPU (see below) "
        f"is out of memory there too ({clones_oom}, the paper's DP OOM); FD-DPS searches longer than MP-DPS "
        f"and D-DPS(-F) in {count['fd_slower']} of the {len(rows)} settings (the paper: 117.3 s and 21.8 s longer "
        "on NasNet_large), but, unlike the paper's Figure 5, longer than FastT too (figure5.md).", "",
        "**Why the ranking differs.** (a) Transfers: the four planners let any number of transfers run side by "
        f"side. Their plans move gigabytes across PCIe per iteration; the worst case, {LABEL[w_method]} on "
        f"{w_row['setup']} x{w_row['gpus']}, sends {w['cross_device_gb']:.1f} GB over {w['cross_device_edges']} "
        f"cut edges, and its busiest GPU alone needs {w['busiest_send_s']:.3f} s to send its share at 10 GB/s "
        f"(each tensor once per destination), {100 * w_ratio:.0f}% of the schedule's {w['schedule_length_s']:.3f} s; "
        f"for {over_half} of the {len(plans)} operator plans that share is over half the schedule. With one "
        "transfer per port at a "
        "time, FD-DPS's splits (every split operator's input slices sent out, its outputs gathered back) cost "
        "most. (b) Chains: VGG-16 and the ResNets are chains of operators; without splitting there is nothing "
        "to overlap, so FastT, MP-DPS, HEFT and D-DPS(-F) schedule VGG-16 exactly as one GPU does (one GPU does "
        "almost all of the work: `devices_with_5pct_of_compute` in the JSON) and the ResNets at most "
        f"{100 * (chain_gain - 1):.1f}% faster than one GPU, even by schedule length. "
        f"(c) Graph size: our aten-level graphs have {min(ratio):.0f}-{max(ratio):.0f}x fewer operators than the "
        "paper's TF-Slim graphs (Table 3): one operator is a whole convolution or batch norm, a cut edge a whole "
        "activation; the paper's graphs add TF's bookkeeping, its split batch-norm and optimizer ops. (d) Costs: "
        "analytic P100 roofline times (10 us per kernel, at most 70% of 9.3 TFLOPS) and 10 GB/s, 10 us PCIe "
        "links, not TensorFlow 1.14's measurements. (e) Ours beyond the paper: `fddps-ports` schedules with "
        "the simulator's one-send/one-receive port model and beats the paper's FD-DPS under contention on "
        "every model measured (results/fddps_contention/).", "",
        "**The paper's own numbers** are hard to square with one P100 each: its DP is slower than one GPU for "
        "every model but ResNet_200 and slower on 4 GPUs than on 2, which fits TF-Slim's clones (each of "
        "`--num_clones` replicas takes `--batch_size` samples, so k GPUs run k x batch); the column 'DP, batch "
        f"per GPU' runs that (e.g. VGG-16 x2: {fmt(vgg1['dp_batch_per_gpu']['iteration_s'])} s for 128 samples). "
        "Its operator planners are slower on 8 GPUs than on 4 for every model, and slower than one GPU everywhere "
        "except ResNet_200, whose one-GPU time (2.331 s at batch 16) is 5.9x ResNet_50's at batch 64 though the "
        "two iterations have about the same FLOPs (ResNet-200 15 GFLOPs x 16, ResNet-50 4.1 x 64).", "",
        "**Settings.** ResNet-152 stands for ResNet_200 (the zoo's deepest ResNet); the NASNet-A-like "
        "nasnet-large for NasNet_large, and for the InceptionV3 and PnasNet_mobile rows (not reproduced). VGG-16 "
        "and the ResNets at 224x224 with 1000 classes (TF-Slim resizes CIFAR-10 to the network's default size; "
        "a 32x32 VGG-16 cannot even run TF-Slim's 7x7 fc6); nasnet-large at 32x32 (its zoo entry, CIFAR stem) and "
        "at 331x331 (ImageNet stem, TF-Slim's default).", "",
        "Speedup¹ = (MP-DPS - FD-DPS) / MP-DPS, Speedup² = (FastT - FD-DPS) / FastT: the formulas that reproduce "
        "every value the paper prints but one (PnasNet_mobile x4's Speedup²: printed 14.59%, its times give "
        "14.78%; its footnote calls Speedup¹ 'MP-DPS over FastT'). 1 GPU (ours): every operator on one P100 in "
        "turn (`fddps` on a 1-GPU cluster); in brackets the layer-level `dp` planner on one GPU. DP: the `dp` "
        "planner over the GPUs at the same global batch; DP, batch per GPU: at GPUs x batch. HEFT is ours, not "
        "in the paper. OOM: the simulator's memory check fails (16 GiB less the fixed reserve).", "",
        "| model (batch) | GPUs | source | 1 GPU (s) | DP (s) | DP, batch per GPU (s) | FastT (s) | MP-DPS (s) "
        "| HEFT (s) | FD-DPS (s) | Speedup¹ | Speedup² |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in paper_rows:
        p = PAPER_T5[(r["paper_row"], r["gpus"])]
        lines.append(f"| {r['paper_row']} ({PAPER_BATCH[r['paper_row']]}) | {r['gpus']} | paper | {fmt(p[0])} | "
                     f"{fmt(p[1])} | | {fmt(p[2])} | {fmt(p[3])} | — | {fmt(p[5])} | {pct(p[4])} | {pct(p[6])} |")
        one = (f"{fmt(r['single']['fddps']['iteration_s'] if r['single']['fddps']['feasible'] else None)} "
               f"({fmt(r['single']['dp']['iteration_s'] if r['single']['dp']['feasible'] else None)})")
        clones = r["dp_batch_per_gpu"]
        t = {m: ours(r, m) for m in OP_METHODS}
        lines.append(f"| {r['setup']} ({r['batch']}) | {r['gpus']} | ours, contention | {one} | {fmt(ours(r, 'dp'))} | "
                     f"{fmt(clones['iteration_s'] if clones['feasible'] else None)} | "
                     f"{fmt(t['fastt'])} | {fmt(t['mpdps'])} | {fmt(t['heft'])} | {fmt(t['fddps'])} | "
                     f"{pct(speedup(t['mpdps'], t['fddps']))} | {pct(speedup(t['fastt'], t['fddps']))} |")
        c = {m: ours(r, m, "schedule_length_s") for m in OP_METHODS}
        lines.append(f"| | | ours, schedule length | | | | {fmt(c['fastt'])} | {fmt(c['mpdps'])} | {fmt(c['heft'])} | "
                     f"{fmt(c['fddps'])} | {pct(speedup(c['mpdps'], c['fddps']))} | "
                     f"{pct(speedup(c['fastt'], c['fddps']))} |")
    lines += ["", "## Search seconds and traffic", "",
              "Search: the planner's own timer (graph split, search space, schedule), on this machine "
              f"({os.cpu_count()} CPUs). GB: bytes the plan sends between GPUs per iteration. GPUs: those with at "
              "least 5% of the plan's compute (the rest may hold a few zero-cost operators).", "",
              "| model (batch) | GPUs | operators | FastT | MP-DPS | HEFT | D-DPS(-F) | FD-DPS (operators after split) "
              "| GB sent FastT / MP-DPS / HEFT / D-DPS(-F) / FD-DPS | GPUs doing work, same order |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m = r["methods"]
        lines.append(f"| {r['setup']} ({r['batch']}) | {r['gpus']} | {r['nodes']} | "
                     + " | ".join(f"{m[x]['search_s']:.3f}" for x in ("fastt", "mpdps", "heft", "fddps-nosplit"))
                     + f" | {m['fddps']['search_s']:.3f} ({m['fddps']['operators']}) | "
                     + " / ".join(f"{m[x]['cross_device_gb']:.1f}" for x in OP_METHODS) + " | "
                     + " / ".join(str(m[x]["devices_with_5pct_of_compute"]) for x in OP_METHODS) + " |")
    lines += ["", "## Graph sizes (ours: forward + backward aten operators; paper: TF-Slim, Table 3)", "",
              "| ours | image | operators (forward) | edges | layers | parameters | op graph build (s) | paper row | "
              "paper operators | paper edges |", "|---|---|---|---|---|---|---|---|---|---|"]
    for label, g in graphs.items():
        pn, pe = g["paper_nodes_edges"]
        lines.append(f"| {label} | {g['image_size']} | {g['nodes']} ({g['forward_nodes']}) | {g['edges']} | "
                     f"{g['layers']} | {g['params'] / 1e6:.1f}M | {g['op_graph_s']:.1f} | {g['paper_row']} | "
                     f"{pn:,} | {pe:,} |")
    lines += ["", "## The paper's Table 5 in full (InceptionV3 and PnasNet_mobile are not reproduced)", "",
              "| model (batch) | GPUs | 1 GPU | DP | FastT | MP-DPS | Speedup¹ | FD-DPS | Speedup² |",
              "|---|---|---|---|---|---|---|---|---|"]
    for (model, k), p in PAPER_T5.items():
        lines.append(f"| {model} ({PAPER_BATCH[model]}) | {k} | " + " | ".join(
            pct(v) if i in (4, 6) else fmt(v) for i, v in enumerate(p)) + " |")
    return "\n".join(lines) + "\n"


def table7_md(rows: list[dict], t6: list[dict]) -> str:
    conv12 = next(r for r in t6 if r["paper_op"] == "Conv1_2")
    lines = ["# FD-DPS Table 7 (4 GPUs) and Table 6 on paraplan's simulator", "",
             "Produced by `benchmarks/fddps_eval.py`. D-DPS(-F) is `fddps-nosplit` (FD-DPS without intra-operator "
             "splitting). Ours: simulated iteration with link contention, then in brackets the schedule's "
             "critical-path length. Speed = (D-DPS(-F) - FD-DPS) / D-DPS(-F), as the paper's values are computed. "
             "Split: the operators FD-DPS cut along the batch (its rule: batch-splittable convolutions and matmuls "
             "with at least the mean FLOPs share; models/op_split.py) and their aten types. Not reproduced: the "
             "paper's InceptionV3 and PnasNet_mobile rows (its PnasNet_mobile FD-DPS is 1.314 s in Table 7 but "
             "1.384 s in Table 5).", "",
             "| model (batch) | source | MP-DPS (s) | D-DPS(-F) (s) | FD-DPS (s) | Speed | split operators |",
             "|---|---|---|---|---|---|---|"]
    for r in (r for r in rows if r["gpus"] == 4):
        p = PAPER_T7[r["paper_row"]]
        lines.append(f"| {r['paper_row']} ({PAPER_BATCH[r['paper_row']]}) | paper | {fmt(p[0])} | {fmt(p[1])} | "
                     f"{fmt(p[2])} | {pct(p[3])} | {p[4]} |")
        t = {m: ours(r, m) for m in ("mpdps", "fddps-nosplit", "fddps")}
        c = {m: ours(r, m, "schedule_length_s") for m in t}
        f = r["methods"]["fddps"]
        lines.append(f"| {r['setup']} ({r['batch']}) | ours | {fmt(t['mpdps'])} ({fmt(c['mpdps'])}) | "
                     f"{fmt(t['fddps-nosplit'])} ({fmt(c['fddps-nosplit'])}) | {fmt(t['fddps'])} ({fmt(c['fddps'])}) | "
                     f"{pct(speedup(t['fddps-nosplit'], t['fddps']))} ({pct(speedup(c['fddps-nosplit'], c['fddps']))})"
                     f" | {f['operators_split']} of {r['nodes']}: {', '.join(f['split_ops'])} |")
    lines += ["", "## Table 6: split decisions on VGG-16's operators (batch 64)", "",
              "Ours: the analytic time of the whole operator on one P100, its parameter bytes, and whether FD-DPS's "
              "rule splits it. The paper's 'memory ratio' is not defined further; we show parameter KiB. The "
              "paper's times are not from Table 5's setting at fp32: Conv1_2 at 224x224 and batch 64 is "
              f"{conv12['gflops']:.0f} GFLOP, which in {conv12['paper_ms']} ms would be "
              f"{conv12['gflops'] / conv12['paper_ms']:.1f} TFLOPS, above the P100's 9.3 TFLOPS fp32 peak.", "",
              "| paper operator | our node | paper ms | ours ms | paper KB | ours param KiB | paper split | ours split |",
              "|---|---|---|---|---|---|---|---|"]
    for r in t6:
        lines.append(f"| {r['paper_op']} | `{r['node']}` | {r['paper_ms']:.3f} | {r['ms']:.3f} | {r['paper_kb']:,.2f} | "
                     f"{r['param_kb']:,.2f} | {r['paper_split']} | {r['split']} |")
    return "\n".join(lines) + "\n"


def figure5_md(rows: list[dict], synth: list[dict]) -> str:
    big = max(synth, key=lambda s: s["nodes"])
    big_fd, big_ft = big["methods"]["fddps"]["search_s"], big["methods"]["fastt"]["search_s"]
    lines = ["# FD-DPS Figure 5: search seconds against graph size, 8 GPUs", "",
             "Produced by `benchmarks/fddps_eval.py` on this machine "
             f"({os.cpu_count()} CPUs, Python {platform.python_version()}). Real graphs: the planner's own timer "
             "(split, search space, schedule); FD-DPS runs on the split graph (operators in brackets). Synthetic: "
             "the NASNet-like graphs of `benchmarks/fddps_search_speed.py`, the schedulers alone (median of 3 runs "
             "up to 10k operators, one run above); "
             "D-DPS(-F) there is FD-DPS's core on the same graph, so not run twice. The paper gives no numbers "
             "for Figure 5 beyond the text: " + "; ".join(PAPER_F5) + ".", "",
             f"At the largest synthetic graph ({big['nodes']:,} operators) FD-DPS takes {big_fd:.1f} s and FastT "
             f"{big_ft:.1f} s: FD-DPS is {'slower' if big_fd > big_ft else 'faster'} than FastT there, where the "
             "paper has FastT minutes slower on its largest graphs (ours is a static-priority list scheduler; the "
             "paper does not say what dominates its FastT's search); every method here stays within seconds, against the paper's "
             "minutes, on graphs of the paper's sizes.", "",
             "| graph | operators | FastT (s) | MP-DPS (s) | HEFT (s) | D-DPS(-F) (s) | FD-DPS (s) |",
             "|---|---|---|---|---|---|---|"]
    for r in (r for r in rows if r["gpus"] == 8):
        m = r["methods"]
        lines.append(f"| {r['setup']} (batch {r['batch']}) | {r['nodes']} | "
                     + " | ".join(f"{m[x]['search_s']:.3f}" for x in ("fastt", "mpdps", "heft", "fddps-nosplit"))
                     + f" | {m['fddps']['search_s']:.3f} ({m['fddps']['operators']}) |")
    for s in synth:
        m = s["methods"]
        lines.append(f"| synthetic NASNet-like | {s['nodes']} | {m['fastt']['search_s']:.3f} | "
                     f"{m['mpdps']['search_s']:.3f} | {m['heft']['search_s']:.3f} | (= FD-DPS) | "
                     f"{m['fddps']['search_s']:.3f} |")
    return "\n".join(lines) + "\n"


def plot_figure5(rows: list[dict], synth: list[dict], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 5.2))
    colours = {"fastt": "C0", "mpdps": "C1", "heft": "C2", "fddps-nosplit": "C4", "fddps": "C3"}
    for method in SYNTHETIC_METHODS:
        ax.loglog([s["nodes"] for s in synth], [s["methods"][method]["search_s"] for s in synth], "o-",
                  color=colours[method], label=f"{LABEL[method]}, synthetic" + (" (= D-DPS(-F))" if method == "fddps"
                                                                                else "") + ", scheduler only")
    real = [r for r in rows if r["gpus"] == 8]
    for method in ("fastt", "mpdps", "heft", "fddps-nosplit", "fddps"):
        ax.loglog([r["nodes"] for r in real], [r["methods"][method]["search_s"] for r in real], "s",
                  color=colours[method], markersize=8, markerfacecolor="none", markeredgewidth=1.6,
                  label=f"{LABEL[method]}, real graph, whole planner")
    for i, r in enumerate(real):
        low = min(r["methods"][m]["search_s"] for m in OP_METHODS)
        ax.annotate(r["setup"], (r["nodes"], low), textcoords="offset points", xytext=(0, -10 - 9 * (i % 2)),
                    ha="center", va="top", fontsize=7, color="0.3")
    lo = min(min(r["methods"][m]["search_s"] for m in OP_METHODS) for r in real)
    ax.set_ylim(lo / 4, None)
    for name in ("ResNet_50", "ResNet_200", "NasNet_large"):
        ax.axvline(PAPER_T3[name][0], color="0.6", ls=":", lw=1)
        ax.text(PAPER_T3[name][0] * 0.93, lo / 3.5, f"paper {name} ({PAPER_T3[name][0]:,})", rotation=90,
                va="bottom", ha="right", fontsize=7, color="0.4")
    ax.set(xlabel="operators in the graph (log)", ylabel="search seconds (log)",
           title="FD-DPS Figure 5 on paraplan: strategy search time, 8 x P100 (fddps-8xp100)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_table5(rows: list[dict], path: Path) -> None:
    """Speedup over FastT (FastT time / method time; one GPU included), the paper above ours."""
    paper_rows = [r for r in rows if r["in_paper"]]
    methods = ("single", "dp", "mpdps", "heft", "fddps")
    colours = {"single": "C9", "dp": "C7", "mpdps": "C1", "heft": "C2", "fddps": "C3"}
    names = {**LABEL, "single": "1 GPU"}
    fig, axes = plt.subplots(2, 1, figsize=(15, 9), sharex=True)
    x = np.arange(len(paper_rows))
    width = 0.16
    for ax, which in zip(axes, ("paper", "ours"), strict=True):
        top, bottom = 1.0, 1.0
        for j, method in enumerate(methods):
            values = []
            for r in paper_rows:
                p = PAPER_T5[(r["paper_row"], r["gpus"])]
                if which == "paper":
                    t = {"single": p[0], "dp": p[1], "mpdps": p[3], "fddps": p[5], "heft": None}[method]
                    base = p[2]
                else:
                    single = r["single"]["fddps"]
                    t = (single["iteration_s"] if single["feasible"] else None) if method == "single" else ours(r, method)
                    base = ours(r, "fastt")
                values.append(np.nan if t is None or base is None else base / t)
            offset = (j - (len(methods) - 1) / 2) * width
            bars = ax.bar(x + offset, values, width, color=colours[method], label=names[method])
            for b, v in zip(bars, values, strict=True):
                if np.isfinite(v):
                    ax.text(b.get_x() + b.get_width() / 2, v * 1.02, f"{v:.2f}", ha="center", va="bottom",
                            fontsize=6.5, rotation=90)
                    top, bottom = max(top, v), min(bottom, v)
                elif not (which == "paper" and method == "heft"):
                    ax.text(b.get_x() + b.get_width() / 2, 1.0, "OOM", ha="center", va="bottom", fontsize=6.5,
                            rotation=90, color=colours[method])
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_yscale("log")
        ax.set_ylim(min(0.5, bottom * 0.8), top * 1.7)
        ticks = [t for t in (0.3, 0.5, 0.7, 1, 1.5, 2, 3, 5, 10, 20, 50) if bottom * 0.8 <= t <= top * 1.7]
        ax.yaxis.set_major_locator(matplotlib.ticker.FixedLocator(ticks))
        ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_ylabel("FastT time / method time (log)")
        title = ("paper (Table 5: TF-Slim, 8 x P100; HEFT not in the paper)" if which == "paper" else
                 "ours (simulated with link contention, fddps-8xp100 preset; 1 GPU = all operators on one P100)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, axis="y", which="major", alpha=0.3)
        ax.legend(fontsize=8, ncol=5, loc="upper left")
    axes[1].set_xticks(x)
    axes[1].set_xticklabels([f"{r['setup']}\n({r['paper_row']})\n{r['gpus']} GPUs" for r in paper_rows],
                            fontsize=8)
    fig.suptitle("FD-DPS Table 5: speedup over FastT, same model and GPU count (above 1: faster than FastT)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(from_json: bool = False) -> None:
    """Run everything, or (`from_json`) only rewrite the tables and figures from the last JSON."""
    odd = check_transcription()
    OUT.mkdir(parents=True, exist_ok=True)
    if from_json:
        result = json.loads((OUT / "fddps_eval.json").read_text())
    else:
        t0 = time.perf_counter()
        rows, graphs = table5()
        t6 = table6()
        synth = figure5_synthetic()
        result = {"benchmark": "fddps_eval", "cluster": CLUSTER,
                  "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
                  "graphs": graphs, "rows": rows, "table6": t6, "synthetic": synth,
                  "paper": {"table3": PAPER_T3, "table5": {f"{m} x{k}": v for (m, k), v in PAPER_T5.items()},
                            "table6": PAPER_T6, "table7": PAPER_T7, "figure5_text": PAPER_F5,
                            "printed_speedups_that_do_not_follow_from_its_times": odd},
                  "total_s": time.perf_counter() - t0}
        (OUT / "fddps_eval.json").write_text(json.dumps(result, indent=1))
    rows, graphs, t6, synth = result["rows"], result["graphs"], result["table6"], result["synthetic"]
    texts = {"table5.md": table5_md(rows, graphs), "table7.md": table7_md(rows, t6),
             "figure5.md": figure5_md(rows, synth)}
    for name, text in texts.items():
        (OUT / name).write_text(text)
    plot_table5(rows, OUT / "table5.png")
    plot_figure5(rows, synth, OUT / "figure5.png")
    for text in texts.values():
        print(text)
    print(f"wrote {OUT} ({result['total_s']:.0f} s of measuring and planning)")


if __name__ == "__main__":
    from _paraplan_cli import bench_parser

    parser = bench_parser(__doc__)
    parser.add_argument("--from-json", action="store_true",
                        help="only rewrite the tables and figures from the last run's fddps_eval.json")
    main(from_json=parser.parse_args().from_json)
