"""The papers' presets against the papers' measured tables (benchmarks/paper_fidelity.py, issue 31
item 3): the split into fit and held-out cells is the rule committed before the first fit, and the
held-out cells, predicted from the presets as committed, keep the per-paper median |error| the
benchmark reported (results/paper_fidelity.json): at most 20% where that was reached, else the
number stated with its cause in docs/paper-fidelity.md, so that a regression fails."""

import importlib
import statistics
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"

# held-out median |error| per paper, from the presets as committed (docs/paper-fidelity.md): the
# target 20% where reached (Galvatron-BMW: 13.8%), else the measured number, its cause stated there
HELD_OUT_MEDIAN = {"galvatron-bmw": 0.20, "gropipe": 0.226, "fd-dps": 0.304, "csimd": 0.437}


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module("paper_fidelity"), importlib.import_module("paper_fidelity_model")
    finally:
        sys.path.remove(str(BENCH))


def test_the_split_is_the_committed_rule(bench):
    pf, _ = bench
    cells = pf.cells()
    fit, held = pf.split(cells)
    assert not set(fit) & set(held) and len(fit) + len(held) == len(cells) == len(set(cells))
    for paper in pf.PAPERS:
        assert any(c.paper == paper for c in fit) and any(c.paper == paper for c in held), paper
    # alternate cells in table order within each table; CSIMD by column
    position: dict = {}
    for c in cells:
        if c.paper == pf.CSIMD:
            assert (c in fit) == (c.detail[1] in ("Self CNNs", "Llama Series")), c
            continue
        i = position[(c.paper, c.table)] = position.get((c.paper, c.table), -1) + 1
        assert (c in fit) == (i % 2 == 0), c
    counts = {p: (sum(c.paper == p for c in fit), sum(c.paper == p for c in held)) for p in pf.PAPERS}
    assert counts == {"galvatron-bmw": (83, 81), "gropipe": (113, 112), "fd-dps": (4, 4), "csimd": (15, 15)}


def test_every_device_type_has_fit_cells(bench):
    pf, model = bench
    fit, _ = pf.split(pf.cells())
    for family in model.FAMILIES:
        assert any(c.cluster in family.presets for c in fit), family.name
        assert len(family.fitted) <= 3


def test_held_out_median_error_per_paper(bench):
    """Every held-out cell recomputed from the committed presets (memory unbounded: the cells check
    time); the median |predicted / measured - 1| per paper within its stated bound."""
    pf, model = bench
    _, held = pf.split(pf.cells())
    predictor = model.Predictor()
    for paper, bound in HELD_OUT_MEDIAN.items():
        errors = [abs(predictor.predict(c) / c.measured - 1) for c in held if c.paper == paper]
        assert statistics.median(errors) <= bound + 0.005, (paper, statistics.median(errors))
