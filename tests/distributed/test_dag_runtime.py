"""FD-DPS operator placements ('dag' plans) on real gloo processes (runtime/dag/dag_runtime.py), against
one process of the same model, data and seed: after 3 steps, losses and every parameter within 1e-5
relative (against max(|reference|, 1e-3), as tests/distributed/test_hybrid.py). SGD, dropout off.
Plans come from the real planner (fddps, runnable=true) on `local` (2 devices) and on the first 3
P100s of fddps-8xp100, plus a hand-made placement that spreads the forward over the devices (the
planner's own plans keep most operators on one device); at least one split runs its parts on
different devices. The 2-rank and the 3-rank runs each take one launch (tests/distributed/many.py)."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from paraplan.models.op_split import PART, split_degrees
from paraplan.planners.registry import make_plan
from paraplan.planners.request import PlanRequest
from paraplan.plans.plan import OperatorPlacement
from paraplan.runtime.config import TrainConfig
from paraplan.runtime.dag.dag_runtime import dag_refusal
from paraplan.runtime.dag.program import build_program
from paraplan.runtime.measure.reference import reference_run

from .many import train_many


def _costs(model, cluster):
    from paraplan.costs.model import analytic_cost_model
    from paraplan.hardware.presets import load_cluster
    from paraplan.models import measure, source
    from paraplan.models.op_trace import build_op_graph

    built = source.build(model, device="meta")
    return analytic_cost_model(measure.measure(built), load_cluster(cluster), operators=build_op_graph(built))


def _planned(model, cluster, batch, stages=None):
    request = PlanRequest(costs=_costs(model, cluster), model_name=model, cluster_name=cluster, batch=batch,
                          n_stages=stages)
    return make_plan(request, "fddps")


def _spread(plan, world):
    """The plan's operators dealt out: forward ops in trace order in `world` even runs, split parts k
    on device k % world, every backward with its forward (what runnable=true asks), gathers and
    views' backward on device 0; each device runs its ops in trace order."""
    program = build_program(plan.model, plan.global_batch)
    index = {n: i for i, n in enumerate(program.names)}
    ops = [op for p in plan.operators for op in p.ops]

    def base(op):
        head, sep, tail = op.rpartition(PART)
        return (head, int(tail)) if sep and tail.isdigit() else (op.removesuffix("/gather"), -1)

    order = sorted(ops, key=lambda op: (index[base(op)[0]], op.endswith("/gather"), op))
    forward = [op for op in order if op.startswith("fwd:")]
    device = {}
    for j, op in enumerate(forward):
        name, part = base(op)
        device[op] = part % world if part >= 0 else j * world // len(forward)
    for op in order:
        if op not in device:
            name, part = base(op)
            f = program.forward_of[index[name]]
            fwd = program.names[f] + (f"{PART}{part}" if part >= 0 else "") if f >= 0 else None
            device[op] = device.get(fwd, 0) if not op.endswith("/gather") else 0
    per = [tuple(op for op in order if device[op] == d) for d in range(world)]
    return replace(plan, operators=tuple(OperatorPlacement(d, per[d]) for d in range(world)))


def _split_across(plan):
    where = {op: p.device for p in plan.operators for op in p.ops}
    return any(len({where[f"{b}{PART}{k}"] for k in range(d)} | {where[f"{b}/gather"]}) > 1
               for b, d in split_degrees(where).items())


def _config(plan, out_dir):
    return TrainConfig(plan=plan, model=plan.model, out_dir=str(out_dir), dropout=False, steps=3, optimizer="sgd",
                       lr=0.1)


def _launch(root, plans, world):
    configs = {}
    for name, plan in plans.items():
        config = _config(plan, root / name)
        assert dag_refusal(config) is None, name
        configs[name] = config
    train_many(list(configs.values()), world)
    return configs


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    root = tmp_path_factory.mktemp("dag2")
    plans = {m: _planned(m, "local", 8) for m in ("lenet-5", "vgg-tiny", "gpt2-tiny")}
    plans["vgg-tiny-spread"] = _spread(plans["vgg-tiny"], 2)
    plans["gpt2-tiny-spread"] = _spread(plans["gpt2-tiny"], 2)
    return _launch(root, plans, 2)


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory):
    root = tmp_path_factory.mktemp("dag3")
    plans = {m: _planned(m, "fddps-8xp100", 12, stages=3) for m in ("lenet-5", "vgg-tiny")}
    plans["lenet-5-spread"] = _spread(plans["lenet-5"], 3)
    return _launch(root, plans, 3)


def _check(config, world):
    # one thread, as every rank: CPU convolutions and norms sum in a thread-dependent order
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ref_losses, ref_params = reference_run(config)
    finally:
        torch.set_num_threads(threads)
    out_path = Path(config.out_dir)
    losses = json.loads((out_path / "losses.json").read_text())
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    got = {}
    for r in range(world):
        part = torch.load(out_path / f"stage{r}.pt")
        assert not set(part) & set(got), "a parameter written by two ranks"
        got.update(part)
    assert set(got) == set(ref_params)
    for name, ref in ref_params.items():
        scale = ref.abs().clamp_min(1e-3)
        assert float(((got[name] - ref).abs() / scale).max()) < 1e-5, name
    for r in range(world):
        assert len(json.loads((out_path / f"steps_rank{r}.json").read_text())) == 3


@pytest.mark.parametrize("name", ["lenet-5", "vgg-tiny", "gpt2-tiny", "vgg-tiny-spread", "gpt2-tiny-spread"])
def test_two_ranks_equal_one_process(two_ranks, name):
    config = two_ranks[name]
    assert len(config.plan.operators) == 2
    _check(config, 2)


@pytest.mark.parametrize("name", ["lenet-5", "vgg-tiny", "lenet-5-spread"])
def test_three_ranks_equal_one_process(three_ranks, name):
    config = three_ranks[name]
    assert len(config.plan.operators) == 3
    _check(config, 3)


def test_splits_really_cross_devices(two_ranks, three_ranks):
    """The planner's own plans split operators, some planner plan runs a split's parts on different
    devices, and so do the spread placements."""
    assert all(split_degrees(op for p in c.plan.operators for op in p.ops) for c in two_ranks.values())
    planned = [c.plan for c in (*two_ranks.values(), *three_ranks.values()) if "spread" not in c.out_dir]
    assert any(_split_across(plan) for plan in planned)
    assert _split_across(two_ranks["vgg-tiny-spread"].plan) and _split_across(two_ranks["gpt2-tiny-spread"].plan)
    assert _split_across(three_ranks["lenet-5-spread"].plan)
