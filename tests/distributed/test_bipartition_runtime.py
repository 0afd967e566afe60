"""Bi-Partition plans (separate forward and backward ranges per worker) on real gloo processes,
against one process of the same model, data and seed: after 3 steps, losses and every parameter
within 1e-5 relative. The plans cover every role a worker can have (plans/worker_roles.py): a
layer's forward and backward on different workers recomputed below the worker's own graph (its
input sent by the forward owner), on top of it (from its own output), with no graph at all (an
empty forward range), from the model's input, and workers with an empty backward range; plus
the planner's own split plan (LeNet-5 on the paper's testbed, 3 workers) through the command line.
SGD, as test_hybrid.py; Adam where memory is compared."""

import json
import os
from pathlib import Path

import pytest
import torch
from paraplan_process import run_paraplan

from paraplan.plans.plan import LayerRange, Plan, Stage
from paraplan.plans.plan_file import read_plan
from paraplan.plans.worker_roles import worker_roles
from paraplan.runtime.config import TrainConfig
from paraplan.runtime.measure.reference import reference_run

from .many import train_many

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "GLOO_SOCKET_IFNAME": "lo"}


def _plan(model, ranges, n_layers, batch=8, micro=4, schedule="1f1b"):
    return Plan(model=model, cluster="local", n_layers=n_layers, global_batch=batch, n_micro=micro,
                schedule=schedule, grad_sync="none",
                stages=tuple(Stage(LayerRange(*f), (k,), backward_layers=LayerRange(*b))
                             for k, (f, b) in enumerate(ranges)))


TWO = {
    # layer 2: forward on worker 0, backward on worker 1, rebuilt from x_2 sent by worker 0
    "lenet-below": _plan("lenet-5", [((0, 3), (0, 2)), ((3, 5), (2, 5))], 5),
    # worker 0 runs no backward; worker 1 rebuilds layers 0..1 from the model's input
    "lenet-input": _plan("lenet-5", [((0, 2), (0, 0)), ((2, 5), (0, 5))], 5),
    # VGG: layer 8 split below worker 1's graph; GPipe as well as 1F1B
    "vgg-below": _plan("vgg-tiny", [((0, 9), (0, 8)), ((9, 16), (8, 16))], 16),
    "vgg-gpipe": _plan("vgg-tiny", [((0, 6), (0, 8)), ((6, 16), (8, 16))], 16, schedule="gpipe"),
}
THREE = {
    # worker 0 rebuilds layer 2 on top of its own graph (its own output), worker 1 runs only 2..3 forward
    "lenet-above": _plan("lenet-5", [((0, 2), (0, 3)), ((2, 4), (3, 4)), ((4, 5), (4, 5))], 5),
    # worker 1: empty forward range, the backward of 1..2 from x_1 (sent by worker 0)
    "lenet-nograph": _plan("lenet-5", [((0, 3), (0, 1)), ((3, 3), (1, 3)), ((3, 5), (3, 5))], 5),
    # worker 1: empty backward range (relays gradients); worker 2 rebuilds layer 3 from x_3 (worker 1's)
    "lenet-relay": _plan("lenet-5", [((0, 1), (0, 3)), ((1, 4), (3, 3)), ((4, 5), (3, 5))], 5),
    "vgg-three": _plan("vgg-tiny", [((0, 5), (0, 6)), ((5, 11), (6, 10)), ((11, 16), (10, 16))], 16),
}


def _config(plan, out_dir, **kw):
    kw = {"steps": 3, "optimizer": "sgd", "lr": 0.1, **kw}
    return TrainConfig(plan=plan, model=plan.model, out_dir=str(out_dir), dropout=False, **kw)


def _launch(root, plans, world):
    configs = {}
    for name, plan in plans.items():
        (root / name).mkdir()
        configs[name] = _config(plan, root / name)
    train_many(list(configs.values()), world)
    return configs


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    return _launch(tmp_path_factory.mktemp("two"), TWO, 2)


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory):
    return _launch(tmp_path_factory.mktemp("three"), THREE, 3)


def check_against_one_process(config, out=None):
    out = Path(out or config.out_dir)
    losses = json.loads((out / "losses.json").read_text())
    ref_losses, ref_params = reference_run(config)
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    seen = set()
    for s in range(config.plan.n_stages):
        for name, value in torch.load(out / f"stage{s}.pt").items():
            ref = ref_params[name]
            assert float((value - ref).norm() / ref.norm().clamp_min(1e-3)) < 1e-5, name
            assert name not in seen, name  # each parameter is updated by exactly one worker
            seen.add(name)
    assert seen == set(ref_params)
    assert losses[-1] != losses[0]


@pytest.mark.parametrize("name", sorted(TWO))
def test_two_workers_equal_one_process(two_ranks, name):
    assert any(r.recomputed for r in worker_roles(TWO[name]))  # some layer's forward and backward split
    check_against_one_process(two_ranks[name])


@pytest.mark.parametrize("name", sorted(THREE))
def test_three_workers_equal_one_process(three_ranks, name):
    assert any(r.recomputed for r in worker_roles(THREE[name]))
    check_against_one_process(three_ranks[name])


def test_the_planners_split_plan_trains_from_the_command_line(tmp_path):
    """`paraplan plan --planner bipartition` (LeNet-5, the paper's 7 VMs, exactly 3 workers: the
    runtime-mode plan splits a layer) then `paraplan train --plan plan.json --steps 3`, which also
    prints each rank's memory measured beside the prediction."""
    plan_path, out = tmp_path / "plan.json", tmp_path / "run"
    run_paraplan("plan", "--planner", "bipartition", "--model", "lenet-5", "--cluster", "bipartition-7vm",
                 "--batch", "16", "--stages", "3", "--exact-stages", "--out", str(plan_path),
                 check=True, env=ENV, timeout=300)
    plan = read_plan(plan_path)
    assert plan.split_layers == "recompute" and any(r.recomputed for r in worker_roles(plan))
    res = run_paraplan("train", "--plan", str(plan_path), "--steps", "3", "--no-dropout", "--optimizer",
                       "sgd", "--lr", "0.1", "--out-dir", str(out), env=ENV, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "rank 2 (stage 2): states" in res.stdout
    check_against_one_process(_config(plan, out), out)


def test_a_plan_costed_with_the_papers_scheme_is_refused_before_launch(tmp_path):
    from dataclasses import replace

    from paraplan.plans.plan_file import write_plan

    plan_path = tmp_path / "plan.json"
    write_plan(replace(TWO["lenet-below"], split_layers="send-activations"), plan_path)
    res = run_paraplan("train", "--plan", str(plan_path), "--steps", "1",
                          "--out-dir", str(tmp_path / "run"), env=ENV, timeout=120)
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "paper's idealised cost" in res.stderr
    assert not (tmp_path / "run").exists()
