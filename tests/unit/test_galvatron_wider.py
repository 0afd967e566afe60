"""Beyond Galvatron's paper (§III-B: power-of-two device counts and pipeline degrees): on a cluster
whose device count is not a power of two, the pipeline degrees whose power-of-two stage groups use
more of it (planners/galvatron/space.py: `wider_pp_degrees`); none on a power-of-two cluster, where
the search is the paper's."""

from __future__ import annotations

import os

import pytest

from paraplan.planners.galvatron import grid, planner, space
from paraplan.planners.galvatron.space import micro_counts, pp_degrees, stage_group, wider_pp_degrees
from paraplan.planners.registry import make_plan
from paraplan.workload import workload

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.mark.parametrize("n,degrees", [(7, (3, 7)), (12, (3,)), (6, (3,)), (5, (5,)), (1000, (3, 7, 15, 31, 125)),
                                       (8, ()), (1024, ())])
def test_wider_degrees_use_more_devices_than_any_smaller_degree(n, degrees):
    assert wider_pp_degrees(n, 200) == degrees
    most = 2 ** (n.bit_length() - 1)  # the paper's degrees use the largest power of two
    for p in degrees:
        used = p * stage_group(n, p)
        assert most < used <= n
        most = used
    # by brute force: no other degree uses more than the best smaller one
    best = 2 ** (n.bit_length() - 1)
    for p in range(3, min(n, 200) + 1):
        used = p * stage_group(n, p)
        if used > best and p & (p - 1):
            assert p in degrees
        best = max(best, used)


def test_a_wider_degree_takes_the_batch_s_next_divisors_as_micro_batch_counts():
    class Request:
        n_micro = None

    assert micro_counts(Request(), 56, 3) == (4, 7, 14)  # for 3, 6, 12: none divides 56
    assert micro_counts(Request(), 56, 4) == (4, 8)  # a paper degree: P, 2P, 4P that divide it, as before


def test_bipartition_s_seven_vms_get_three_stages_of_two(monkeypatch):
    w = workload("alexnet", "bipartition-7vm", batch=56)
    wider = make_plan(w.request, "galvatron")
    assert wider.n_stages == 3 and len(set(wider.devices)) == 6
    assert "uses 6 of 7 devices" in wider.search.note
    # the paper's space: power-of-two degrees on 4 of the 7 VMs
    monkeypatch.setattr(space, "wider_pp_degrees", lambda n, layers: ())
    paper = make_plan(w.request, "galvatron")
    assert len(set(paper.devices)) <= 4
    assert wider.prediction.iteration_s < 0.75 * paper.prediction.iteration_s  # 3.16 s against 4.55 s


def test_power_of_two_clusters_search_the_paper_s_degrees_only():
    w = workload("gpt2-tiny", "galvatron-8xtitan", batch=32, seq_len=128)
    paper = pp_degrees(8, w.request.n_layers)  # 1, 2, 4, ... up to the layers
    assert grid.stage_counts(w.request)[0] == paper
    assert planner._pp_choices(w.request, next(v for v in planner.VARIANTS if v.name == "galvatron-bmw"))[0] == paper
