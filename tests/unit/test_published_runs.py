"""Predictions against published GPU runs (benchmarks/published_runs.py): every row of Narayanan
et al. 2021 Table 1 (Megatron-LM on up to 3,072 A100s) and Korthikanti et al. 2022 Table 5 (full
vs selective recomputation with sequence parallelism), built as Plans and simulated on the
`dgx-a100-80gb` preset, whose efficiency terms were fitted to microbenchmarks before this
comparison first ran (benchmarks/efficiency_fit.py) and never to these rows.

Measured when written (2026-11-26): median |time error| 8.9% over 18 rows, worst 23% (the 1.7B
row, predicted faster); full / selective ratios within 6% of the published ones. Since issue 48 the
rows are priced as Megatron-LM runs them (the `megatron` engine profile, kernel by kernel, the
figures committed before the comparison): 6.5% and 11.2% (2026-11-28)."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "published_runs.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("published_runs", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["published_runs"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tables(bench):
    return bench.narayanan_rows(), bench.korthikanti_rows()


def test_the_tables_are_the_papers(bench):
    """Rows as published: parameter counts from the shapes (12 l h^2 + V h, the papers' count)
    match the labels, and aggregate throughput = per-GPU x GPUs (Table 1's last column)."""
    for cfg, _ in bench.NARAYANAN_TABLE_1:
        params = 12 * cfg.layers * cfg.hidden ** 2 * (1 + 13 / (12 * cfg.hidden)) + (bench.VOCAB + bench.SEQ) * cfg.hidden
        assert params / 1e9 == pytest.approx(float(cfg.label.rstrip("B")), rel=0.03)
        assert cfg.gpus == cfg.tp * cfg.pp * cfg.dp
    assert [c.dp for c, _ in bench.NARAYANAN_TABLE_1] == [32] * 6 + [24, 15, 9, 6]


def test_median_time_error_within_15_percent(tables):
    table1, table5 = tables
    errors = sorted([abs(r["time_ratio"] - 1) for r in table1]
                    + [abs(r[k] - 1) for r in table5 for k in ("full_time_ratio", "selective_time_ratio")])
    assert len(errors) == 18
    assert errors[len(errors) // 2 - 1] <= 0.15 and errors[len(errors) // 2] <= 0.15
    # issue 48's goal: median at most 12%, none above 25%
    assert errors[len(errors) // 2] <= 0.12 and errors[-1] <= 0.25


def test_full_over_selective_recomputation_within_10_percent(tables):
    """Korthikanti et al. Table 5: 22B 1.42 / 1.10 = 1.29, 175B 18.13 / 13.75 = 1.32 (and the 530B
    and 1T rows)."""
    _, table5 = tables
    for r in table5:
        assert r["predicted_full_over_selective"] == pytest.approx(r["published_full_over_selective"], rel=0.10), r
