"""Issue 52 item 5: Sailor's measured runs on its mixed "MIT" cluster (eth-easl/sailor at cf2c8e3,
sailor/Planner/simulations/validation/mit/) predicted by benchmarks/published_mixed_runs.py, each
row's layout as its file gives it. Nothing is fitted to them."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import published_mixed_runs as bench  # noqa: E402

from paraplan.hardware import load_cluster  # noqa: E402


def test_the_rows_are_sailors_files():
    """N2_D1 L5-16, N2_D2 L5-15, N3_D1 L5-23: layers per stage, the GPU kind and TP of each, the
    data-parallel width, micro-batch 2, the global batch and the measured `real`."""
    kinds = []
    for run in bench.RUNS:
        plan = bench.run_plan(run)
        cluster = load_cluster(run.cluster)
        kinds.append([sorted({cluster.device(d).name for d in s.devices}) for s in plan.stages])
        assert plan.global_batch // plan.n_micro // plan.stages[0].strategies[0].dp == run.micro == 2
    a, b, c = bench.RUNS
    assert [len(s.layers) for s in bench.run_plan(a).stages] == [12, 14] and a.measured_s == 119.83914
    assert kinds[0] == [["rtx-3090"], ["titan-rtx-24gb"]]
    assert {st.tp for s in bench.run_plan(a).stages for st in s.strategies} == {2} and a.global_batch == 256
    plan_b = bench.run_plan(b)
    assert [len(s.layers) for s in plan_b.stages] == [26] and b.measured_s == 91.78 and b.global_batch == 256
    assert kinds[1] == [["rtx-3090", "titan-rtx-24gb"]]
    assert {(st.dp, st.tp) for st in plan_b.stages[0].strategies} == {(2, 2)}
    assert [len(s.layers) for s in bench.run_plan(c).stages] == [8, 9, 9] and c.measured_s == 59.45533
    assert kinds[2] == [["rtx-3090"], ["rtx-2080-11gb"], ["titan-rtx-24gb"]] and c.global_batch == 144
    assert {st.tp for s in bench.run_plan(c).stages for st in s.strategies} == {8}


@pytest.fixture(scope="module")
def table():
    return {r["run"]: r for r in bench.rows()}


def test_median_time_error_within_15_percent(table):
    # measured 2026-11-28: +13.2%, -7.3%, -50.9% (docs/published-runs.md, mixed clusters)
    assert statistics.median(abs(r["time_ratio"] - 1) for r in table.values()) <= 0.15


def test_the_two_node_runs_within_15_percent(table):
    for run in bench.RUNS[:2]:
        assert abs(table[run.label]["time_ratio"] - 1) <= 0.15, run.label


@pytest.mark.xfail(strict=True, reason="the 3-stage run is predicted at half its measured time; its file repeats "
                                       "N6_D2's time, gradient-reduction and memory figures exactly (one is likely "
                                       "a copy), and TP8 over 8 PCIe GPUs may be slower than Sailor's send / receive "
                                       "bandwidths say: docs/published-runs.md")
def test_the_three_stage_run_within_15_percent(table):
    assert abs(table[bench.RUNS[2].label]["time_ratio"] - 1) <= 0.15
