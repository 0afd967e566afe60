"""How fast the FD-DPS scheduling core and its baselines search, on synthetic NASNet-like training
graphs of 1k .. 80k operators on 8 devices (the paper's §5.4 / Figure 5 reports minutes for its
largest graphs, NasNet_large: 83,206 operators, 148,548 edges). Goal: FD-DPS under 60 s at 80k on a
2-core machine.

The graphs (`nasnet_like`): a stem, then cells of 5 branches; each branch adds two paths of 4 ops
(relu / separable conv alternating) that start from the previous two cells' outputs or an earlier
branch of the same cell; a concat closes the cell. The backward graph mirrors it (an edge u -> v
becomes grad(v) -> grad(u)) and every forward op feeds its own backward op (the saved activation),
so activations live from the forward op to its backward op, as in training. Sizes: forward op
times lognormal around 0.3 ms (conv) and 0.04 ms (others), backward twice the forward; outputs
lognormal around 1 MB; conv parameters around 200 KB, x4 resident (weights, gradients, two Adam
moments). Devices: the fddps-8xp100 preset's numbers (8 identical 16 GiB GPUs, PCIe 3.0 at 10 GB/s
with 10 us latency). Edges per node ~1.7, like NasNet_large's 1.79.

Intra-operator splitting is the caller's (the graph arrives split), so FD-DPS without it
(D-DPS(-F)) is the same core and is not timed separately. Each point is the median of REPEATS runs
up to 10k nodes, one run above (the 80k point takes a few seconds per algorithm). An algorithm slower than
CAP_S at one size is not run at the larger ones (recorded as capped).

Writes $PARAPLAN_BENCH_OUT/fddps_search_speed.json and fddps_search_speed.png.
Run: .venv/bin/python benchmarks/fddps_search_speed.py [sizes...]
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from paraplan.planners.fddps.baselines import schedule_fastt, schedule_heft, schedule_mpdps  # noqa: E402
from paraplan.planners.fddps.critical_path import critical_path_times  # noqa: E402
from paraplan.planners.fddps.dps import schedule_fddps  # noqa: E402
from paraplan.planners.fddps.problem import DagProblem, replay  # noqa: E402

OUT = Path(os.environ.get("PARAPLAN_BENCH_OUT", "bench-out"))
SIZES = (1_000, 5_000, 10_000, 20_000, 40_000, 80_000)
DEVICES = 8
REPEATS = 3
CAP_S = 120.0
GOAL_S = 60.0
ALGORITHMS = {
    "fddps": schedule_fddps,
    "fddps-earliest-finish": lambda p: schedule_fddps(p, fallback="earliest_finish"),
    "fastt": schedule_fastt,
    "heft": schedule_heft,
    "mpdps": schedule_mpdps,
}


def nasnet_like(n_nodes: int, n_devices: int = DEVICES, seed: int = 0, branches: int = 5,
                path_ops: int = 4) -> DagProblem:
    rng = np.random.default_rng(seed)
    is_conv: list[bool] = [True]  # the stem
    src: list[int] = []
    dst: list[int] = []
    h_pp = h_p = 0
    while len(is_conv) < n_nodes // 2:
        inputs, outs = [h_pp, h_p], []
        for _ in range(branches):
            ends = []
            for _ in range(2):
                prev = inputs[rng.integers(len(inputs))]
                for j in range(path_ops):
                    is_conv.append(j % 2 == 1)
                    src.append(prev)
                    dst.append(len(is_conv) - 1)
                    prev = len(is_conv) - 1
                ends.append(prev)
            is_conv.append(False)  # the branch's add
            add = len(is_conv) - 1
            src.extend(ends)
            dst.extend([add, add])
            outs.append(add)
            inputs.append(add)
        is_conv.append(False)  # the cell's concat
        src.extend(outs)
        dst.extend([len(is_conv) - 1] * len(outs))
        h_pp, h_p = h_p, len(is_conv) - 1
    f = len(is_conv)
    conv = np.array(is_conv)
    forward_s = np.where(conv, rng.lognormal(np.log(3e-4), 0.6, f), rng.lognormal(np.log(4e-5), 0.5, f))
    out_bytes = rng.lognormal(np.log(1e6), 0.7, f)
    param_bytes = np.where(conv, rng.lognormal(np.log(2e5), 1.0, f), 0.0)
    fsrc, fdst = np.array(src), np.array(dst)

    def grad(u):  # backward ops in reverse forward order, after every forward op
        return f + (f - 1 - u)

    ops = np.arange(f)
    edge_src = np.concatenate([fsrc, grad(fdst), ops])
    edge_dst = np.concatenate([fdst, grad(fsrc), grad(ops)])
    edge_bytes = np.concatenate([out_bytes[fsrc], out_bytes[fsrc], out_bytes])  # activation, its gradient, saved
    exec_s = np.repeat(np.concatenate([forward_s, 2 * forward_s[::-1]])[:, None], n_devices, axis=1)
    d = n_devices
    return DagProblem(exec_s, edge_src, edge_dst, edge_bytes, np.full((d, d), 1e-5), np.full((d, d), 10e9),
                      np.concatenate([4 * param_bytes, np.zeros(f)]), np.concatenate([out_bytes, out_bytes[::-1]]),
                      np.full(d, 16 * 2.0**30))


def measure(problem: DagProblem, name: str, repeats: int) -> dict:
    seconds, schedule = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        schedule = ALGORITHMS[name](problem)
        seconds.append(time.perf_counter() - t0)
    again = replay(problem, schedule.device, schedule.order)
    assert np.array_equal(again.start_s, schedule.start_s), f"{name}: schedule differs from its replay"
    stats = {k: v for k, v in schedule.stats.items() if k != "search_s"}
    return {"search_s": statistics.median(seconds), "runs_s": seconds, "makespan_s": schedule.makespan_s,
            "feasible": schedule.feasible, "reason": schedule.reason,
            "peak_gib_max": float(schedule.peak_bytes.max()) / 2**30,
            "nodes_per_device": np.bincount(schedule.device, minlength=problem.n_devices).tolist(), "stats": stats}


def main(sizes=SIZES) -> dict:
    capped: dict[str, int] = {}
    rows = []
    for n in sizes:
        problem = nasnet_like(n)
        problem.lists  # built once per problem, outside every algorithm's timing  # noqa: B018
        serial_s = float(problem.exec_s[:, 0].sum())
        row = {"nodes": problem.n_nodes, "edges": problem.n_edges, "serial_s": serial_s,
               "critical_path_no_transfers_s": float(critical_path_times(_no_links(problem)).dcpl),
               "work_per_device_s": serial_s / DEVICES, "algorithms": {}}
        repeats = REPEATS if n <= 10_000 else 1
        for name in ALGORITHMS:
            if name in capped:
                row["algorithms"][name] = {"skipped": f"over {CAP_S:.0f} s at {capped[name]} nodes"}
                continue
            result = measure(problem, name, repeats)
            row["algorithms"][name] = result
            print(f"{problem.n_nodes:>6} nodes  {name:<22} {result['search_s']:7.2f} s  makespan "
                  f"{result['makespan_s']:.3f} s (serial {serial_s:.3f} s)", flush=True)
            if result["search_s"] > CAP_S:
                capped[name] = problem.n_nodes
        rows.append(row)
    return {"benchmark": "fddps_search_speed", "devices": DEVICES, "goal_s": GOAL_S, "cap_s": CAP_S,
            "capped": capped, "machine": {"python": platform.python_version(), "processor": platform.processor(),
                                           "cpus": os.cpu_count()},
            "graph": "nasnet_like: 5-branch cells, forward + mirrored backward, saved-activation edges",
            "rows": rows}


def _no_links(problem: DagProblem) -> DagProblem:
    d = problem.n_devices
    return DagProblem(problem.exec_s, problem.edge_src, problem.edge_dst, problem.edge_bytes, np.zeros((d, d)),
                      np.full((d, d), np.inf), problem.resident_bytes, problem.output_bytes, problem.capacity_bytes)


def plot(result: dict, path: Path) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    rows = result["rows"]
    for name in ALGORITHMS:
        pts = [(r["nodes"], r["algorithms"][name]) for r in rows if "search_s" in r["algorithms"].get(name, {})]
        if not pts:
            continue
        nodes = [p[0] for p in pts]
        left.loglog(nodes, [p[1]["search_s"] for p in pts], "o-", label=name)
        right.semilogx(nodes, [r["serial_s"] / p[1]["makespan_s"] for r, p in zip(
            [r for r in rows if "search_s" in r["algorithms"].get(name, {})], pts, strict=True)], "o-", label=name)
    bound = [r["serial_s"] / max(r["critical_path_no_transfers_s"], r["work_per_device_s"]) for r in rows]
    right.semilogx([r["nodes"] for r in rows], bound, "k--", lw=1, label="bound: serial / max(CP, work / d)")
    left.axhline(result["goal_s"], color="grey", ls="--", lw=1, label=f"goal {result['goal_s']:.0f} s")
    left.set(xlabel="operators (nodes)", ylabel="search time (s)",
             title=f"DAG scheduler search time, {result['devices']} devices")
    right.set(xlabel="operators (nodes)", ylabel="speedup over one device (serial / makespan)",
              title="schedule quality (replayed makespan)")
    for ax in (left, right):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    from _paraplan_cli import bench_parser

    parser = bench_parser(__doc__)
    parser.add_argument("sizes", nargs="*", type=int, metavar="SIZE",
                        help="graph sizes in forward operators (default: " + " ".join(map(str, SIZES)) + ")")
    chosen = tuple(parser.parse_args().sizes) or SIZES
    result = main(chosen)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "fddps_search_speed.json").write_text(json.dumps(result, indent=2))
    plot(result, OUT / "fddps_search_speed.png")
    print(f"wrote {OUT / 'fddps_search_speed.json'} and {OUT / 'fddps_search_speed.png'}")
