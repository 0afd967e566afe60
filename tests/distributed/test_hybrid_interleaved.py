"""Per-layer strategies (Galvatron-BMW's plans) under interleaved 1F1B and looped BFS: several
hybrid stages per pipeline rank (runtime/layers/hybrid_rank.py), each built with its layers' DP / SDP /
TP (+SP) / ZeRO, on 4 gloo ranks (2 pipeline ranks x 2 devices, 2 chunks each), against one
process running the same recipe (runtime/measure/reference.py): within 1e-5."""

import itertools
import os
from dataclasses import replace

import pytest

from paraplan.plans.plan import LayerRange, LayerStrategy, Plan, Stage
from paraplan.plans.schedules import stage_ranks

from .many import train_sgd
from .test_schedules_runtime import FOUR, _max_difference

os.environ.setdefault("HF_HUB_OFFLINE", "1")

DP2, TP2, SDP2 = LayerStrategy(dp=2), LayerStrategy(tp=2), LayerStrategy(sdp=2)
MIXED = (DP2, TP2, SDP2, replace(DP2, zero=1), LayerStrategy(tp=2, sequence_parallel=True), DP2)  # gpt2-tiny's 6 layers


def _plan(kind: str, strategies, n_micro=4, precision="fp32") -> Plan:
    ranks = stage_ranks(kind, 2, 2)
    stages = tuple(Stage(LayerRange(a, b), (2 * ranks[i], 2 * ranks[i] + 1), strategies=tuple(strategies[a:b]))
                   for i, (a, b) in enumerate(itertools.pairwise(FOUR)))
    return Plan(model="gpt2-tiny", cluster="local", n_layers=6, global_batch=8, n_micro=n_micro, schedule=kind,
                grad_sync="after-backward", precision=precision, stages=stages, virtual_stages=2)


PLANS = {
    "interleaved-1f1b-dp2": _plan("interleaved-1f1b", (DP2,) * 6),
    "interleaved-1f1b-mixed": _plan("interleaved-1f1b", MIXED),
    "looped-bfs-mixed": _plan("looped-bfs", MIXED),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return train_sgd(tmp_path_factory.mktemp("hybrid_interleaved"), PLANS, 4)


@pytest.mark.parametrize("name", list(PLANS))
def test_per_layer_strategies_under_interleaved_schedules_agree_with_one_process(runs, name):
    assert _max_difference(runs[name]) < 1e-5
