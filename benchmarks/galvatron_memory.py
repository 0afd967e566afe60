"""Memory you can trust: our max batch of the pure strategies against Galvatron-BMW Table II.

Table II (../shared/papers/galvatron-bmw.md) lists, for 8 x TITAN RTX 24 GB and memory budgets of
8/12/16/20 GB, the largest batch (in steps of 8) that real runs of PyTorch DDP (DP), FairScale
FSDP / ZeRO-3 (SDP), Megatron (TP) and PyTorch GPipe (PP) trained for eight models. Here each cell
is recomputed from costs/memory.py's per-device peak for a hand-built plan of that pure strategy:

  DP   one stage of the 8 devices, LayerStrategy(dp=8) on every layer, DDP's bucketed all-reduce;
  SDP  one stage of the 8 devices, LayerStrategy(sdp=8) on every layer (ZeRO-3 / FSDP);
  TP   one stage of the 8 devices, LayerStrategy(tp=8) on every layer (Megatron);
  PP   8 stages of one device, layers split evenly by count, GPipe with 8 micro-batches (the
       paper tunes the micro-batch count for speed; under GPipe every micro-batch's activations
       wait for the flush, so the peak is the same for any count up to the fixed terms).

A cell is "within one step" when |ours - paper| <= 8, OOM counting as batch 0. The budget "N GB"
is read as N GiB (as tests/unit/test_memory.py does). Writes $PARAPLAN_BENCH_OUT/galvatron_memory.json
(default bench-out/) and prints a Markdown table. Run: .venv/bin/python benchmarks/galvatron_memory.py
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from paraplan.costs.memory import GIB, MemoryConfig, plan_memory
from paraplan.hardware import load_cluster
from paraplan.models import measure, zoo
from paraplan.plans.plan import LayerRange, LayerStrategy, Plan, Stage

MODELS = ("bert-huge-32", "bert-huge-48", "vit-huge-32", "vit-huge-48", "t5-large-32", "t5-large-48",
          "swin-huge-32", "swin-huge-48")
BUDGETS_GIB = (8, 12, 16, 20)
STEP = 8
MAX_BATCH = 2048
N_DEVICES = 8
PP_MICRO = 8
CLUSTER = "galvatron-8xtitan"

# Table II, max batch per (strategy, budget), columns in MODELS' order; 0 = OOM.
PAPER = {
    "dp": {8: (0, 0, 0, 0, 0, 0, 0, 0), 12: (0, 0, 16, 0, 0, 0, 0, 0),
           16: (8, 0, 64, 0, 8, 0, 40, 0), 20: (16, 0, 112, 32, 16, 8, 80, 24)},
    "tp": {8: (0, 0, 24, 16, 0, 0, 24, 8), 12: (8, 0, 48, 32, 8, 0, 40, 24),
           16: (16, 8, 72, 40, 8, 0, 56, 40), 20: (16, 8, 88, 56, 16, 8, 72, 48)},
    "pp": {8: (0, 0, 56, 32, 0, 0, 40, 24), 12: (8, 8, 104, 64, 8, 8, 72, 48),
           16: (16, 8, 144, 96, 8, 8, 104, 64), 20: (24, 16, 192, 128, 16, 16, 128, 88)},
    "sdp": {8: (8, 0, 64, 40, 8, 0, 48, 32), 12: (16, 8, 112, 72, 16, 8, 88, 64),
            16: (24, 16, 160, 104, 24, 16, 136, 88), 20: (40, 24, 216, 136, 32, 16, 176, 120)},
}
ROWS = ("dp", "sdp", "tp", "pp")
# This benchmark run on the memory model before the PyTorch-runtime terms (0.5 GiB reserve, states and
# activations only): recorded once, for comparison.
BEFORE = {"within_one_step": 79, "cells": 128, "per_row": {"dp": 27, "sdp": 17, "tp": 6, "pp": 29}}
LABELS = {"dp": "PyTorch DDP (DP)", "sdp": "FSDP/ZeRO-3 (SDP)", "tp": "Megatron (TP)", "pp": "PyTorch GPipe (PP)"}


def pure_plan(spec, strategy: str, batch: int) -> Plan:
    n = spec.n_layers
    common = dict(model=spec.name, cluster=CLUSTER, n_layers=n, global_batch=batch)
    if strategy == "pp":
        cuts = [round(i * n / N_DEVICES) for i in range(N_DEVICES + 1)]
        stages = tuple(Stage(LayerRange(cuts[s], cuts[s + 1]), (s,)) for s in range(N_DEVICES))
        return Plan(**common, n_micro=min(PP_MICRO, batch), schedule="gpipe", grad_sync="none", stages=stages)
    layer = {"dp": LayerStrategy(dp=N_DEVICES), "sdp": LayerStrategy(sdp=N_DEVICES),
             "tp": LayerStrategy(tp=N_DEVICES)}[strategy]
    sync = "bucketed" if strategy == "dp" else "none"
    stage = Stage(LayerRange(0, n), tuple(range(N_DEVICES)), strategies=(layer,) * n)
    return Plan(**common, n_micro=1, schedule="gpipe", grad_sync=sync, stages=(stage,))


def fits(spec, strategy: str, batch: int, budget_gib: int, config: MemoryConfig, kind: str) -> bool:
    capacities = {d: budget_gib * GIB for d in range(N_DEVICES)}
    memory, _ = plan_memory(pure_plan(spec, strategy, batch), spec, capacities, config, device_kind=kind)
    return all(m.fits for m in memory)


def max_batch(spec, strategy: str, budget_gib: int, config: MemoryConfig, kind: str) -> int:
    """Largest multiple of STEP that fits (peaks grow with the batch, so stop at the first miss)."""
    best = 0
    for batch in range(STEP, MAX_BATCH + 1, STEP):
        if not fits(spec, strategy, batch, budget_gib, config, kind):
            break
        best = batch
    return best


def run(config: MemoryConfig | None = None) -> dict:
    config = config or MemoryConfig()
    cluster = load_cluster(CLUSTER)
    kind = cluster.device(0).name
    specs = {name: measure.measure(zoo.build(name)) for name in MODELS}
    cells = []
    for strategy in ROWS:
        for budget in BUDGETS_GIB:
            for j, name in enumerate(MODELS):
                ours = max_batch(specs[name], strategy, budget, config, kind)
                paper = PAPER[strategy][budget][j]
                cells.append({"strategy": strategy, "budget_gib": budget, "model": name, "ours": ours,
                              "paper": paper, "within_one_step": abs(ours - paper) <= STEP})
    per_row = {}
    for strategy in ROWS:
        row = [c for c in cells if c["strategy"] == strategy]
        per_row[strategy] = {"within": sum(c["within_one_step"] for c in row), "cells": len(row)}
    within = sum(c["within_one_step"] for c in cells)
    return {"cluster": CLUSTER, "device_kind": kind, "step": STEP, "pp_micro_batches": PP_MICRO,
            "within_one_step": within, "cells": len(cells), "fraction": within / len(cells), "per_row": per_row,
            "before": BEFORE, "rows": cells}


def _show(batch: int) -> str:
    return str(batch) if batch else "OOM"


def markdown(result: dict) -> str:
    lines = ["| budget | strategy | " + " | ".join(MODELS) + " |", "|---|---|" + "---|" * len(MODELS)]
    for budget in BUDGETS_GIB:
        for strategy in ROWS:
            row = [c for c in result["rows"] if c["strategy"] == strategy and c["budget_gib"] == budget]
            cells = [f"{_show(c['ours'])} / {_show(c['paper'])}" + ("" if c["within_one_step"] else " **x**")
                     for c in row]
            lines.append(f"| {budget} GiB | {LABELS[strategy]} | " + " | ".join(cells) + " |")
    summary = ", ".join(f"{s.upper()} {v['within']}/{v['cells']}" for s, v in result["per_row"].items())
    lines.append("")
    before = ", ".join(f"{s.upper()} {v}/{len(BUDGETS_GIB) * len(MODELS)}" for s, v in BEFORE["per_row"].items())
    lines.append(f"ours / paper; **x** = more than one step ({STEP}) apart. Within one step: "
                 f"{result['within_one_step']}/{result['cells']} ({100 * result['fraction']:.0f}%): {summary} "
                 f"(before the runtime terms: {BEFORE['within_one_step']}/{BEFORE['cells']}: {before}).")
    return "\n".join(lines)


def main() -> None:
    from _paraplan_cli import bench_parser

    bench_parser(__doc__).parse_args()
    t0 = time.perf_counter()
    result = run()
    result["seconds"] = time.perf_counter() - t0
    root = Path(os.environ.get("PARAPLAN_BENCH_OUT", "bench-out"))
    root.mkdir(parents=True, exist_ok=True)
    (root / "galvatron_memory.json").write_text(json.dumps(result, indent=2))
    print(markdown(result))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
